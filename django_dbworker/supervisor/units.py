"""The two kinds of unit a supervisor runs, behind one interface.

A unit is a row-as-queue execution (``store.Claim``) or an enqueued task
(``taskstore.TaskClaim``); the supervisor and its children use these functions and never
ask which kind they hold.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

from django.db import DatabaseError, OperationalError

from ..logs import log_event, logger
from ..rows import store
from ..rows.store import Claim, Claimant, FailureInfo
from ..tasks import store as taskstore
from ..tasks.completions import Kept
from ..tasks.store import TaskClaim

type Unit = Claim | TaskClaim


def run(c: Unit, keep: Callable[[Kept], None] | None = None) -> Any:
    """Run a unit and record its outcome; returns the ``Result``, or None for a task whose
    success went to ``keep`` to be recorded later (``completions``)."""
    if logger.isEnabledFor(logging.DEBUG):
        log_event(logging.DEBUG, "started", **describe(c), pid=os.getpid())
    if isinstance(c, TaskClaim):
        from ..tasks.runner import run_task

        return run_task(c, keep)
    from ..rows.runner import run as run_execution

    return run_execution(c)


def fail(c: Unit, info: FailureInfo) -> int:
    """Record ``c`` FAILED for good with ``info`` (its child's last word on it)."""
    if isinstance(c, TaskClaim):
        return taskstore.fail_attempt(c, info, retry_at=None, live=True)
    failed = store.fail(c, info)
    if failed:  # as the runner's own failure record does; else the next sweep finds them
        from .. import conf
        from ..registry import workers
        from ..rows import pending

        try:
            pending.add_siblings(workers[c.worker], c.source_key, conf.get().DATABASE)
        except Exception as exc:
            log_event(logging.WARNING, "siblings_not_marked", **describe(c),
                      error=f"{type(exc).__name__}: {store.safe_message(exc)}"[:300])
    return failed


def transient(exc: BaseException) -> bool:
    """A database error no unit's value causes: SQLite's write lock still held after its
    busy timeout, a deadlock or serialization failure (PostgreSQL's class 40)."""
    if not isinstance(exc, OperationalError):
        return False
    text = store.safe_message(exc)
    cause = exc.__cause__
    state = getattr(cause, "sqlstate", None) or ""
    return "database is locked" in text or "database table is locked" in text \
        or state.startswith("40")


def fallback(c: Unit, exc: BaseException) -> FailureInfo:
    """The failure record of a unit that raised ``exc`` outside its handler: running it
    or recording its outcome (``recording`` notes what was being recorded), with the
    real cause and without the offending text."""
    what = getattr(exc, "dbworker_recording", None)
    kind = "task" if isinstance(c, TaskClaim) else "execution"
    if isinstance(exc, DatabaseError):
        doing = f"recording {what}" if what else "recording its outcome"
        message = (f"the database refused {doing} with {type(exc).__name__}: "
                   f"{store.safe_message(exc)}; the {kind} is marked FAILED without the "
                   "value it refused (make the value storable: e.g. strip NUL characters) "
                   "instead of being retried as a database error")
    else:
        message = (f"{type(exc).__name__} raised outside the handler, while running or "
                   f"recording this {kind}: {store.safe_message(exc)}")
    return FailureInfo(store.class_path(exc), message[:10_000], store.format_traceback(exc))


def release(c: Unit, *, crashed: FailureInfo | None, max_crashes: int) -> int:
    module = taskstore if isinstance(c, TaskClaim) else store
    return module.release(c, crashed=crashed, max_crashes=max_crashes)


def unclaim(claims: list[Unit]) -> int:
    """Give back units claimed ahead that never ran (one statement per kind)."""
    executions = [c for c in claims if isinstance(c, Claim)]
    tasks = [c for c in claims if isinstance(c, TaskClaim)]
    return store.unclaim(executions) + taskstore.unclaim(tasks)


def renew(claimant: Claimant, claims: list[Unit], lease: float) -> int:
    executions = [c.execution_id for c in claims if isinstance(c, Claim)]
    tasks = [c.task_id for c in claims if isinstance(c, TaskClaim)]
    return store.renew(claimant, executions, lease) + taskstore.renew(claimant, tasks, lease)


def reap(max_crashes: int, *, tasks: bool) -> int:
    reaped = store.reap(max_crashes)
    return reaped + taskstore.reap(max_crashes) if tasks else reaped


def describe(c: Unit) -> dict[str, Any]:
    """Key/value context of a unit for log lines."""
    if isinstance(c, TaskClaim):
        return {"task": c.task_path, "id": c.task_id, "attempt": c.attempt}
    return {"worker": c.worker, "execution": c.execution_id, "source": c.source_key,
            "attempt": c.attempt}


def group(c: Unit) -> str:
    """What per-worker concurrency counts a unit against."""
    return "task:" + c.task_path if isinstance(c, TaskClaim) else c.worker
