"""Counts by status, lag, throughput and durations, per worker and per queue.

Every read is bounded, whatever the size of the tables and whether or not they were
ANALYZEd: the counts stop at ``CAP`` (a status that reaches it is *at least* that many,
named in ``Counted.at_least``); the lag is read at the head of the claim order through
the claim index (one row); throughput and durations read the last ``MINUTES`` only.
``exact_counts`` is the old GROUP BY over the whole tables (``dbworker stats --exact``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.db.models import Count, F, Q, QuerySet

from .. import conf
from ..db.connections import index_first
from ..db.partial import InStates
from ..models import SETTLED, TASK_FINISHED, Execution, State, TaskRecord, TaskStatus
from ..rows.queries import candidates
from ..rows.registry import workers
from .sql import SecondsBetween

#: Counts stop here: above it a status is shown as "at least CAP" (``Counted.at_least``).
CAP = 10_000
#: At most this many queues with waiting tasks are found beyond the configured ones.
MAX_QUEUES = 100
#: Minutes of throughput history, one bucket a minute, oldest first.
MINUTES = 15


def _alias() -> str:
    return conf.get().DATABASE


def empty_execution_counts() -> dict[str, int]:
    return dict.fromkeys(State.values, 0)


def empty_task_counts() -> dict[str, int]:
    return dict.fromkeys(TaskStatus.values, 0)


@dataclass(slots=True)
class Counted:
    """Counts by status of one worker or queue; ``at_least``: statuses whose count is a
    lower bound (the count stopped at ``CAP``)."""

    counts: dict[str, int]
    at_least: set[str] = field(default_factory=set)


def _capped(parts: Iterable[tuple[QuerySet[Any], str, tuple[str, ...]]],
            empty: dict[str, int], cap: int) -> Counted:
    """Each part: a queryset served by one index, its status column and the statuses it
    holds; at most ``cap`` rows of each are read (one statement a part)."""
    counted = Counted(dict(empty))
    for qs, column, statuses in parts:
        inner = qs.values(column)[:cap]
        sql, params = inner.query.sql_with_params()
        connection = connections[qs.db]
        name = connection.ops.quote_name(column)
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {name}, COUNT(*) FROM ({sql}) capped GROUP BY {name}",
                           params)
            rows = cursor.fetchall()
        for status, n in rows:
            counted.counts[status] = n
        if sum(n for _, n in rows) >= cap:
            counted.at_least |= set(statuses)
    return counted


def worker_counts(name: str, cap: int = CAP) -> Counted:
    """One worker's executions by state, each part through its own index."""
    qs = Execution.objects.using(_alias()).filter(worker=name)
    return _capped([
        (qs.claimable(), "state", (State.PENDING, State.UNFINISHED)),
        (qs.working(), "state", (State.WORKING,)),
        # The history through ``dbworker_execution_settled`` (state, worker, id): only
        # this worker's rows of that state are read, at most CAP. The settled set is
        # named too, so MariaDB reads that index through its flag.
        (qs.finished().filter(InStates("state", SETTLED)).order_by("state", "worker", "id"),
         "state", (State.FINISHED,)),
        (qs.failed().filter(InStates("state", SETTLED)).order_by("state", "worker", "id"),
         "state", (State.FAILED,)),
    ], empty_execution_counts(), cap)


def queue_counts(name: str, cap: int = CAP, history: Counted | None = None) -> Counted:
    """One queue's tasks by status, each part through its own index; the finished ones
    from ``history`` (``task_history()``: one read for every queue)."""
    qs = TaskRecord.objects.using(_alias()).filter(queue_name=name)
    counted = _capped([
        (qs.ready().in_queues([name]), "status", (TaskStatus.READY, TaskStatus.RETRYING)),
        (qs.running(), "status", (TaskStatus.RUNNING,)),
        (qs.filter(status=TaskStatus.WAITING).order_by("workflow_id"), "status",
         (TaskStatus.WAITING,)),
    ], empty_task_counts(), cap)
    history = task_history(cap) if history is None else history
    for status in TASK_FINISHED:
        counted.counts[status] = history.counts.get(f"{name}:{status}", 0)
    if history.at_least:
        counted.at_least |= set(TASK_FINISHED)
    return counted


def task_history(cap: int = CAP) -> Counted:
    """The newest ``cap`` finished tasks (``dbworker_task_finished`` in its order) by
    ``"<queue>:<status>"``: exact while fewer finished, else lower bounds (``at_least``:
    every finished status). A queue has no index over its history, so one read of the
    newest serves every queue."""
    inner = (TaskRecord.objects.using(_alias()).finished().order_by("-finished_at")
             .values("queue_name", "status")[:cap])
    sql, params = inner.query.sql_with_params()
    connection = connections[inner.db]
    q, s = (connection.ops.quote_name(c) for c in ("queue_name", "status"))
    # Newest first through the index: a planner without statistics sorted every finished
    # task instead (0.2 s at 500,000).
    with index_first(inner.db, ordered=True), connection.cursor() as cursor:
        cursor.execute(f"SELECT {q}, {s}, COUNT(*) FROM ({sql}) newest GROUP BY {q}, {s}",
                       params)
        rows = cursor.fetchall()
    counted = Counted({f"{queue}:{status}": n for queue, status, n in rows})
    if sum(n for *_, n in rows) >= cap:
        counted.at_least = set(TASK_FINISHED)
    return counted


def execution_counts() -> dict[str, dict[str, int]]:
    """Exact counts of every worker's executions by state: a GROUP BY over the whole
    table (``dbworker stats --exact``); the bounded reads are ``worker_counts``."""
    counts: dict[str, dict[str, int]] = defaultdict(empty_execution_counts)
    rows = Execution.objects.using(_alias()).values("worker", "state").annotate(n=Count("id"))
    for row in rows.order_by():
        counts[row["worker"]][row["state"]] = row["n"]
    return dict(counts)


def task_counts() -> dict[str, dict[str, int]]:
    """Exact counts of every queue's tasks by status (see ``execution_counts``)."""
    counts: dict[str, dict[str, int]] = defaultdict(empty_task_counts)
    rows = TaskRecord.objects.using(_alias()).values("queue_name", "status").annotate(
        n=Count("id"))
    for row in rows.order_by():
        counts[row["queue_name"]][row["status"]] = row["n"]
    return dict(counts)


def stored_workers() -> list[str]:
    """Workers with executions, a skip scan of the unique index (worker, source_id): one
    short read a worker, never the whole table."""
    found: list[str] = []
    qs = Execution.objects.using(_alias()).order_by("worker", "source_id")
    while True:
        step = qs.filter(worker__gt=found[-1]) if found else qs
        name = step.values_list("worker", flat=True).first()
        if name is None:
            return found
        found.append(name)


def waiting_queues() -> list[str]:
    """Queues with a task waiting (READY or RETRYING), a skip scan of the claim index
    (``dbworker_task_claimable``): one short read a queue, at most ``MAX_QUEUES``."""
    found: list[str] = []
    qs = TaskRecord.objects.using(_alias()).ready().order_by("queue_name", "-priority",
                                                             "available_at")
    while len(found) < MAX_QUEUES:
        step = qs.filter(queue_name__gt=found[-1]) if found else qs
        name = step.values_list("queue_name", flat=True).first()
        if name is None:
            break
        found.append(name)
    return found


def _lag(oldest: datetime | None, now: datetime) -> float | None:
    return None if oldest is None else max((now - oldest).total_seconds(), 0.0)


def worker_lag(name: str, now: datetime) -> float | None:
    """Seconds the unit the next claim of ``name`` takes has waited; None if none waits.

    The head of the claim order (eligible's order, only eligible rows, one row read
    through the claim index as the claim reads it), not the oldest of all waiting units:
    an aggregate over every waiting unit is what made this slow. A unit waits from when
    it became claimable: its row was saved or swept, or its ``Unfinished(delay=...)`` ran
    out."""
    using = _alias()
    worker = workers.get(name)
    qs: Any = None
    if worker is not None:
        try:
            qs = candidates(worker, now, using)
        except Exception:  # a broken eligible is reported by check E003 and the supervisor
            qs = None
    if qs is None:  # a stored name without a declaration: its claim index order
        qs = (Execution.objects.using(using).claimable(now).filter(worker=name)
              .order_by("sort_key", "source_id"))
    return _lag(qs.values_list("available_at", flat=True).first(), now)


def queue_lag(name: str, now: datetime) -> float | None:
    """Seconds the task the next claim of queue ``name`` takes has waited (the head of
    ``-priority, available_at``, one row of the claim index); None if none is due."""
    qs = (TaskRecord.objects.using(_alias()).ready(now).in_queues([name])
          .order_by("-priority", "available_at"))
    return _lag(qs.values_list("available_at", flat=True).first(), now)


def queue_lags(now: datetime, names: Iterable[str] | None = None) -> dict[str, float]:
    """``queue_lag`` of each queue named (default: those with a task waiting), only those
    with a due task."""
    lags = {q: queue_lag(q, now) for q in (waiting_queues() if names is None else names)}
    return {q: lag for q, lag in lags.items() if lag is not None}


def _per_minute(qs: Any, group: str, now: datetime) -> dict[str, list[int]]:
    start = now - timedelta(minutes=MINUTES)
    buckets = {
        f"m{i}": Count("pk", filter=Q(
            finished_at__gte=start + timedelta(minutes=i),
            finished_at__lt=start + timedelta(minutes=i + 1)))
        for i in range(MINUTES)
    }
    rows = qs.filter(finished_at__gte=start, finished_at__lt=now).values(group) \
        .annotate(**buckets).order_by()
    return {r[group]: [r[f"m{i}"] for i in range(MINUTES)] for r in rows}


def execution_throughput(now: datetime) -> dict[str, list[int]]:
    """Units completed (any outcome) per worker in each of the last minutes, oldest first.

    An execution keeps only its latest completion, so a unit that returned Unfinished()
    several times counts once, in its latest minute.
    """
    return _per_minute(Execution.objects.using(_alias()), "worker", now)


def task_throughput(now: datetime) -> dict[str, list[int]]:
    """Tasks that reached SUCCESSFUL, FAILED or CANCELLED per queue and minute."""
    return _per_minute(TaskRecord.objects.using(_alias()).finished(), "queue_name", now)


def _durations(qs: Any, group: str, started: str, now: datetime,
               cap: int = CAP) -> dict[str, dict[str, float]]:
    """Run times of the newest ``cap`` completions of the last ``MINUTES`` (all of them
    below ``cap``): read newest first through the ``finished_at`` index, so a million
    completions in the window cost what ten thousand do (they took 0.14-0.3 s)."""
    took = SecondsBetween(F(started), F("finished_at"))
    # Bounded on both sides: a range the planner reads through the index without
    # statistics (an open one it guesses covers a third of the table).
    inner = (qs.filter(finished_at__gte=now - timedelta(minutes=MINUTES), finished_at__lte=now,
                       **{f"{started}__isnull": False})
             .annotate(took=took).order_by("-finished_at").values(group, "took")[:cap])
    sql, params = inner.query.sql_with_params()
    connection = connections[inner.db]
    g, t = (connection.ops.quote_name(c) for c in (group, "took"))
    with index_first(inner.db, ordered=True), connection.cursor() as cursor:
        cursor.execute(f"SELECT {g}, COUNT(*), MAX({t}), SUM({t}) FROM ({sql}) newest "
                       f"GROUP BY {g}", params)
        rows = cursor.fetchall()
    return {
        name: {
            "count": n,
            "avg_seconds": max(float(total or 0) / n, 0.0) if n else 0.0,
            "max_seconds": max(float(longest or 0), 0.0),
        }
        for name, n, longest, total in rows
    }


def execution_durations(now: datetime) -> dict[str, dict[str, float]]:
    """Run time of the latest attempt of units completed in the last minutes (the newest
    ``CAP`` of them), per worker."""
    return _durations(Execution.objects.using(_alias()), "worker", "started_at", now)


def task_durations(now: datetime) -> dict[str, dict[str, float]]:
    """Run time of the last attempt of tasks finished in the last minutes (the newest
    ``CAP`` of them), per queue."""
    return _durations(TaskRecord.objects.using(_alias()).finished(), "queue_name",
                      "last_attempted_at", now)
