"""A workflow as a unit for operators: its handle (``get(id)``), progress counts by
status, its members and their dependencies, and cancel.

Members are the tasks whose ``workflow_id`` is the workflow's id, read through the
``dbworker_task_workflow`` index; the completion callback carries the id too but is not
a member: it is not counted, and cancelling the workflow leaves it to run (it waits for
the members to end, cancelled or not, and then reports on them).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import transaction
from django.db.models import Count, QuerySet
from django.utils import timezone

from .. import conf
from ..db import notify
from ..exceptions import UnknownWorkflow
from ..models import TaskDependency, TaskRecord, TaskStatus, Workflow
from ..tasks.dependents import resolve
from ..tasks.errorlist import error_entry, kept_errors
from ..units.failures import FailureInfo

if TYPE_CHECKING:
    from ..tasks.results import DBWorkerTaskResult

#: Statuses of members that have not ended.
OPEN = (TaskStatus.WAITING, TaskStatus.READY, TaskStatus.RETRYING, TaskStatus.RUNNING)
#: The class named by the errors entry of a member the workflow's cancel ended.
CANCELLED_CLASS = "django_dbworker.exceptions.TaskCancelled"
#: What cancelling a workflow cancels at once; RUNNING members are asked to stop.
NOT_STARTED = (TaskStatus.WAITING, TaskStatus.READY, TaskStatus.RETRYING)


def _alias() -> str:
    return conf.get().DATABASE


def _uuid(workflow_id: Any) -> uuid.UUID:
    try:
        return workflow_id if isinstance(workflow_id, uuid.UUID) else uuid.UUID(
            str(workflow_id))
    except ValueError:
        raise UnknownWorkflow(f"{workflow_id!r} is not a workflow id (a UUID).") from None


def get(workflow_id: Any) -> WorkflowHandle:
    """The workflow (or ``enqueue_many`` batch) with this id; ``UnknownWorkflow`` if none."""
    pk = _uuid(workflow_id)
    row = Workflow.objects.using(_alias()).filter(pk=pk).first()
    if row is None:
        raise UnknownWorkflow(f"No workflow {pk}: it was never stored, or it was deleted.")
    return WorkflowHandle(row)


def members(row: Workflow) -> QuerySet[TaskRecord]:
    """The workflow's members (not its callback), in enqueue order (``in_order`` puts the
    members of one enqueue call in call order on every database)."""
    qs = TaskRecord.objects.using(_alias()).filter(workflow_id=row.pk)
    if row.callback_id is not None:
        qs = qs.exclude(pk=row.callback_id)
    return qs.order_by("enqueued_at", "id")


def in_order(tasks: list[TaskRecord]) -> list[TaskRecord]:
    """``tasks`` in enqueue order, the members of one enqueue call in call order: the ids
    of a workflow's calls are made in ascending order of their text
    (``tasks.newtasks.ids``), which is the database's order of UUIDs on PostgreSQL and
    SQLite, but not on MariaDB (its UUID type compares the groups in another order)."""
    return sorted(tasks, key=lambda t: (t.enqueued_at, str(t.pk)))


def progress(row: Workflow) -> dict[str, int]:
    """Members by status: every status (0 if none), and ``total``."""
    counts = {s.value: 0 for s in TaskStatus}
    for status, n in (members(row).order_by().values_list("status")
                      .annotate(n=Count("id")).values_list("status", "n")):
        counts[status] = n
    counts["total"] = sum(counts.values())
    return counts


@dataclass(frozen=True, slots=True)
class Edge:
    """One dependency of a member, as stored (``TaskDependency``)."""

    position: int
    dependency_id: str | None
    row_worker: str
    row_source_id: str | None
    condition: str
    state: str

    def as_dict(self) -> dict[str, Any]:
        return {"position": self.position, "dependency_id": self.dependency_id,
                "row_worker": self.row_worker or None, "row_source_id": self.row_source_id,
                "condition": self.condition, "state": self.state}


def edges(task_ids: list[Any]) -> dict[str, list[Edge]]:
    """The dependencies of these tasks, by dependent id (as text), in ``after`` order."""
    found: dict[str, list[Edge]] = {str(pk): [] for pk in task_ids}
    rows = (TaskDependency.objects.using(_alias()).filter(dependent_id__in=task_ids)
            .order_by("dependent_id", "position")
            .values_list("dependent_id", "position", "dependency_id", "row_worker",
                         "row_source_id", "condition", "state"))
    for dependent, position, dependency, worker, source, condition, state in rows:
        found[str(dependent)].append(Edge(
            position, None if dependency is None else str(dependency), worker, source,
            condition, state))
    return found


def cancel(row: Workflow) -> dict[str, int]:
    """Mark the workflow cancelled; cancel its members that have not started (WAITING,
    READY, RETRYING) and ask the running ones to stop (``django_dbworker.cancel``).

    The members that have not started end CANCELLED together, in one transaction (a
    statement per thousand), before their ends are resolved (``release.resolve``), so
    each is recorded as cancelled by the workflow (``TaskCancelled``), none as cancelled
    by a dependency. The callback is left to run once every member has ended. Returns
    ``{"cancelled": n, "stopping": m}``: members cancelled now, and running members asked
    to stop (now or by an earlier cancel). Cancelling again changes nothing new;
    ``cancelled_at`` keeps the first time."""
    from ..tasks import store as taskstore

    using = _alias()
    now = timezone.now()
    Workflow.objects.using(using).filter(pk=row.pk, cancelled_at__isnull=True).update(
        cancelled_at=now)
    row.cancelled_at = Workflow.objects.using(using).values_list(
        "cancelled_at", flat=True).get(pk=row.pk)
    cancelled = _cancel_not_started(row, using, now)
    stopping = 0
    for pk in members(row).filter(status=TaskStatus.RUNNING).values_list("pk", flat=True):
        stopping += bool(taskstore.cancel(pk)) and TaskRecord.objects.using(using).filter(
            pk=pk, status=TaskStatus.RUNNING).exists()
    return {"cancelled": cancelled, "stopping": stopping}


def _cancel_not_started(row: Workflow, using: str, now: datetime) -> int:

    info = FailureInfo(CANCELLED_CLASS, "the workflow was cancelled before the task ran")
    tasks = TaskRecord.objects.using(using)
    cancelled = 0
    with transaction.atomic(using=using):
        rows = list(members(row).filter(status__in=NOT_STARTED).select_for_update()
                    .order_by("pk").values_list("pk", "errors", "attempts",
                                                "has_dependents"))
        fresh: dict[int, list[uuid.UUID]] = {}  # no error to keep, by attempts
        for pk, errors, attempts, _ in rows:
            kept = kept_errors(errors)
            if not kept:
                fresh.setdefault(attempts, []).append(pk)
                continue
            cancelled += tasks.filter(pk=pk, status__in=NOT_STARTED).update(
                status=TaskStatus.CANCELLED, finished_at=now, cancel_requested_at=now,
                errors=[*kept, error_entry(info, attempts, now)])
        for attempts, pks in fresh.items():
            for chunk in _chunks(pks):
                cancelled += tasks.filter(pk__in=chunk, status__in=NOT_STARTED).update(
                    status=TaskStatus.CANCELLED, finished_at=now, cancel_requested_at=now,
                    errors=[error_entry(info, attempts, now)])
        notify.announce_ended(using, [pk for pk, _, _, _ in rows])
        ended = [pk for pk, _, _, has_dependents in rows if has_dependents]
        for chunk in _chunks(ended):
            resolve(using, [(pk, TaskStatus.CANCELLED) for pk in chunk])
    return cancelled


def _chunks(items: list[uuid.UUID], size: int = 1000) -> list[list[uuid.UUID]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class WorkflowHandle:
    """What ``chain(...).enqueue()`` returns, and ``django_dbworker.workflows.get(id)``."""

    def __init__(self, row: Workflow, results: list[DBWorkerTaskResult] | None = None,
                 callback: DBWorkerTaskResult | None = None) -> None:
        #: The ``Workflow`` row, as it was read.
        self.row = row
        self._results = results
        self._callback = callback

    @property
    def id(self) -> str:
        """The workflow's id (text of a UUID): ``get(id)`` finds it again."""
        return str(self.row.pk)

    @property
    def name(self) -> str:
        """The name it was enqueued with (empty: none)."""
        return self.row.name

    @property
    def created_at(self) -> datetime:
        """When it was enqueued."""
        return self.row.created_at

    @property
    def cancelled_at(self) -> datetime | None:
        """When it was cancelled, or None."""
        return self.row.cancelled_at

    @property
    def results(self) -> list[DBWorkerTaskResult]:
        """The members' results: in the order of the steps as built (the handle
        ``enqueue()`` returned), or in enqueue order (``get(id)``: the steps of one
        ``enqueue_many`` in any order). Each as it was read: ``refresh()`` it."""
        if self._results is None:
            from ..tasks.results import to_result

            self._results = [to_result(r, r.backend) for r in in_order(list(members(
                self.row)))]
        return self._results

    @property
    def callback(self) -> DBWorkerTaskResult | None:
        """The completion callback's result, if the workflow has one (and it is stored)."""
        if self._callback is None and self.row.callback_id is not None:
            from ..tasks.results import to_result

            found = TaskRecord.objects.using(_alias()).filter(pk=self.row.callback_id).first()
            self._callback = None if found is None else to_result(found, found.backend)
        return self._callback

    def progress(self) -> dict[str, int]:
        """Members by status now (every ``TaskStatus`` and ``total``)."""
        return progress(self.row)

    def done(self) -> bool:
        """Whether every member has ended (SUCCESSFUL, FAILED or CANCELLED)."""
        return not members(self.row).filter(status__in=OPEN).exists()

    def cancel(self) -> dict[str, int]:
        """Cancel what has not started, ask running members to stop (see ``cancel``)."""
        return cancel(self.row)

    def __repr__(self) -> str:
        return f"<WorkflowHandle {self.name or 'workflow'} {self.id}>"


@dataclass(frozen=True, slots=True)
class Member:
    """A member with its dependencies and its depth (0: waits for no other member; else
    one more than the deepest member it waits for), for the admin page and the CLI."""

    task: TaskRecord
    after: list[Edge]
    depth: int


def described(row: Workflow, limit: int | None = None) -> tuple[list[Member], int]:
    """The first ``limit`` members (all: None) in enqueue order with their dependencies,
    and how many members there are."""
    qs = members(row)
    total = qs.count()
    tasks = in_order(list(qs if limit is None else qs[:limit]))
    found = edges([t.pk for t in tasks])
    depth: dict[str, int] = {}

    def depth_of(pk: str) -> int:
        if pk not in depth:
            depth[pk] = 0  # (a cycle cannot be stored; this ends the walk if one were)
            depth[pk] = max((depth_of(e.dependency_id) + 1 for e in found[pk]
                             if e.dependency_id in found), default=0)
        return depth[pk]

    return [Member(t, found[str(t.pk)], depth_of(str(t.pk))) for t in tasks], total
