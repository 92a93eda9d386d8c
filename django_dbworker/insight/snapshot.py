"""Everything the dashboard and ``dbworker stats`` show, gathered at one instant."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from django.utils import timezone

from .. import conf
from ..models import Pause, Supervisor
from ..tasks import names
from . import counts, failures


@dataclass(slots=True, kw_only=True)
class Line:
    """One worker's or one queue's row of the dashboard."""

    name: str
    counts: dict[str, int]
    #: Seconds the oldest due unit has waited; None when nothing waits.
    lag_seconds: float | None
    #: Units completed in each of the last minutes, oldest first.
    per_minute: list[int]
    avg_seconds: float | None = None
    max_seconds: float | None = None
    #: When it was paused (``django_dbworker.pause``); None: it is not.
    paused_since: datetime | None = None

    def done(self, minutes: int) -> int:
        return sum(self.per_minute[-minutes:])

    @property
    def throughput(self) -> dict[str, int]:
        return {f"{m}m": self.done(m) for m in (1, 5, 15)}

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(slots=True, kw_only=True)
class Snapshot:
    at: datetime
    workers: list[Line]
    queues: list[Line]
    failures: list[dict[str, Any]]
    supervisors: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        def line(item: Line) -> dict[str, Any]:
            return {**asdict(item), "throughput": item.throughput}

        return {
            "at": self.at,
            "workers": [line(w) for w in self.workers],
            "queues": [line(q) for q in self.queues],
            "failures": self.failures,
            "supervisors": self.supervisors,
        }


def take(worker_names: list[str] | None = None, queue_names: list[str] | None = None) -> Snapshot:
    now = timezone.now()
    by_worker, by_queue = counts.execution_counts(), counts.task_counts()
    w_rate, q_rate = counts.execution_throughput(now), counts.task_throughput(now)
    w_time, q_time = counts.execution_durations(now), counts.task_durations(now)
    lags = counts.queue_lags(now)
    since = pauses_since()
    empty = [0] * counts.MINUTES
    wanted_workers = worker_names if worker_names is not None else sorted(
        set(names.worker_names(stored=False)) | set(by_worker))
    wanted_queues = queue_names if queue_names is not None else sorted(
        set(names.configured_queues()) | set(by_queue))
    workers = [
        Line(name=n, counts=by_worker.get(n) or counts.empty_execution_counts(),
             lag_seconds=counts.worker_lag(n, now), per_minute=w_rate.get(n, empty),
             avg_seconds=w_time.get(n, {}).get("avg_seconds"),
             max_seconds=w_time.get(n, {}).get("max_seconds"),
             paused_since=since.get(f"worker:{n}"))
        for n in wanted_workers
    ]
    queues = [
        Line(name=q, counts=by_queue.get(q) or counts.empty_task_counts(),
             lag_seconds=lags.get(q), per_minute=q_rate.get(q, empty),
             avg_seconds=q_time.get(q, {}).get("avg_seconds"),
             max_seconds=q_time.get(q, {}).get("max_seconds"),
             paused_since=since.get(f"queue:{q}"))
        for q in wanted_queues
    ]
    groups = failures.grouped()
    if worker_names is not None or queue_names is not None:
        groups = [g for g in groups
                  if g.get("worker") in wanted_workers or g.get("queue") in wanted_queues]
    return Snapshot(at=now, workers=workers, queues=queues, failures=groups,
                    supervisors=supervisor_counts())


def pauses_since() -> dict[str, datetime]:
    """``{"queue:<name>" or "worker:<name>": paused_at}`` of every pause (a small table)."""
    rows = Pause.objects.using(conf.get().DATABASE).values_list("kind", "name", "paused_at")
    return {f"{kind}:{name}": at for kind, name, at in rows}


def supervisor_counts() -> dict[str, int]:
    """Alive and dead by the database's clock, as a dead supervisor's units are taken back
    (``supervisor/takeover.py``)."""
    rows = Supervisor.objects.using(conf.get().DATABASE).recent()
    return {
        "alive": rows.alive().count(),
        "dead": rows.dead().count(),
        "stopped": rows.stopped().count(),
    }
