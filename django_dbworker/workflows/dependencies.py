"""The enqueue side of dependencies: ``task.using(after=[...], run_on_failure=...)``.

A dependent is stored in one transaction with its edges (``TaskDependency``):

1. the dependency rows are locked (``SELECT ... FOR UPDATE`` in id order; SQLite's single
   writer holds the whole file) and marked ``has_dependents``: a dependency that ends from
   now on looks for its dependents (``tasks.dependents``), and one that ended before
   shows its final status here;
2. each edge is ``waiting`` (the dependency has not ended), ``met`` (it ended SUCCESSFUL,
   or ended at all with ``run_on_failure``) or ``broken`` (it ended FAILED or CANCELLED);
3. the dependent is stored WAITING with ``waiting_for`` = its waiting edges, READY when
   none waits, or CANCELLED at once (a ``DependencyFailed`` error naming the dependency)
   when one is broken; then its edges are written.

A dependency must exist before its dependent names it, so no cycle can be built: the
edges only ever point from a new task to older ones (and a task cannot name itself: its
id is made when it is stored).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.utils import timezone

from .. import conf
from ..db import refuse_unusable
from ..exceptions import InvalidDependency
from ..models import (
    TASK_FINISHED,
    DependencyCondition,
    DependencyState,
    Execution,
    State,
    TaskDependency,
    TaskRecord,
    TaskStatus,
)
from ..tasks import dependents
from ..tasks.dependents import broken_message, chunks
from ..tasks.edges import Edge, edges_of

if TYPE_CHECKING:
    from ..tasks.enqueue import Backend
    from ..tasks.results import DBWorkerTaskResult
    from ..tasks.task import DBWorkerTask


@dataclass(slots=True)
class Plan:
    """What the dependencies' states make of a new dependent."""

    #: The edge's state by position.
    states: dict[int, str] = field(default_factory=dict)
    #: The first broken edge: (edge, what it waited for, the status it ended with).
    broken: tuple[Edge, str, str] | None = None

    @property
    def waiting_for(self) -> int:
        return sum(1 for s in self.states.values() if s == DependencyState.WAITING)


# ----- declaration ----------------------------------------------------------------------


# ----- enqueue --------------------------------------------------------------------------


def on_commit_error(where: str) -> InvalidDependency:
    return InvalidDependency(
        f"{where}: after=[...] cannot be enqueued on commit: a dependent is stored in the "
        "transaction that checks its dependencies (which may not be stored before the "
        "commit either). Use .using(enqueue_on_commit=False) inside your transaction (the "
        "dependent commits with it), or enqueue the whole workflow in "
        "transaction.on_commit(...).")


def enqueue(backend: Backend, task: DBWorkerTask,
            calls: list[tuple[Sequence[Any], dict[str, Any]]]) -> list[DBWorkerTaskResult]:
    """``enqueue_many`` of a task with dependencies: every call waits for all of
    ``task.after``; results in call order (a call whose idempotency or uniqueness key is
    held gets the holder, which keeps its own dependencies)."""
    where = f"Task {task.name!r}"
    on_commit = task.enqueue_on_commit
    if on_commit is True or (on_commit is None and backend.enqueue_on_commit):
        raise on_commit_error(f"{where} (backend {backend.alias!r})")
    edges = edges_of(where, task.after)
    if not calls:
        return []
    using = conf.get().DATABASE
    refuse_unusable(using)
    with transaction.atomic(using=using):
        plan = _plan(where, edges, task.run_on_failure, using)
        key = task.idempotency_key
        held = key is not None and TaskRecord.objects.using(using).filter(
            idempotency_key=key).exists()
        started = timezone.now()
        inner = replace(task, after=(), enqueue_on_commit=False,
                        _waiting_for=max(plan.waiting_for, 1 if plan.broken else 0))
        results = backend.store_many(inner, calls)  # run (immediate mode) by the caller
        new = [] if held else _new(results, started, using)
        if new:
            _write_edges(new, edges, plan, task.run_on_failure, using)
            if plan.broken is not None:
                dependents.cancel_dependents(using, new, _broken_message(*plan.broken))
                results = [backend.result(TaskRecord.objects.using(using).get(pk=r.id), task)
                           if uuid.UUID(r.id) in new else r for r in results]
    return results


def _plan(where: str, edges: list[Edge], run_on_failure: bool, using: str) -> Plan:
    """Lock the dependencies, check they exist, and say what each edge starts as."""
    plan = Plan()
    ids = sorted({e.dependency_id for e in edges if e.dependency_id is not None})
    tasks = TaskRecord.objects.using(using)
    found: dict[uuid.UUID, tuple[str, str, bool]] = {}
    if ids:
        found = {pk: (status, path, has) for pk, status, path, has in tasks.filter(pk__in=ids)
                 .select_for_update().order_by("pk")
                 .values_list("pk", "status", "task_path", "has_dependents")}
        missing = [str(pk) for pk in ids if pk not in found]
        if missing:
            raise InvalidDependency(
                f"{where}: after names task {missing[0]}, which is not in database "
                f"{using!r}: it was never enqueued there (another database, or enqueued "
                "on commit and not committed yet), or it finished and was pruned by "
                "retention. Nothing was enqueued.")
        unmarked = [pk for pk, (status, _, has) in found.items()
                    if not has and status not in TASK_FINISHED]
        if unmarked:
            tasks.filter(pk__in=unmarked).update(has_dependents=True)
    for e in edges:
        if e.dependency_id is not None:
            status, path, _ = found[e.dependency_id]
            what = f"{path} {e.dependency_id}"
        else:
            status, what = _row_status(e, using), e.name()
        state = _initial(status, run_on_failure)
        plan.states[e.position] = state
        if state == DependencyState.BROKEN and plan.broken is None:
            plan.broken = (e, what, status)
    return plan


def _row_status(e: Edge, using: str) -> str:
    """The execution's state mapped onto a task's: FINISHED is SUCCESSFUL, FAILED is
    FAILED, anything else (none yet, pending, working, unfinished) has not ended. Locked,
    so that a completion of the row waits for this transaction."""
    state: str | None = (Execution.objects.using(using).select_for_update()
             .filter(worker=e.row_worker, source_id=e.row_source_id)
             .values_list("state", flat=True).first())
    ended: dict[str, str] = {State.FINISHED: TaskStatus.SUCCESSFUL,
                             State.FAILED: TaskStatus.FAILED}
    return ended.get(state or "", TaskStatus.WAITING)


def _initial(status: str, run_on_failure: bool) -> str:
    if status not in TASK_FINISHED:
        return DependencyState.WAITING
    if status == TaskStatus.SUCCESSFUL or run_on_failure:
        return DependencyState.MET
    return DependencyState.BROKEN


def _new(results: list[Any], started: Any, using: str) -> list[uuid.UUID]:
    """Which results are rows this call stored (a held idempotency or uniqueness key
    returns an older task, which keeps its own dependencies)."""
    ids = [uuid.UUID(r.id) for r in results if r.enqueued_at >= started]
    if not ids:
        return []

    taken = {pk for part in chunks(ids) for pk in TaskDependency.objects.using(using)
             .filter(dependent_id__in=part).values_list("dependent_id", flat=True)}
    return [pk for pk in dict.fromkeys(ids) if pk not in taken]


def _write_edges(dependents: list[uuid.UUID], edges: list[Edge], plan: Plan,
                 run_on_failure: bool, using: str) -> None:
    now = timezone.now()
    condition = DependencyCondition.ENDED if run_on_failure else DependencyCondition.SUCCEEDED
    TaskDependency.objects.using(using).bulk_create([
        TaskDependency(
            dependent_id=d, position=e.position, dependency_id=e.dependency_id,
            row_worker=e.row_worker, row_source_id=e.row_source_id, condition=condition,
            state=plan.states[e.position],
            resolved_at=None if plan.states[e.position] == DependencyState.WAITING else now)
        for d in dependents for e in edges
    ], batch_size=500)


def _broken_message(edge: Edge, what: str, status: str) -> str:
    return broken_message(what, status)
