"""The commands that change rows: retry, reset, cancel, purge, prune.

Each first builds a ``Plan`` (what would change, read without changing anything), which the
command shows and asks about, then applies it through the guarded functions of
``rows.store`` and ``tasks.store``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from django.db.models import Q
from django.utils import timezone

from .. import conf
from ..conf import MAX_RETENTION
from ..db import space
from ..models import Execution, Supervisor, TaskRecord, TaskStatus
from ..rows import store
from ..rows.registry import workers
from ..tasks import store as taskstore
from . import OperationError, units
from .reports import check_names

#: Rows a purge or a prune changes per transaction.
BATCH = taskstore.PURGE_BATCH


@dataclass(slots=True)
class Plan:
    command: str
    #: One sentence: what applying it does.
    summary: str
    #: One mapping per unit looked at: kind, id, status, will_change.
    items: list[dict[str, Any]] = field(default_factory=list)
    #: How many rows it would change (or delete).
    count: int = 0
    apply: Callable[[], int] = lambda: 0
    destructive: bool = False
    #: Told the running total after each batch of a long change (purge, prune).
    progress: Callable[[int], None] | None = None

    def report(self, done: int) -> None:
        if self.progress is not None:
            self.progress(done)

    def as_dict(self, changed: int | None) -> dict[str, Any]:
        return {"command": self.command, "summary": self.summary, "would_change": self.count,
                "applied": changed is not None, "changed": changed or 0, "items": self.items}


def _item(kind: str, pk: Any, status: str, will: bool, **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "id": pk, "status": status, "will_change": will, **extra}


def _execution_item(e: Execution, will: bool, **extra: Any) -> dict[str, Any]:
    """An execution's item: ``execution_status`` as everywhere, and ``status`` (the stored
    state) under its schema-version-1 name (``units.EXECUTION_ALIASES``)."""
    return _item("execution", e.pk, e.state, will, execution_status=e.status,
                 worker=e.worker, **extra)


def retry(ids: list[str]) -> Plan:
    """FAILED executions back to UNFINISHED; FAILED or CANCELLED tasks back to READY."""
    executions, tasks = units.find(ids)
    e_ids = [e.pk for e in executions if e.state in store.TRANSITIONS["reset_failed"]]
    t_ids = [t.pk for t in tasks if t.status in taskstore.TRANSITIONS["retry"]]
    items = [_execution_item(e, e.pk in e_ids) for e in executions]
    items += [_item("task", str(t.pk), t.status, t.pk in t_ids, task=t.task_path)
              for t in tasks]
    return Plan(
        "retry",
        f"Retry {len(e_ids)} failed execution(s) and {len(t_ids)} failed or cancelled "
        "task(s): they run again.",
        items, len(e_ids) + len(t_ids),
        lambda: store.reset_failed_ids(e_ids) + taskstore.retry(t_ids),
    )


def reset(worker_name: str, pks: list[str], *, finished: bool) -> Plan:
    """Executions of ``worker_name`` on these rows back to UNFINISHED: FAILED ones, and
    FINISHED ones too with ``finished``."""
    if worker_name not in workers:
        known = ", ".join(sorted(workers)) or "none"
        raise OperationError(f"Unknown worker {worker_name!r} (registered workers: {known}).")
    found = units.find_rows(workers[worker_name], pks)
    allowed = store.TRANSITIONS["reprocess" if finished else "reset_failed"]
    ids = [e.pk for e in found if e.state in allowed]
    what = "finished or failed" if finished else "failed"
    items = [_execution_item(e, e.pk in ids, source_id=e.source_id) for e in found]
    apply = store.reprocess_ids if finished else store.reset_failed_ids
    return Plan("reset", f"Reset {len(ids)} {what} execution(s) of {worker_name!r}: they "
                "run again.", items, len(ids), lambda: apply(ids))


def cancel(ids: list[str]) -> Plan:
    executions, tasks = units.find(ids)
    if executions:
        raise OperationError(
            f"Only tasks can be cancelled; {', '.join(str(e.pk) for e in executions)} "
            "is/are execution ids (use 'dbworker reset' or the admin for executions).")
    waiting = taskstore.TRANSITIONS["cancel_waiting"]
    ids_ = [t.pk for t in tasks if t.status in waiting or (
        t.status == TaskStatus.RUNNING and t.cancel_requested_at is None)]
    items = [_item("task", str(t.pk), t.status, t.pk in ids_, task=t.task_path)
             for t in tasks]
    return Plan("cancel", f"Cancel {len(ids_)} task(s): waiting ones at once, running ones "
                "when their supervisor stops them.", items, len(ids_),
                lambda: sum(bool(taskstore.cancel(pk)) for pk in ids_))


def purge(queue_names: list[str] | None) -> Plan:
    check_names(None, queue_names)
    qs = TaskRecord.objects.using(conf.get().DATABASE).filter(
        status__in=taskstore.TRANSITIONS["purge"])
    if queue_names:
        qs = qs.filter(queue_name__in=queue_names)
    count = qs.count()
    where = f"queue(s) {', '.join(queue_names)}" if queue_names else "every queue"
    plan = Plan("purge", f"Delete {count} waiting task(s) (READY, WAITING or RETRYING) of "
                f"{where}; they will not run (tasks waiting for them are cancelled).", [],
                count, destructive=True)
    # In batches of taskstore.PURGE_BATCH, a transaction each.
    plan.apply = lambda: taskstore.purge(queue_names or None, batch=BATCH,
                                         progress=plan.report)
    return plan


def prune(older_than: float | None) -> Plan:
    """Finished tasks and supervisors' rows older than ``older_than`` seconds (default:
    ``DBWORKER["RETENTION"]``)."""
    if older_than is None:
        retention = conf.get().RETENTION
        if retention is None:
            raise OperationError("DBWORKER['RETENTION'] is None (keep everything); give "
                                 "--older-than SECONDS to prune anyway.")
        older_than = retention.total_seconds() if isinstance(retention, timedelta) \
            else float(retention)
    if not (isinstance(older_than, int | float) and 0 < older_than <= MAX_RETENTION):
        raise OperationError(  # NaN and infinities too: timedelta() would raise
            f"--older-than {older_than!r}: give a number of seconds greater than 0 and at "
            f"most {MAX_RETENTION:.0f} (100 years).")
    using = conf.get().DATABASE
    cutoff = timezone.now() - timedelta(seconds=older_than)
    tasks = TaskRecord.objects.using(using).finished().filter(finished_at__lt=cutoff).count()
    gone = Supervisor.objects.using(using).filter(last_heartbeat__lt=cutoff).filter(
        Q(stopped_at__isnull=False) | Q(heartbeat_expires_at__lt=cutoff))
    supervisors = gone.count()

    def batch_done(deleted: int) -> None:
        # SQLite, incremental auto-vacuum: each batch's pages given back after it, so no
        # statement frees a million rows' pages while holding the only write lock.
        space.after_prune(using)
        plan.report(deleted)

    def apply() -> int:
        deleted = taskstore.prune(timedelta(seconds=older_than), BATCH,
                                 progress=batch_done)
        return deleted + gone.delete()[0]

    when = cutoff.strftime("%Y-%m-%d %H:%M:%S %Z")
    plan = Plan("prune", f"Delete {tasks} task(s) that finished before {when} and "
                f"{supervisors} old supervisor row(s).", [],
                tasks + supervisors, apply, destructive=True)
    return plan


