"""Uniqueness by state and period: ``@task(unique_key=..., unique_while=..., unique_for=...,
on_duplicate=...)``; docs/tasks.md, "Flow control".

A key is held by one task, named by its ``TaskUniqueness`` row (one per task path, key and,
with ``unique_for``, period). A keyed enqueue, in one transaction:

1. upserts the key's row (``INSERT ... ON CONFLICT DO UPDATE`` / ``ON DUPLICATE KEY
   UPDATE``): a new row names the call's own task; an existing one is locked, so the
   enqueues of one key take turns, on every database (SQLite: one writer at a time);
2. reads the holder: the call's own task (store it), or an earlier one that still holds
   the key (return it; ``on_duplicate="replace"`` first gives it the call's arguments if it
   still waits), or one that no longer does (store the call's task, point the row at it).

The task row and the key's row commit together. The upsert takes the row's exclusive lock
at once (not a shared lock then an exclusive one, as ``INSERT IGNORE`` then ``SELECT ... FOR
UPDATE`` would on InnoDB: two enqueues holding the shared lock deadlock on the upgrade).
Only keyed calls come here; the plain enqueue path does not change.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import IntegrityError, OperationalError, connections, transaction

from .. import conf
from ..db import engine, notify
from ..djtasks import InvalidTask
from ..models import TaskRecord, TaskStatus, TaskUniqueness
from ..units.slots import ensure as ensure_slots
from . import newtasks
from . import registry as task_registry
from .options import check_unique_key, concurrency_keys, on_commit_error, period_seconds

if TYPE_CHECKING:
    from .enqueue import Backend
    from .results import DBWorkerTaskResult
    from .task import DBWorkerTask

#: ``unique_while`` values and the statuses in which a holder keeps its key.
HOLDING: dict[str, tuple[str, ...]] = {
    "active": (TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RETRYING, TaskStatus.RUNNING),
    "waiting": (TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RETRYING),
}
#: The statuses in which ``on_duplicate="replace"`` changes the holder.
REPLACEABLE = (TaskStatus.READY, TaskStatus.RETRYING)
#: Times a keyed enqueue runs again after a deadlock or a lock wait timeout (MariaDB,
#: MySQL; PostgreSQL's class 40), when it is its own transaction.
TRIES = 5
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# ----- declaration ----------------------------------------------------------------------


def period_start(at: datetime, seconds: float) -> datetime:
    """The start of the period ``at`` is in: periods of ``seconds`` aligned on the Unix
    epoch (``unique_for=3600``: each clock hour in UTC), to the microsecond."""
    length = round(seconds * 1_000_000)
    since = (at - EPOCH) // timedelta(microseconds=1)
    return EPOCH + timedelta(microseconds=since // length * length)


def digest(task_path: str, key: str, start: datetime | None) -> str:
    text = "\x00".join((task_path, key, "" if start is None else start.isoformat()))
    return hashlib.sha256(text.encode()).hexdigest()


# ----- enqueue --------------------------------------------------------------------------


def keys_of(task: DBWorkerTask, calls: Sequence[tuple[Sequence[Any], dict[str, Any]]]
            ) -> list[str]:
    """Each call's key: the task's string, or what its function returns for the call."""
    where = f"Task {task.name!r}"
    key = task.unique_key
    if key is None:
        given = [f"{name}={getattr(task, name)!r}"
                 for name, default in (("unique_for", None), ("unique_while", "active"),
                                       ("on_duplicate", "keep"))
                 if getattr(task, name) != default]
        raise InvalidTask(
            f"{where}: {', '.join(given)} is set but the call has no unique_key; give one: "
            "@task(unique_key=...) or .using(unique_key=...).")
    if not callable(key):
        return [key] * len(calls)
    out = []
    for i, (args, kwargs) in enumerate(calls):
        try:
            value = key(*args, **kwargs)
        except Exception as exc:
            exc.add_note(f"(computing unique_key of call {i} of task {task.name!r} with "
                         f"{getattr(key, '__qualname__', key)!r})")
            raise
        out.append(check_unique_key(where, value,
                             source=f" (returned by {getattr(key, '__qualname__', key)} "
                                    f"for call {i})"))
    return out


def enqueue(backend: Backend, task: DBWorkerTask,
            calls: list[tuple[Sequence[Any], dict[str, Any]]]) -> list[DBWorkerTaskResult]:
    """``enqueue_many`` of a task with a unique key; results in order, each naming the task
    that holds its call's key (a call whose key is held by the same batch's earlier call
    gets that call's task)."""
    on_commit = task.enqueue_on_commit
    if on_commit is True or (on_commit is None and backend.enqueue_on_commit):
        raise on_commit_error(f"Task {task.name!r} (backend {backend.alias!r})")
    if not calls:
        return []
    shared = newtasks.Shared.of(task)
    rows = newtasks.rows_of(task, shared, newtasks.ids(shared, len(calls)), calls, 0)
    newtasks.encoded(task, rows, 0)  # refuses what is not JSON, too large, or holds NUL
    keys = keys_of(task, calls)
    start = None
    if task.unique_for is not None:
        start = period_start(shared.enqueued_at, period_seconds("", task.unique_for))
    # A task with a concurrency limit too: each row carries its concurrency key and limit
    # (tasks.concurrency), and the keys' slots are made with the rows.
    slots: list[str | None] = [None] * len(rows)
    if task.concurrency_limit is not None:
        slots = list(concurrency_keys(task, [(r.args, r.kwargs) for r in rows]))
    by_key = {(k, c): replace(shared, unique_key=k, concurrency_key=c,
                              concurrency_limit=task.concurrency_limit if c else None)
              for k, c in dict.fromkeys(zip(keys, slots, strict=True))}
    rows = [newtasks.NewTask(r.id, r.args, r.kwargs, by_key[(k, c)]) for r, k, c in zip(
        rows, keys, slots, strict=True)]
    holding = (HOLDING["active"] if start is not None else HOLDING[task.unique_while])
    plan = Plan(rows, [digest(shared.task_path, k, start) for k in keys], start, holding,
                task.on_duplicate == "replace", shared.idempotency_key,
                sorted({c for c in slots if c is not None}))
    stored = _retried(plan.store)
    results = [backend.result(row, task) for row, _ in stored]
    newtasks.send_enqueued(type(backend), [r for r, (_, new) in zip(results, stored, strict=True)
                                  if new])
    return results


def _retried(store: Callable[[], list[tuple[Any, bool]]]) -> list[tuple[Any, bool]]:
    """``store()``, again after a deadlock, a serialization failure or a lock wait timeout
    (the server rolled the transaction back), when it is its own transaction."""
    using = conf.get().DATABASE
    outer = connections[using].in_atomic_block
    for attempt in range(1, TRIES + 1):
        try:
            return store()
        except OperationalError as exc:
            if attempt == TRIES or outer or not _transient(exc, using):
                raise
            time.sleep(0.01 * attempt)
    raise AssertionError("unreachable")


def _transient(exc: OperationalError, using: str) -> bool:
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    return (state.startswith("40") or "database is locked" in str(exc)
            or engine(using).transient(exc))


class Plan:
    """The rows of one keyed enqueue call and how their keys are held."""

    def __init__(self, rows: list[newtasks.NewTask], digests: list[str],
                 start: datetime | None, holding: tuple[str, ...], replace: bool,
                 idempotency_key: str | None, slots: Sequence[str] = ()) -> None:
        self.rows = rows
        #: Concurrency keys of the rows, whose slots are made with them.
        self.slots = slots
        self.digests = digests
        self.start = start
        self.holding = holding
        self.replace = replace
        self.idempotency_key = idempotency_key

    def store(self) -> list[tuple[newtasks.NewTask | TaskRecord, bool]]:
        """In one transaction: (the task holding each call's key, whether it is new)."""
        using = conf.get().DATABASE
        tasks = TaskRecord.objects.using(using)
        key = self.idempotency_key
        try:
            with transaction.atomic(using=using):
                if key is not None:  # one call (the backend refuses more)
                    found = tasks.filter(idempotency_key=key).first()
                    if found is not None:
                        return [(found, False)]
                self._lock(using)
                if self.slots:
                    ensure_slots(self.slots, using)
                out = [self._one(row, d, using) for row, d in zip(
                    self.rows, self.digests, strict=True)]
                if any(new for _, new in out):
                    notify.announce(using, notify.TASKS)
                return out
        except IntegrityError:
            # Only a task id derived from an idempotency key can be stored twice: another
            # enqueue of the same key committed it first; it is the answer, as there.
            if key is None:
                raise
            return [(tasks.get(idempotency_key=key), False)]

    def _lock(self, using: str) -> None:
        """Insert each key's row naming the first call of the key, or lock it where it
        exists; in digest order, so that two calls of several keys cannot deadlock."""
        first: dict[str, newtasks.NewTask] = {}
        for row, d in zip(self.rows, self.digests, strict=True):
            first.setdefault(d, row)
        connection = connections[using]
        target = (["digest"] if connection.features.supports_update_conflicts_with_target
                  else None)
        shared = self.rows[0].shared
        TaskUniqueness.objects.using(using).bulk_create(
            [TaskUniqueness(digest=d, task_id=first[d].id, task_path=shared.task_path,
                            unique_key=first[d].shared.unique_key, period_start=self.start,
                            updated_at=shared.enqueued_at)
             for d in sorted(first)],
            update_conflicts=True, unique_fields=target, update_fields=["updated_at"])

    def _one(self, row: newtasks.NewTask, d: str,
             using: str) -> tuple[newtasks.NewTask | TaskRecord, bool]:
        keys = TaskUniqueness.objects.using(using).filter(digest=d)
        holder_id = keys.select_for_update().values_list("task_id", flat=True).get()
        if str(holder_id) == row.id:  # the row was new: this call's task holds the key
            newtasks.insert([row], using)
            return row, True
        holder = TaskRecord.objects.using(using).filter(pk=holder_id)
        if self.replace:
            holder.filter(status__in=REPLACEABLE).update(
                args=row.args, kwargs=row.kwargs, run_after=row.run_after,
                available_at=row.available_at)
        found = holder.first()
        if found is not None and (self.start is not None or found.status in self.holding):
            return found, False
        newtasks.insert([row], using)  # the holder finished, left, or runs ("waiting")
        keys.update(task_id=row.id, unique_key=row.shared.unique_key,
                    updated_at=row.shared.enqueued_at)
        return row, True


# ----- retention ------------------------------------------------------------------------


def forget_holders(task_ids: Sequence[Any]) -> int:
    """Delete the key rows held by these tasks, which retention is about to delete; how many
    went. Each row is found by its primary key (the digest, made again from the task's
    path, key and, for a key by period, the period its ``enqueued_at`` is in by the task's
    ``unique_for``): the cost is that of the tasks pruned, not of all keys. A row an enqueue
    has pointed at a newer task is kept (the delete names the task too)."""
    using = conf.get().DATABASE
    rows = TaskRecord.objects.using(using).filter(pk__in=list(task_ids)).exclude(
        unique_key="").values_list("pk", "task_path", "unique_key", "enqueued_at")
    known = task_registry.known()
    digests, holders = set(), []
    for pk, path, key, enqueued_at in rows:
        holders.append(pk)
        digests.add(digest(path, key, None))
        period = getattr(known.get(path), "unique_for", None)
        if period is not None:
            seconds = period.total_seconds() if isinstance(period, timedelta) else period
            digests.add(digest(path, key, period_start(enqueued_at, seconds)))
    if not holders:
        return 0
    return TaskUniqueness.objects.using(using).filter(
        digest__in=sorted(digests), task_id__in=holders).delete()[0]
