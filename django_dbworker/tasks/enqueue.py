"""The enqueue pipeline: the calls of one ``enqueue()`` / ``enqueue_many()`` checked,
built into rows (``newtasks``), stored in one transaction (``store``; keyed, unique and
dependent calls by their own paths) and announced (``task_enqueued``), results in call
order. ``DBWorkerBackend`` (Django's adapter) validates the task and calls ``store_many``;
the immediate mode's run comes after, in the backend."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol, cast

from django.db import transaction

from .. import conf
from ..db import refuse_unusable
from ..djtasks import InvalidTask, Task
from ..units import slots
from ..workflows import dependencies
from . import newtasks, uniqueness
from . import store as taskstore
from .newtasks import encoded, rows_of, send_enqueued
from .options import concurrency_keys
from .results import new_results, to_result
from .task import DBWorkerTask, unique_wanted

if TYPE_CHECKING:
    from .results import DBWorkerTaskResult


class Backend(Protocol):
    """What the pipeline asks of the backend that enqueues (``DBWorkerBackend``)."""

    #: Its alias in ``TASKS``: the results' ``backend``.
    alias: str
    #: ``OPTIONS["ENQUEUE_ON_COMMIT"]``: store at the commit of the caller's transaction.
    enqueue_on_commit: bool

    def validate_task(self, task: Task) -> None: ...

    def result(self, row: Any, task: Task | None = None) -> DBWorkerTaskResult:
        """The result of a stored row."""
        ...

    def store_many(self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
                   ) -> list[DBWorkerTaskResult]:
        """``store_many(self, task, calls)``: how a dependent's inner calls are stored."""
        ...


def store_many(
    backend: Backend, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
) -> list[DBWorkerTaskResult]:
    """Store one call per ``(args, kwargs)`` in one transaction (``backend.enqueue_many``
    without the immediate mode's run); results in call order. A bad call raises, naming
    it, and stores nothing."""
    backend.validate_task(task)
    calls = list(calls)
    if getattr(task, "after", ()):  # workflows: only dependents take this path
        return dependencies.enqueue(backend, cast(DBWorkerTask, task), calls)
    key = getattr(task, "idempotency_key", None)
    if key is not None and len(calls) != 1:
        raise InvalidTask(
            f"Task {task.name!r}: idempotency_key={key!r} was given for {len(calls)} "
            "calls; a key identifies one call."
        )
    if unique_wanted(task):  # flow control: only keyed calls take this path
        return uniqueness.enqueue(backend, cast(DBWorkerTask, task), calls)
    if not calls:
        return []
    shared = newtasks.Shared.of(task)
    ids = newtasks.ids(shared, len(calls))
    using = conf.get().DATABASE
    refuse_unusable(using)
    on_commit = getattr(task, "enqueue_on_commit", None)
    if on_commit is None:
        on_commit = backend.enqueue_on_commit
    if getattr(task, "concurrency_limit", None) is not None:
        return _enqueue_keyed(backend, cast(DBWorkerTask, task), shared, ids, calls, key,
                              on_commit)
    if key is None and not on_commit and len(calls) <= newtasks.BATCH:
        rows = rows_of(task, shared, ids, calls, 0)
        taskstore.insert_one_batch(rows, encoded(task, rows, 0))  # one round trip
        made = new_results(rows, backend.alias, task)
        send_enqueued(type(backend), made)
        return made
    if key is None and not on_commit:
        # Batch by batch: on PostgreSQL the server stores a batch while the next is
        # built (taskstore.insert_batches), and its results are made meanwhile.
        results: list[DBWorkerTaskResult] = []

        def batches() -> Iterator[tuple[list[newtasks.NewTask], str]]:
            for start in range(0, len(calls), newtasks.BATCH):
                end = start + newtasks.BATCH
                rows = rows_of(task, shared, ids[start:end], calls[start:end], start)
                yield rows, encoded(task, rows, start)
                results.extend(new_results(rows, backend.alias, task))

        taskstore.insert_batches(batches())
        send_enqueued(type(backend), results)
        return results
    rows = rows_of(task, shared, ids, calls, 0)
    payload = encoded(task, rows, 0)
    if on_commit:
        def insert() -> None:
            stored = taskstore.insert(rows, idempotency_key=key, payload=payload)
            if key is None or _inserted(stored[0], rows[0]):
                send_enqueued(type(backend),
                              [_result(backend, row, task) for row in stored])

        transaction.on_commit(insert, using=using)
        return new_results(rows, backend.alias, task)
    stored = taskstore.insert(rows, idempotency_key=key, payload=payload)
    results = [_result(backend, row, task) for row in stored]  # the row holding the key:
    if _inserted(stored[0], rows[0]):                          # ours, or an earlier one's
        send_enqueued(type(backend), results)
    return results


def _enqueue_keyed(backend: Backend, task: DBWorkerTask, shared: Any, ids: list[str],
                   calls: list[Any], key: str | None,
                   on_commit: bool) -> list[DBWorkerTaskResult]:
    """``enqueue_many`` of a task with a concurrency limit: each row with its
    concurrency key, stored in call order (a statement per batch: the key is a per-row
    value of the insert), the keys' slots made first (``tasks.concurrency``)."""
    rows = rows_of(task, shared, ids, calls, 0)
    encoded(task, rows, 0)  # refuses, naming the call, what is not JSON or too large
    keys = concurrency_keys(task, [(r.args, r.kwargs) for r in rows])
    limit = task.concurrency_limit
    groups: dict[str, list[newtasks.NewTask]] = {}
    for row, k in zip(rows, keys, strict=True):
        if k not in groups:
            groups[k] = []
            group_shared = replace(shared, concurrency_key=k, concurrency_limit=limit)
        else:
            group_shared = groups[k][0].shared
        row.shared = group_shared
        groups[k].append(row)
    using = conf.get().DATABASE

    def store() -> list[Any]:
        slots.ensure(groups, using)
        if key is not None:
            return taskstore.insert(rows, idempotency_key=key)
        taskstore.insert_batches(
            (rows[start:start + newtasks.BATCH], None)
            for start in range(0, len(rows), newtasks.BATCH))
        return list(rows)

    if on_commit:
        def insert() -> None:
            stored = store()
            if key is None or _inserted(stored[0], rows[0]):
                send_enqueued(type(backend),
                              [_result(backend, row, task) for row in stored])

        transaction.on_commit(insert, using=using)
        return new_results(rows, backend.alias, task)
    stored = store()
    if key is None:
        results = new_results(rows, backend.alias, task)
        send_enqueued(type(backend), results)
        return results
    results = [_result(backend, row, task) for row in stored]  # the row holding the key
    if _inserted(stored[0], rows[0]):
        send_enqueued(type(backend), results)
    return results


def _result(backend: Backend, row: Any, task: Task) -> DBWorkerTaskResult:
    """The result of a stored row (a ``TaskRecord``, or the ``NewTask`` stored as it is)."""
    return to_result(row, backend.alias, task)


def _inserted(stored: Any, new: Any) -> bool:
    """Whether the row holding an idempotency key is the one this call enqueued. Its id
    cannot tell (it is made from the key); the time of the enqueue call it came from can."""
    return str(stored.pk) == new.pk and stored.enqueued_at == new.enqueued_at
