"""Tasks that wait for rows: ``after_row(worker, row)`` names a row worker's execution of
one source row as a dependency of a task (``task.using(after=[after_row(...)])``).

The edge (``TaskDependency`` with ``row_worker``/``row_source_id``) is met when the
execution ends FINISHED and broken when it ends FAILED (met with ``run_on_failure``). An
execution that has already ended when the task is enqueued decides the edge at once
(``workflows.dependencies``). Otherwise the edge is resolved by ``release_ended_rows``,
which every supervisor runs every ``POLL_INTERVAL`` (``supervisor.duties.row_dependencies``)
rather than the row completion path: a row's completion costs nothing more, whether a task
waits for it or not, and every way an execution ends (its handler, a crash limit, a reaper,
a person, another program) is seen the same way. The price is latency: a waiting task is
released up to one ``POLL_INTERVAL`` after its row ended (docs/workflows.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError
from django.db import models, transaction
from django.db.models import OuterRef, QuerySet, Subquery
from django.utils import timezone

from .. import conf
from ..db import keys, notify
from ..models import (
    DependencyCondition,
    DependencyState,
    Execution,
    State,
    TaskDependency,
    TaskStatus,
)
from ..rows.registry import Worker, workers
from ..tasks.dependents import broken_message, cancel_with, lower_waiting, resolve

#: Waiting row edges resolved per transaction (the next batch at the next run).
BATCH = 500
#: The execution states that end a row edge, and the task status each counts as.
ENDED = {State.FINISHED: TaskStatus.SUCCESSFUL, State.FAILED: TaskStatus.FAILED}


@dataclass(frozen=True, slots=True)
class RowDependency:
    """A row worker's execution of one source row, as an item of ``after=[...]``.

    ``worker`` is the worker's name; ``source_id`` the row's key as ``Execution.source_id``
    holds it; ``pk`` the primary key as given."""

    worker: str
    source_id: str
    pk: Any

    def __str__(self) -> str:
        return f"row {self.worker}[{self.source_id}]"


def after_row(worker: str | Worker, row: models.Model | Any) -> RowDependency:
    """The execution of ``worker`` on ``row`` (a model instance of the worker's source, or
    its primary key), to put in ``after=[...]``: the task runs once that execution ended
    FINISHED; FAILED cancels it (unless ``run_on_failure=True``).

    ``UnknownWorker`` for a worker that is not registered; ``ValueError`` for a row of
    another model, an unsaved instance, a key the source's primary key cannot hold, or a
    primary key no row has (looked up: one query; an instance read from the database is
    taken as it is)."""
    w = worker if isinstance(worker, Worker) else workers[worker]
    source = w.source
    where = f"after_row({w.name!r}, {row!r})"
    if isinstance(row, models.Model):
        if not isinstance(row, source):
            raise ValueError(
                f"{where}: the row is a {type(row).__name__}, but worker {w.name!r} works "
                f"on {source.__name__} rows; give a {source.__name__} or its primary key.")
        pk = row.pk
        if pk is None or row._state.adding:
            raise ValueError(f"{where}: the {source.__name__} is not saved yet (no primary "
                             "key); save it first, in the same transaction if you like.")
    else:
        pk = row
    using = conf.get().DATABASE
    try:
        key = keys.to_key(source, pk, using)
        exists = isinstance(row, models.Model) or source._base_manager.filter(pk=pk).exists()
    except (ValidationError, ValueError, TypeError) as exc:
        raise ValueError(f"{where}: {pk!r} is not a primary key of {source.__name__} "
                         f"({exc}).") from None
    if not exists:
        raise ValueError(
            f"{where}: there is no {source.__name__} with primary key {pk!r}; a task can "
            "only wait for a row that exists (its execution would never end).")
    return RowDependency(w.name, key, pk)


def ended_rows(using: str, limit: int = BATCH) -> QuerySet[TaskDependency, Any]:
    """The waiting row edges whose execution has ended: ``(edge id, dependent id,
    condition, worker, source key, execution state)``. Read through the index
    ``dbworker_dependency_waiting`` (``state = 'waiting' AND row_worker > ''``: only the
    edges on rows that still wait), then the execution's unique (worker, source_id) key:
    the cost follows the waiting row edges, never the history or the tasks."""
    state = (Execution.objects.using(using)
             .filter(worker=OuterRef("row_worker"), source_id=OuterRef("row_source_id"))
             .values("state")[:1])
    return (
        TaskDependency.objects.using(using)
        .filter(state=DependencyState.WAITING, row_worker__gt="")
        .annotate(row_state=Subquery(state))
        .filter(row_state__in=list(ENDED))
        .values_list("pk", "dependent_id", "condition", "row_worker", "row_source_id",
                     "row_state")[:limit])


def release_ended_rows(using: str | None = None, limit: int = BATCH) -> int:
    """Resolve the waiting edges on rows whose execution ended, each once, and release or
    cancel their dependents (``tasks.dependents``); how many edges were resolved."""
    using = using or conf.get().DATABASE
    found = list(ended_rows(using, limit))
    if not found:
        return 0
    with transaction.atomic(using=using):
        return _resolve(using, found)


def _resolve(using: str, found: list[tuple[Any, ...]]) -> int:

    now = timezone.now()
    edges = TaskDependency.objects.using(using)
    # Locked, and only those still waiting: another supervisor may have resolved some
    # since they were read (it committed first; a locking read sees what it wrote).
    still = set(edges.filter(pk__in=[row[0] for row in found], state=DependencyState.WAITING)
                .select_for_update().order_by("pk").values_list("pk", flat=True))
    met: dict[Any, int] = {}
    broken: dict[Any, str] = {}
    met_ids, broken_ids = [], []
    for pk, dependent, condition, worker, key, state in found:
        if pk not in still:
            continue
        status = ENDED[state]
        if status == TaskStatus.SUCCESSFUL or condition == DependencyCondition.ENDED:
            met_ids.append(pk)
            met[dependent] = met.get(dependent, 0) + 1
        else:
            broken_ids.append(pk)
            broken.setdefault(dependent, broken_message(f"row {worker}[{key}]", str(status)))
    for ids, to in ((met_ids, DependencyState.MET), (broken_ids, DependencyState.BROKEN)):
        if ids:
            edges.filter(pk__in=ids, state=DependencyState.WAITING).update(
                state=to, resolved_at=now)
    released = lower_waiting(using, met, now)
    cascade = cancel_with(using, broken, now) if broken else {}
    if cascade:
        resolve(using, [(pk, TaskStatus.CANCELLED) for pk in cascade])  # their dependents
    if released:
        notify.announce(using, notify.TASKS)
    return len(met_ids) + len(broken_ids)
