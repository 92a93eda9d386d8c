"""The release side of dependencies, part of the task state machine: what a task's end
does to the tasks waiting for it (the edges are written by ``workflows.dependencies``).

``resolve`` runs in the transaction that writes a final status (SUCCESSFUL, FAILED,
CANCELLED) of tasks with ``has_dependents``; a retry (RETRYING) never calls it. For each
ended task:

1. its waiting edges are resolved, each once: locked and changed only while still
   ``waiting`` (a conditional UPDATE), so a dependency that ends again (retried by a
   person) never counts twice. ``met``: it ended SUCCESSFUL, or the condition is
   ``ended``; ``broken``: it ended FAILED or CANCELLED and the condition is ``succeeded``;
2. the dependents still WAITING are locked in id order (two supervisors ending two
   dependencies of one dependent at the same instant take turns on its row: the second
   sees what the first wrote) and each loses one ``waiting_for`` per met edge. At 0 it
   becomes READY, available at ``max(now, its run_after)``. A broken edge ends it
   CANCELLED with a ``DependencyFailed`` error naming the dependency,
3. and that cancel is itself an end: its own dependents are resolved the same way.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Iterator
from datetime import datetime
from typing import Any

from django.db.models import F
from django.utils import timezone

from ..db import notify
from ..models import (
    DependencyCondition,
    DependencyState,
    TaskDependency,
    TaskRecord,
    TaskStatus,
)
from ..units.failures import FailureInfo
from .errorlist import error_entry, kept_errors

FAILED_CLASS = "django_dbworker.exceptions.DependencyFailed"
#: Ids per statement (an IN list).
CHUNK = 1000


def resolve(using: str, ended: Iterable[tuple[Any, str]]) -> None:
    """Release or cancel the dependents of tasks that just ended: ``(task id, final
    status)`` each. In the caller's transaction, after its final status write."""
    now = timezone.now()
    round_ = {_id(pk): str(status) for pk, status in ended}
    released = False
    while round_:
        met, broken = _resolve_edges(using, round_, now)
        released |= lower_waiting(using, met, now)
        round_ = _cancel(using, broken, now)
    if released:
        notify.announce(using, notify.TASKS)


def _id(pk: Any) -> uuid.UUID:
    return pk if isinstance(pk, uuid.UUID) else uuid.UUID(str(pk))


def _resolve_edges(
    using: str, ended: dict[uuid.UUID, str], now: datetime,
) -> tuple[dict[uuid.UUID, int], dict[uuid.UUID, tuple[uuid.UUID, str]]]:
    """Resolve the waiting edges on ``ended``: how many were met per dependent, and the
    message of the first broken one per dependent."""
    edges = TaskDependency.objects.using(using)
    waiting = list(
        edges.filter(dependency_id__in=sorted(ended), state=DependencyState.WAITING)
        .select_for_update().order_by("pk")
        .values_list("pk", "dependent_id", "dependency_id", "condition"))
    if not waiting:
        return {}, {}
    met: dict[uuid.UUID, int] = {}
    broken: dict[uuid.UUID, tuple[uuid.UUID, str]] = {}
    met_ids, broken_ids = [], []
    for pk, dependent, dependency, condition in waiting:
        assert dependency is not None  # filtered by dependency_id
        status = ended[dependency]
        if status == TaskStatus.SUCCESSFUL or condition == DependencyCondition.ENDED:
            met_ids.append(pk)
            met[dependent] = met.get(dependent, 0) + 1
        else:
            broken_ids.append(pk)
            broken.setdefault(dependent, (dependency, status))
    for pks, state in ((met_ids, DependencyState.MET), (broken_ids, DependencyState.BROKEN)):
        for ids in chunks(pks):  # still waiting: an edge is resolved once
            edges.filter(pk__in=ids, state=DependencyState.WAITING).update(
                state=state, resolved_at=now)
    return met, broken


def lower_waiting(using: str, met: dict[uuid.UUID, int], now: datetime) -> bool:
    """Lower each dependent's ``waiting_for`` by its met edges; READY at 0. The dependents
    are locked first (in id order); then one UPDATE per kind of change and ``CHUNK`` of
    them (a fan-out of 10,000 is released by ten statements, not 10,000)."""
    if not met:
        return False
    tasks = TaskRecord.objects.using(using)
    ready: list[uuid.UUID] = []
    later: dict[datetime, list[uuid.UUID]] = {}
    lower: dict[int, list[uuid.UUID]] = {}
    for ids in chunks(sorted(met)):
        for pk, waiting_for, run_after in (
                tasks.filter(pk__in=ids, status=TaskStatus.WAITING)
                .select_for_update().order_by("pk")
                .values_list("pk", "waiting_for", "run_after")):
            if waiting_for > met[pk]:
                lower.setdefault(met[pk], []).append(pk)
            elif run_after is not None and run_after > now:  # released at its run_after
                later.setdefault(run_after, []).append(pk)
            else:
                ready.append(pk)
    for k, pks in lower.items():
        for ids in chunks(pks):
            tasks.filter(pk__in=ids, status=TaskStatus.WAITING).update(
                waiting_for=F("waiting_for") - k)
    released = 0
    for available, pks in [(now, ready), *later.items()]:
        for ids in chunks(pks):
            released += tasks.filter(pk__in=ids, status=TaskStatus.WAITING).update(
                waiting_for=0, status=TaskStatus.READY, available_at=available)
    return bool(released)


def chunks(ids: list[Any]) -> Iterator[list[Any]]:
    """``ids`` ``CHUNK`` at a time: an IN list stays within every database's limits."""
    for start in range(0, len(ids), CHUNK):
        yield ids[start:start + CHUNK]


def _cancel(using: str, broken: dict[uuid.UUID, tuple[uuid.UUID, str]],
            now: datetime) -> dict[uuid.UUID, str]:
    """End the dependents of broken edges CANCELLED, each naming its dependency; the ones
    that have dependents of their own, to resolve next."""

    if not broken:
        return {}
    paths = dict(TaskRecord.objects.using(using)
                 .filter(pk__in={dependency for dependency, _ in broken.values()})
                 .values_list("pk", "task_path"))
    return cancel_with(using, {
        dependent: broken_message(f"{paths.get(dependency, 'task')} {dependency}", status)
        for dependent, (dependency, status) in broken.items()}, now)


def cancel_dependents(using: str, dependents: list[uuid.UUID], message: str) -> None:
    """End new dependents CANCELLED at once (a dependency had already failed)."""
    cancel_with(using, dict.fromkeys(dependents, message), timezone.now())


def cancel_with(using: str, messages: dict[uuid.UUID, str],
                 now: datetime) -> dict[uuid.UUID, str]:

    tasks = TaskRecord.objects.using(using)
    rows = [row for ids in chunks(sorted(messages)) for row in (
        tasks.filter(pk__in=ids, status=TaskStatus.WAITING).select_for_update()
        .order_by("pk").values_list("pk", "errors", "attempts", "has_dependents"))]
    cascade: dict[uuid.UUID, str] = {}
    ended: list[uuid.UUID] = []
    for pk, errors, attempts, has_dependents in rows:
        entry = error_entry(FailureInfo(FAILED_CLASS, messages[pk]), attempts, now)
        changed = tasks.filter(pk=pk, status=TaskStatus.WAITING).update(
            status=TaskStatus.CANCELLED, finished_at=now, errors=[*kept_errors(errors), entry])
        if changed:
            ended.append(pk)
        if changed and has_dependents:
            cascade[pk] = TaskStatus.CANCELLED
    notify.announce_ended(using, ended)
    return cascade


def broken_message(what: str, status: str) -> str:
    """The ``DependencyFailed`` message of a dependent whose dependency ``what`` (task path
    and id, or a row) ended ``status``."""
    return (f"dependency {what} ended {status}, and this task waited for it to succeed: "
            "cancelled without running (enqueue it with run_on_failure=True to run it "
            "whatever its dependencies' outcome)")
