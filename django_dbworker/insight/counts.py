"""Counts by status, lag, throughput and durations, per worker and per queue.

The counts and throughput read the whole history of the tables (a GROUP BY); the lag reads
only the waiting units. Keep the dashboard's and the metrics' refresh rates modest on very
large tables.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Min, OuterRef, Q

from .. import conf
from ..db import keys
from ..models import Execution, State, TaskRecord, TaskStatus
from ..rows.queries import Probe
from ..rows.registry import workers

#: Minutes of throughput history, one bucket a minute, oldest first.
MINUTES = 15


def _alias() -> str:
    return conf.get().DATABASE


def empty_execution_counts() -> dict[str, int]:
    return dict.fromkeys(State.values, 0)


def empty_task_counts() -> dict[str, int]:
    return dict.fromkeys(TaskStatus.values, 0)


def execution_counts() -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(empty_execution_counts)
    rows = Execution.objects.using(_alias()).values("worker", "state").annotate(n=Count("id"))
    for row in rows.order_by():
        counts[row["worker"]][row["state"]] = row["n"]
    return dict(counts)


def task_counts() -> dict[str, dict[str, int]]:
    counts: dict[str, dict[str, int]] = defaultdict(empty_task_counts)
    rows = TaskRecord.objects.using(_alias()).values("queue_name", "status").annotate(
        n=Count("id"))
    for row in rows.order_by():
        counts[row["queue_name"]][row["status"]] = row["n"]
    return dict(counts)


def worker_lag(name: str, now: datetime) -> float | None:
    """Seconds the oldest due, eligible waiting unit of ``name`` has waited; None if none.

    A unit waits from when it became claimable: its row was saved or swept, or its
    ``Unfinished(delay=...)`` ran out. Rows the worker's ``eligible`` excludes do not count.
    """
    qs = Execution.objects.using(_alias()).claimable(now).filter(worker=name)
    worker = workers.get(name)
    if worker is not None:
        try:
            eligible = worker.eligible_queryset().order_by()
        except Exception:  # a broken eligible is reported by check E003 and the supervisor
            eligible = None
        if eligible is not None:
            pk = keys.pk_expression(worker.source, OuterRef("source_id"))
            qs = qs.filter(Probe(eligible.filter(pk=pk)))
    oldest = qs.aggregate(oldest=Min("available_at"))["oldest"]
    return None if oldest is None else max((now - oldest).total_seconds(), 0.0)


def queue_lags(now: datetime) -> dict[str, float]:
    """Seconds the oldest due task of each queue has waited (queues with one waiting)."""
    rows = (TaskRecord.objects.using(_alias())
            .ready(now)
            .values("queue_name").annotate(oldest=Min("available_at")).order_by())
    return {r["queue_name"]: max((now - r["oldest"]).total_seconds(), 0.0) for r in rows}


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
    return _per_minute(TaskRecord.objects.using(_alias()), "queue_name", now)


def _durations(qs: Any, group: str, started: str, now: datetime) -> dict[str, dict[str, float]]:
    took = ExpressionWrapper(F("finished_at") - F(started), output_field=DurationField())
    rows = (qs.filter(finished_at__gte=now - timedelta(minutes=MINUTES),
                      **{f"{started}__isnull": False})
            .annotate(took=took).values(group)
            .annotate(n=Count("pk"), longest=Max("took"), total=_sum("took")).order_by())
    result = {}
    for r in rows:
        total, longest = r["total"], r["longest"]
        result[r[group]] = {
            "count": r["n"],
            "avg_seconds": _seconds(total) / r["n"] if r["n"] else 0.0,
            "max_seconds": _seconds(longest),
        }
    return result


def _sum(name: str) -> Any:
    from django.db.models import Sum

    return Sum(name, output_field=DurationField())


def _seconds(value: Any) -> float:
    if value is None:
        return 0.0
    if isinstance(value, timedelta):
        return max(value.total_seconds(), 0.0)
    return max(float(value) / 1_000_000, 0.0)  # microseconds, as SQLite sums them


def execution_durations(now: datetime) -> dict[str, dict[str, float]]:
    """Run time of the latest attempt of units completed in the last minutes, per worker."""
    return _durations(Execution.objects.using(_alias()), "worker", "started_at", now)


def task_durations(now: datetime) -> dict[str, dict[str, float]]:
    """Run time of the last attempt of tasks finished in the last minutes, per queue."""
    return _durations(TaskRecord.objects.using(_alias()), "queue_name", "last_attempted_at",
                      now)
