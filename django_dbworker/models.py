"""Our tables: one execution per (worker, source row), and the failures of each."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from .db.hints import without_index
from .db.partial import InStates, KeyField, PartialIndex, UniqueUnlessNull


class ExecutionStatus(models.TextChoices):
    """The public status of a worker's execution on one source row."""

    #: Claimed: a handler runs it now, under a lease.
    WORKING = "WORKING", "working"
    #: To be run again (not before its delay): the handler returned ``Unfinished()``, or
    #: the unit was released or reset.
    UNFINISHED = "UNFINISHED", "unfinished"
    #: The handler returned ``Finished()``: not offered again without a reset
    #: (``dbworker reset --finished``).
    FINISHED = "FINISHED", "finished"
    #: The handler raised, or its unit crashed (killed its process, lost its lease)
    #: ``MAX_CRASHES`` times: not offered again until it is reset
    #: (``Worker.reset_failed()``, the admin, ``dbworker retry``).
    FAILED = "FAILED", "failed"


class State(models.TextChoices):
    """Every value of ``Execution.state``: the public statuses plus PENDING.

    A PENDING execution is a unit waiting for its first claim; to users it has no status
    (``execution_status()`` answers ``None``), exactly like a row nobody has seen yet.
    """

    PENDING = "PENDING", "pending"
    WORKING = "WORKING", "working"
    UNFINISHED = "UNFINISHED", "unfinished"
    FINISHED = "FINISHED", "finished"
    FAILED = "FAILED", "failed"


#: States from which a unit may be claimed.
CLAIMABLE = (State.PENDING, State.UNFINISHED)
#: States that neither a claim nor the reaper reads: the admin's index by state has them.
SETTLED = (State.FINISHED, State.FAILED)


class Transition(frozenset[str]):
    """One change of state in a store's table (``TRANSITIONS``): the states it may start
    from (the set itself: the guard of its UPDATE) and, as ``to``, the states it may leave
    (empty: the row is deleted)."""

    to: frozenset[str]

    def __new__(cls, sources: Iterable[str], *, to: Iterable[str]) -> Transition:
        transition = super().__new__(cls, sources)
        transition.to = frozenset(to)
        return transition

    def __repr__(self) -> str:
        return f"Transition({sorted(self)} -> {sorted(self.to)})"


def in_states(states: Iterable[str], field: str = "state") -> Q:
    """``state IN ('A', 'B')`` with the names inline, so it matches a partial index (on
    MariaDB/MySQL: the flag column of the index over the same states, ``db.partial``).

    Give the states in the order of the index's condition (SQLite compares the lists as
    written). One state is written ``state = 'A'``: SQLite matches an index's
    ``WHERE state = 'A'`` only by that very form, not by ``state IN ('A')``.
    """
    return Q(InStates(field, states))


class ExecutionQuerySet(models.QuerySet["Execution"]):
    """The status filters of executions, each in the form its partial index matches."""

    def pending(self) -> ExecutionQuerySet:
        """Never claimed yet; to users these have no status."""
        return self.filter(in_states([State.PENDING], "state"))

    def claimable(self, now: datetime | None = None) -> ExecutionQuerySet:
        """Waiting for a claim (PENDING or UNFINISHED, the ``dbworker_execution_claimable``
        index); with ``now``, only those whose ``available_at`` has come by then."""
        qs = self.filter(in_states(CLAIMABLE, "state"))
        return qs if now is None else qs.filter(available_at__lte=now)

    def working(self) -> ExecutionQuerySet:
        """Claimed and running now (the ``dbworker_execution_working`` index)."""
        return self.filter(in_states([State.WORKING], "state"))

    def unfinished(self) -> ExecutionQuerySet:
        return self.filter(in_states([State.UNFINISHED], "state"))

    def finished(self) -> ExecutionQuerySet:
        return self.filter(in_states([State.FINISHED], "state"))

    def failed(self) -> ExecutionQuerySet:
        """FAILED for good: not offered again until a reset or retry."""
        return self.filter(in_states([State.FAILED], "state"))


class Execution(models.Model):
    """The record of one worker's work on one source row.

    There is no foreign key to the source row on purpose: deleting a source row is never
    blocked by us, and its executions are removed by a signal or by the sweep.
    """

    id = models.BigAutoField(primary_key=True)
    worker = models.CharField(max_length=100)
    #: The source row's primary key as the database casts it to text.
    source_id = KeyField(max_length=255)
    #: The source row's primary key when it is an integer: the claim order of pk-ordered
    #: workers, served by the claim index.
    sort_key = models.BigIntegerField(null=True, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    #: Times this unit's process died or its lease expired while it ran.
    crashes = models.PositiveIntegerField(default=0)
    #: The unit may not be claimed before this instant (``Unfinished(delay=...)``).
    available_at = models.DateTimeField(default=timezone.now)
    #: Identity of the current claim; a completion must present it (fencing).
    token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    supervisor_id = models.UUIDField(null=True, blank=True)
    claimed_host = models.CharField(max_length=255, blank=True, default="")
    claimed_pid = models.IntegerField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=255, blank=True, default="")

    objects = ExecutionQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["worker", "source_id"], name="dbworker_execution_unique_unit"
            ),
        ]
        indexes = [
            # Serves the claim query exactly: only units waiting to be claimed are in it,
            # so its size follows the pending work, never the finished history.
            PartialIndex(
                fields=["worker", "sort_key", "source_id"],
                name="dbworker_execution_claimable",
                condition=Q(state__in=CLAIMABLE),
                flag="dbworker_claimable",
            ),
            # The admin's list filtered by an end state, newest first
            # (``?state__exact=FAILED``), and the FAILED ones by exception. Partial: the
            # claim, the reaper and the renewal read WORKING and claimable units through
            # their own indexes, and an index of every state would tempt the planner away
            # from those where a table has no statistics.
            PartialIndex(
                fields=["state", "id"],
                name="dbworker_execution_state",
                condition=Q(state__in=SETTLED),
                flag="dbworker_settled",
            ),
            # One worker's ended executions by state: the capped counts of the dashboard,
            # the metrics and ``dbworker stats`` (at most CAP entries each), and the
            # admin's list filtered by worker and status, newest first.
            PartialIndex(
                fields=["state", "worker", "id"],
                name="dbworker_execution_settled",
                condition=Q(state__in=SETTLED),
                flag="dbworker_settled",
            ),
            # Serves the reaper (expired leases) and lease renewal.
            PartialIndex(
                fields=["lease_expires_at"],
                name="dbworker_execution_working",
                condition=Q(state=State.WORKING),
                flag="dbworker_working",
            ),
            # The last minutes' completions (throughput and run times of the dashboard,
            # ``dbworker stats`` and the metrics): a range of the window, not the history.
            models.Index(fields=["finished_at"], name="dbworker_execution_finished_at"),
        ]

    def __str__(self) -> str:
        return f"{self.worker}[{self.source_id}] {self.state}"

    @property
    def status(self) -> ExecutionStatus | None:
        return None if self.state == State.PENDING else ExecutionStatus(self.state)

    def as_dict(self, *, traceback: bool = True) -> dict[str, Any]:
        """The execution as one JSON-ready mapping: ``state()``, the CLI and the API all
        show this one (keys: ``EXECUTION_KEYS``, documented in docs/cli.md). Reads its
        failures (prefetch ``failures`` for many)."""
        errors = [f.as_dict(traceback=traceback) for f in self.failures.all()]
        return {
            "kind": "execution", "id": self.pk, "worker": self.worker,
            "source_id": self.source_id, "execution_status": self.status,
            "attempts": self.attempts, "crashes": self.crashes,
            "created_at": self.created_at, "available_at": self.available_at,
            "started_at": self.started_at, "finished_at": self.finished_at,
            "lease_expires_at": self.lease_expires_at,
            "claimed_host": self.claimed_host or None, "claimed_pid": self.claimed_pid,
            "supervisor_id": self.supervisor_id, "progress": self.progress,
            "progress_message": self.progress_message,
            "error": errors[-1] if self.state == State.FAILED and errors else None,
            "errors": errors,
        }


#: The keys of ``Execution.as_dict()``, in order.
EXECUTION_KEYS = (
    "kind", "id", "worker", "source_id", "execution_status", "attempts", "crashes",
    "created_at", "available_at", "started_at", "finished_at", "lease_expires_at",
    "claimed_host", "claimed_pid", "supervisor_id", "progress", "progress_message", "error",
    "errors",
)


def no_execution(worker: str, source_id: Any) -> dict[str, Any]:
    """``Execution.as_dict()``'s shape for a row no execution exists for (yet)."""
    return {**dict.fromkeys(EXECUTION_KEYS), "kind": "execution", "worker": worker,
            "source_id": source_id, "attempts": 0, "crashes": 0, "progress_message": "",
            "errors": []}


#: The keys of one failed attempt (``failure_dict``), in order.
FAILURE_KEYS = ("attempt", "exception_class", "message", "traceback", "occurred_at")


def failure_dict(*, attempt: int | None, exception_class: str, message: str,
                 traceback: str | None, occurred_at: datetime | str | None) -> dict[str, Any]:
    """One failed attempt, the same shape wherever it is shown: an execution's ``Failure``
    rows and a task row's stored ``errors`` entries both come out as this."""
    return {"attempt": attempt, "exception_class": exception_class, "message": message,
            "traceback": traceback, "occurred_at": occurred_at}


class SweepState(models.Model):
    """How far discovery has looked at one worker's source table (``rows/sweep.py``).

    Rows with a primary key at or below ``watermark`` have been looked at by a pass over new
    rows; a full pass keeps its position here, so a restarted supervisor resumes it, and
    ``full_ended_at`` says when the last one ended.
    """

    worker = models.CharField(max_length=100, primary_key=True)
    #: The highest integer primary key a pass over new rows has looked at (None: none yet).
    watermark = models.BigIntegerField(null=True, blank=True)
    #: The full pass in progress: ``rows`` (source rows after ``full_cursor``), ``orphans``
    #: (executions after ``orphan_cursor`` whose row is gone), or "" (none).
    full_phase = models.CharField(max_length=16, blank=True, default="")
    #: The last key looked at, as ``source_id`` holds it (None: from the first; "" is a key).
    full_cursor = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    orphan_cursor = models.BigIntegerField(null=True, blank=True)
    #: The process walking the full pass, and when it last took a step (another one takes
    #: the pass over when that is long ago).
    full_owner = models.UUIDField(null=True, blank=True)
    full_stepped_at = models.DateTimeField(null=True, blank=True)
    full_started_at = models.DateTimeField(null=True, blank=True)
    full_ended_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.worker} watermark={self.watermark}"


class Failure(models.Model):
    """One failed attempt of an execution: the data a person needs to fix it."""

    id = models.BigAutoField(primary_key=True)
    execution = models.ForeignKey(Execution, on_delete=models.CASCADE, related_name="failures")
    attempt = models.PositiveIntegerField()
    #: Dotted path of the exception class, e.g. ``builtins.ValueError``.
    exception_class = models.CharField(max_length=255)
    message = models.TextField(blank=True, default="")
    traceback = models.TextField(blank=True, default="")
    occurred_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.exception_class}: {self.message[:80]}"

    def as_dict(self, *, traceback: bool = True) -> dict[str, Any]:
        """``failure_dict`` of this row; ``traceback=False`` leaves the traceback out (None)."""
        return failure_dict(attempt=self.attempt, exception_class=self.exception_class,
                            message=self.message,
                            traceback=self.traceback if traceback else None,
                            occurred_at=self.occurred_at)


class TaskStatus(models.TextChoices):
    """Our status of an enqueued task; ``django_status`` maps it to Django's four."""

    READY = "READY", "ready"
    #: Waits for its dependencies (``.using(after=...)``, docs/workflows.md): no claim
    #: sees it (it is in no claim index) until the last one is met (Django sees READY).
    WAITING = "WAITING", "waiting"
    RUNNING = "RUNNING", "running"
    #: Failed an attempt and waits for the next one (Django sees READY).
    RETRYING = "RETRYING", "retrying"
    SUCCESSFUL = "SUCCESSFUL", "successful"
    FAILED = "FAILED", "failed"
    #: Cancelled before or while it ran (Django sees FAILED).
    CANCELLED = "CANCELLED", "cancelled"


TASK_CLAIMABLE = (TaskStatus.READY, TaskStatus.RETRYING)
TASK_FINISHED = (TaskStatus.SUCCESSFUL, TaskStatus.FAILED, TaskStatus.CANCELLED)
#: Statuses that neither a claim nor the reaper reads: the admin's index by status has them.
TASK_SETTLED = (TaskStatus.WAITING, *TASK_FINISHED)


#: The guard of ``dbworker_task_claimable_any``, true of every task (priority is a
#: SmallIntegerField): the claims of every queue state it, so only they use that index.
ANY_QUEUE_GUARD = Q(priority__gte=-32768)
#: The index of the claims of every queue, which claims of some queues must not walk.
ANY_QUEUE_INDEX = "dbworker_task_claimable_any"


class TaskRecordQuerySet(models.QuerySet["TaskRecord"]):
    """The status filters of tasks, each in the form its partial index matches."""

    def ready(self, now: datetime | None = None) -> TaskRecordQuerySet:
        """Waiting for a claim (READY or RETRYING, the ``dbworker_task_claimable`` indexes);
        with ``now``, only those whose ``available_at`` has come by then."""
        qs = self.filter(in_states(TASK_CLAIMABLE, "status"))
        return qs if now is None else qs.filter(available_at__lte=now)

    def in_queues(self, queues: Iterable[str]) -> TaskRecordQuerySet:
        """Of these queues, read through their own claim index (``dbworker_task_claimable``),
        never the every-queue one, which would walk past the other queues' tasks ahead:
        elsewhere its guard keeps it out (``ANY_QUEUE_GUARD``), on MariaDB/MySQL a hint
        (``db.hints``)."""
        return without_index(self.filter(queue_name__in=list(queues)), ANY_QUEUE_INDEX)

    def running(self) -> TaskRecordQuerySet:
        """Claimed and running now (the ``dbworker_task_running`` index)."""
        return self.filter(in_states([TaskStatus.RUNNING], "status"))

    def finished(self) -> TaskRecordQuerySet:
        """SUCCESSFUL, FAILED or CANCELLED (the ``dbworker_task_finished`` index)."""
        return self.filter(in_states(TASK_FINISHED, "status"))

    def successful(self) -> TaskRecordQuerySet:
        return self.filter(in_states([TaskStatus.SUCCESSFUL], "status"))

    def failed(self) -> TaskRecordQuerySet:
        """FAILED for good (after its retries): not run again until a retry."""
        return self.filter(in_states([TaskStatus.FAILED], "status"))

    def cancelled(self) -> TaskRecordQuerySet:
        return self.filter(in_states([TaskStatus.CANCELLED], "status"))


class TaskRecord(models.Model):
    """One enqueued call of a ``django.tasks`` task: arguments, status, attempts, result."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    task_path = models.CharField(max_length=255)
    backend = models.CharField(max_length=100, default="default")
    queue_name = models.CharField(max_length=100, default="default")
    priority = models.SmallIntegerField(default=0)
    args = models.JSONField(default=list)
    kwargs = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=TaskStatus.choices,
                              default=TaskStatus.READY)
    #: The run_after the caller asked for, if any.
    run_after = models.DateTimeField(null=True, blank=True)
    #: Not claimed before this instant: run_after, or the next retry.
    available_at = models.DateTimeField(default=timezone.now)
    enqueued_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    last_attempted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    crashes = models.PositiveIntegerField(default=0)
    worker_ids = models.JSONField(default=list)
    #: One entry per failed attempt: exception_class_path, message, traceback, attempt, at.
    errors = models.JSONField(default=list)
    return_value = models.JSONField(null=True, blank=True)
    progress = models.FloatField(null=True, blank=True)
    progress_message = models.CharField(max_length=255, blank=True, default="")
    #: Unique where set (``dbworker_task_idempotency_key``, a partial index: most rows
    #: have none and cost it nothing).
    #: NULL: no key ("" would be one).
    idempotency_key = KeyField(max_length=255, null=True, blank=True)
    #: The cron schedule that enqueued it, if any.
    schedule = models.CharField(max_length=100, blank=True, default="")
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    #: Flow control (docs/tasks.md "Flow control"). The uniqueness key the call was
    #: enqueued with, shown to people; which task holds it is ``TaskUniqueness``.
    unique_key = models.CharField(max_length=255, blank=True, default="")
    #: At most ``concurrency_limit`` tasks with this key RUNNING at once, everywhere.
    concurrency_key = KeyField(max_length=255, null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    #: Times the task asked to run later (``Snooze``) without using an attempt.
    snoozes = models.PositiveIntegerField(default=0)
    #: Workflows (docs/workflows.md). The workflow (or ``enqueue_many`` batch) the task
    #: belongs to, if any (``Workflow.id``; no foreign key, like every id here).
    workflow_id = models.UUIDField(null=True, blank=True)
    #: How many of its dependencies (``TaskDependency``) are not met yet; WAITING until 0.
    waiting_for = models.PositiveIntegerField(default=0)
    #: Whether some task waits for this one: only then does its end look for dependents.
    has_dependents = models.BooleanField(default=False)
    token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    supervisor_id = models.UUIDField(null=True, blank=True)
    claimed_host = models.CharField(max_length=255, blank=True, default="")
    claimed_pid = models.IntegerField(null=True, blank=True)

    objects = TaskRecordQuerySet.as_manager()

    class Meta:
        verbose_name = "task"
        constraints = [
            UniqueUnlessNull(
                fields=["idempotency_key"], name="dbworker_task_idempotency_key",
                condition=Q(idempotency_key__isnull=False),
            ),
        ]
        indexes = [
            PartialIndex(
                fields=["queue_name", "-priority", "available_at"],
                name="dbworker_task_claimable",
                condition=Q(status__in=TASK_CLAIMABLE),
                flag="dbworker_claimable",
            ),
            # The claims of a supervisor that runs every queue (no --queue): the same order
            # without the queue, so they walk an index too instead of sorting every task
            # that waits. Its guard (``ANY_QUEUE_GUARD``, true of every row) is stated by
            # those claims only: a claim of some queues cannot use this index, whose
            # order PostgreSQL's planner otherwise likes as well and then walks past every
            # task of the other queues that comes first (a paused backlog, a busy queue).
            PartialIndex(
                fields=["-priority", "available_at"],
                name=ANY_QUEUE_INDEX,
                condition=Q(status__in=TASK_CLAIMABLE) & ANY_QUEUE_GUARD,
                flag="dbworker_claimable",
            ),
            PartialIndex(
                fields=["lease_expires_at"],
                name="dbworker_task_running",
                condition=Q(status=TaskStatus.RUNNING),
                flag="dbworker_running",
            ),
            # How many tasks of a concurrency key run now (the keyed claim counts them).
            PartialIndex(
                fields=["concurrency_key"],
                name="dbworker_task_keyed_running",
                condition=Q(status=TaskStatus.RUNNING),
                flag="dbworker_running",
            ),
            # A workflow's members (progress counts, cancel, the admin page).
            models.Index(fields=["workflow_id"], name="dbworker_task_workflow"),
            # The admin's list, newest first (Django adds the key to the order): unfiltered,
            # by status, by task (and its search by path).
            models.Index(fields=["enqueued_at", "id"], name="dbworker_task_enqueued"),
            # By status: the statuses no claim, reaper or renewal reads (the same reason
            # as the executions' ``dbworker_execution_state``); the list of the claimable
            # and running ones walks ``dbworker_task_enqueued``.
            PartialIndex(
                fields=["status", "enqueued_at", "id"],
                name="dbworker_task_status",
                condition=Q(status__in=TASK_SETTLED),
                flag="dbworker_settled",
            ),
            models.Index(fields=["task_path", "enqueued_at", "id"], name="dbworker_task_path"),
            # The admin's search by unique key (docs/tasks.md).
            models.Index(fields=["unique_key"], name="dbworker_task_unique_key"),
            PartialIndex(
                fields=["finished_at"],
                name="dbworker_task_finished",
                condition=Q(status__in=TASK_FINISHED),
                flag="dbworker_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_path} {self.status}"

    def failure_dicts(self, *, traceback: bool = True) -> list[dict[str, Any]]:
        """The stored ``errors`` as ``failure_dict``s, oldest first. The row keeps its own
        keys (``exception_class_path``, ``at``: stored data, never rewritten); this is where
        they become the shared ones."""
        stored = self.errors
        errors = stored if isinstance(stored, list) else [] if stored is None else [stored]
        return [_stored_failure(e, traceback) for e in errors]

    def as_dict(self, *, traceback: bool = True) -> dict[str, Any]:
        """The task as one JSON-ready mapping (keys: ``TASK_KEYS``, docs/cli.md)."""
        errors = self.failure_dicts(traceback=traceback)
        return {
            "kind": "task", "id": str(self.pk), "task": self.task_path,
            "queue": self.queue_name, "status": self.status, "priority": self.priority,
            "attempts": self.attempts, "crashes": self.crashes, "snoozes": self.snoozes,
            "args": self.args,
            "kwargs": self.kwargs, "result": self.return_value,
            "enqueued_at": self.enqueued_at, "run_after": self.run_after,
            "available_at": self.available_at, "started_at": self.started_at,
            "last_attempted_at": self.last_attempted_at, "finished_at": self.finished_at,
            "cancel_requested_at": self.cancel_requested_at,
            "claimed_host": self.claimed_host or None, "claimed_pid": self.claimed_pid,
            "progress": self.progress, "progress_message": self.progress_message,
            "idempotency_key": self.idempotency_key,
            "unique_key": self.unique_key or None,
            "workflow_id": str(self.workflow_id) if self.workflow_id else None,
            "waiting_for": self.waiting_for,
            "error": errors[-1] if self.status == TaskStatus.FAILED and errors else None,
            "errors": errors,
        }


#: The keys of ``TaskRecord.as_dict()``, in order.
TASK_KEYS = (
    "kind", "id", "task", "queue", "status", "priority", "attempts", "crashes", "snoozes",
    "args", "kwargs", "result", "enqueued_at", "run_after", "available_at", "started_at",
    "last_attempted_at", "finished_at", "cancel_requested_at", "claimed_host", "claimed_pid",
    "progress", "progress_message", "idempotency_key", "unique_key", "workflow_id",
    "waiting_for", "error", "errors",
)


def _stored_failure(entry: Any, traceback: bool) -> dict[str, Any]:
    """One entry of a task row's ``errors`` as a ``failure_dict``. An entry changed outside
    django-dbworker (not an object) comes out as its text in ``message``."""
    if not isinstance(entry, dict):
        return failure_dict(attempt=None, exception_class="", message=str(entry),
                            traceback=None, occurred_at=None)
    at = entry.get("at")
    when = _parsed(at) if isinstance(at, str) else at
    return failure_dict(
        attempt=entry.get("attempt"), exception_class=entry.get("exception_class_path", ""),
        message=entry.get("message", ""),
        traceback=entry.get("traceback", "") if traceback else None, occurred_at=when)


def _parsed(text: str) -> datetime | str:
    """A stored time (ISO 8601) as a datetime, like ``Failure.occurred_at``; text that is
    not one stays as it is."""
    try:
        return parse_datetime(text) or text
    except ValueError:
        return text


class DependencyCondition(models.TextChoices):
    """When a dependency is met."""

    #: The dependency ended SUCCESSFUL (the default); FAILED or CANCELLED breaks it.
    SUCCEEDED = "succeeded", "succeeded"
    #: The dependency ended, whatever its status (``run_on_failure``; completion callbacks).
    ENDED = "ended", "ended"


class DependencyState(models.TextChoices):
    WAITING = "waiting", "waiting"
    MET = "met", "met"
    #: The dependency ended FAILED or CANCELLED (or its row FAILED) and the condition was
    #: ``succeeded``: the dependent ends CANCELLED, naming it.
    BROKEN = "broken", "broken"


class TaskDependency(models.Model):
    """One edge of a workflow: ``dependent_id`` (a task) waits for a task
    (``dependency_id``) or for a row worker's execution of one source row (``row_worker``
    and ``row_source_id``). Each edge is resolved once (``state`` leaves WAITING by a
    conditional UPDATE), and only that resolution lowers the dependent's ``waiting_for``:
    the dependent is released, or cancelled, exactly once however many supervisors end
    its dependencies at the same instant. No foreign keys (retention deletes tasks in
    batches; an edge whose dependency is pruned keeps its state)."""

    id = models.BigAutoField(primary_key=True)
    dependent_id = models.UUIDField()
    #: Its place among the dependent's dependencies (the order of ``after=[...]``), which
    #: is the order their results are passed in.
    position = models.PositiveIntegerField(default=0)
    dependency_id = models.UUIDField(null=True, blank=True)
    row_worker = models.CharField(max_length=100, blank=True, default="")
    row_source_id = KeyField(max_length=255, null=True, blank=True)
    condition = models.CharField(max_length=16, choices=DependencyCondition.choices,
                                 default=DependencyCondition.SUCCEEDED)
    state = models.CharField(max_length=16, choices=DependencyState.choices,
                             default=DependencyState.WAITING)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "task dependency"
        verbose_name_plural = "task dependencies"
        constraints = [
            models.UniqueConstraint(fields=["dependent_id", "position"],
                                    name="dbworker_dependency_position"),
        ]
        indexes = [
            # What waits for a task that just ended.
            models.Index(fields=["dependency_id"], name="dbworker_dependency_of_task"),
            # What waits for a row worker's execution of a row.
            models.Index(fields=["row_worker", "row_source_id"], name="dbworker_dependency_of_row"),
            # The edges on rows still waiting (state first: "waiting" and row_worker > '').
            models.Index(fields=["state", "row_worker"], name="dbworker_dependency_waiting"),
        ]

    def __str__(self) -> str:
        on = (f"task {self.dependency_id}" if self.dependency_id is not None
              else f"{self.row_worker}[{self.row_source_id}]")
        return f"{self.dependent_id} after {on} ({self.condition}): {self.state}"


class Workflow(models.Model):
    """A group of tasks enqueued together (a workflow built with ``chain``/``group``/...,
    or an ``enqueue_many`` batch): its members are the tasks whose ``workflow_id`` is its
    id. Progress is counted from them; ``callback_id`` is the completion callback, a task
    that waits for every member to end (condition ``ended``), so it runs once."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    name = models.CharField(max_length=200, blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    callback_id = models.UUIDField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name or 'workflow'} {self.id}"


class RateBucket(models.Model):
    """A token bucket shared by all supervisors: one row per rate-limited key."""

    key = KeyField(max_length=255, primary_key=True)
    tokens = models.FloatField()
    updated_at = models.DateTimeField()

    def __str__(self) -> str:
        return f"{self.key}: {self.tokens:.2f}"


class TaskUniqueness(models.Model):
    """Which task holds a uniqueness key (``@task(unique_key=...)``): one row per task path,
    key and period. An enqueue with the key locks this row (``SELECT ... FOR UPDATE``), so
    concurrent enqueues of one key take turns; the holder keeps it while it is in the key's
    scope (waiting, running, or within its period), and the next enqueue takes it over after.
    No foreign key: a pruned task leaves its row, which the next enqueue takes over."""

    #: SHA-256 (hex) of the task path, the key and the period's start.
    digest = models.CharField(max_length=64, primary_key=True)
    task_id = models.UUIDField()
    task_path = models.CharField(max_length=255)
    unique_key = models.CharField(max_length=255)
    #: The start of the period the key is unique in (``unique_for``); None: by state.
    period_start = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "task uniqueness key"

    def __str__(self) -> str:
        return f"{self.task_path} {self.unique_key}: {self.task_id}"


class ConcurrencySlot(models.Model):
    """One row per concurrency key (``@task(concurrency_key=..., concurrency=N)``): a claim
    of tasks with that key locks it, counts the key's RUNNING tasks and claims at most the
    rest of the limit, so supervisors on any number of hosts never run more than N."""

    key = KeyField(max_length=255, primary_key=True)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "concurrency key"

    def __str__(self) -> str:
        return self.key


class PauseKind(models.TextChoices):
    QUEUE = "queue", "task queue"
    WORKER = "worker", "row worker"


class Pause(models.Model):
    """A task queue or a row worker paused at runtime: no supervisor claims from it until
    it is resumed (the row deleted). Running units finish; enqueueing still works."""

    kind = models.CharField(max_length=10, choices=PauseKind.choices)
    name = models.CharField(max_length=100)
    paused_at = models.DateTimeField(default=timezone.now)
    reason = models.CharField(max_length=255, blank=True, default="")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["kind", "name"], name="dbworker_pause_unique"),
        ]
        ordering = ["kind", "name"]

    def __str__(self) -> str:
        return f"{self.kind} {self.name} paused since {self.paused_at:%Y-%m-%d %H:%M:%S}"


class StoredSchedule(models.Model):
    """A cron schedule kept in the database and edited at runtime (admin, CLI), beside
    those declared in code (``@cron``, ``DBWORKER["SCHEDULES"]``); see tasks/schedules.py."""

    name = models.CharField(max_length=60, unique=True)
    task_path = models.CharField(max_length=255)
    args = models.JSONField(default=list, blank=True)
    kwargs = models.JSONField(default=dict, blank=True)
    cron = models.CharField(max_length=255)
    #: An IANA zone name; "": settings.TIME_ZONE.
    time_zone = models.CharField(max_length=64, blank=True, default="")
    enabled = models.BooleanField(default=True)
    misfire = models.CharField(max_length=10, default="skip")
    misfire_window = models.FloatField(default=3600.0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "stored schedule"
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name}: {self.cron} {self.task_path}"


class DatabaseNow(models.Func):
    """The database's clock, as Django stores a datetime there: what heartbeats are written
    and judged with, so that no host's clock (one running behind, a VM that drifted) makes
    a live supervisor look dead to the others, or a dead one alive.

    PostgreSQL: ``STATEMENT_TIMESTAMP()`` (``timestamptz``). MariaDB/MySQL:
    ``UTC_TIMESTAMP(6)`` with ``USE_TZ`` (Django stores UTC there), the session's
    ``NOW(6)`` without. SQLite: the time of the process running the statement (all of
    them share one host), in UTC, or local time without ``USE_TZ``.
    """

    template = "CURRENT_TIMESTAMP"
    output_field = models.DateTimeField()

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        return self.as_sql(compiler, connection, template="STATEMENT_TIMESTAMP()", **extra)

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        now = "UTC_TIMESTAMP(6)" if settings.USE_TZ else "NOW(6)"
        return self.as_sql(compiler, connection, template=now, **extra)

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        local = "" if settings.USE_TZ else ", 'localtime'"
        now = f"STRFTIME('%%%%Y-%%%%m-%%%%d %%%%H:%%%%M:%%%%f', 'now'{local})"
        return self.as_sql(compiler, connection, template=now, **extra)


def database_now(plus: timedelta | None = None) -> Any:
    """``DatabaseNow()``, plus ``plus``: an expression to write or compare with."""
    if not plus:
        return DatabaseNow()
    return models.ExpressionWrapper(DatabaseNow() + plus, output_field=models.DateTimeField())


class SupervisorQuerySet(models.QuerySet["Supervisor"]):
    """Which supervisors are alive: their last heartbeat is younger than the bound it
    declared (``heartbeat_expires_at``), by the database's clock unless given ``now``."""

    def alive(self, now: datetime | None = None) -> SupervisorQuerySet:
        return self.filter(stopped_at__isnull=True,
                           heartbeat_expires_at__gte=now or DatabaseNow())

    def dead(self, now: datetime | None = None) -> SupervisorQuerySet:
        """Stopped beating without saying they stopped: killed, crashed or cut off."""
        return self.filter(stopped_at__isnull=True,
                           heartbeat_expires_at__lt=now or DatabaseNow())

    def stopped(self) -> SupervisorQuerySet:
        return self.filter(stopped_at__isnull=False)

    def recent(self, within: timedelta = timedelta(days=1)) -> SupervisorQuerySet:
        return self.filter(last_heartbeat__gte=timezone.now() - within)

    def judged(self) -> SupervisorQuerySet:
        """Each row with the database's clock as it was read (``database_now``), which
        ``Supervisor.state()`` then judges it by, as ``alive()``/``dead()`` and the
        takeover of a dead supervisor's units do (``supervisor/takeover.py``)."""
        return self.annotate(database_now=DatabaseNow())


class Supervisor(models.Model):
    """One ``runworkers`` process, written by its own heartbeat (``HEARTBEAT_INTERVAL``)."""

    #: The supervisor's claimant id, the ``supervisor_id`` of the units it claims.
    id = models.UUIDField(primary_key=True)
    host = models.CharField(max_length=255)
    pid = models.IntegerField()
    started_at = models.DateTimeField()
    last_heartbeat = models.DateTimeField()
    #: Alive until then: the last heartbeat plus the lease (three missed heartbeats).
    heartbeat_expires_at = models.DateTimeField()
    #: Set when it stopped by itself; a supervisor that died never sets it.
    stopped_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    concurrency = models.PositiveIntegerField(default=0)
    #: Names of the workers it runs.
    workers = models.JSONField(default=list, blank=True)
    #: Task queues it runs: None for every queue, [] for none.
    queues = models.JSONField(null=True, blank=True)
    burst = models.BooleanField(default=False)
    #: What it ran at its last heartbeat: one mapping per unit (see supervisor.heartbeat).
    running = models.JSONField(default=list, blank=True)
    units_done = models.PositiveIntegerField(default=0)

    objects = SupervisorQuerySet.as_manager()

    class Meta:
        ordering = ["-last_heartbeat"]

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    def state(self, now: datetime | None = None) -> str:
        """``alive``, ``stopped`` or ``dead`` at ``now``; by default by the database's
        clock where the row was read with it (``judged()``), else this host's."""
        if self.stopped_at is not None:
            return "stopped"
        now = now or getattr(self, "database_now", None) or timezone.now()
        return "alive" if self.heartbeat_expires_at >= now else "dead"


class Dashboard(Supervisor):
    """No table: the admin's dashboard page hangs off this proxy so the index lists it."""

    class Meta:
        proxy = True
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"
