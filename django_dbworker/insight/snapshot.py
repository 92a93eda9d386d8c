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
    #: Statuses whose count stopped at ``counts.CAP``: at least that many (sorted).
    at_least: list[str] = field(default_factory=list)

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


def take(worker_names: list[str] | None = None, queue_names: list[str] | None = None, *,
         exact: bool = False) -> Snapshot:
    """What the queues hold now, each read bounded (``counts``); ``exact``: counts by a
    GROUP BY over the whole tables instead, as before 0.1.0 (slow on large tables)."""
    now = timezone.now()
    w_rate, q_rate = counts.execution_throughput(now), counts.task_throughput(now)
    w_time, q_time = counts.execution_durations(now), counts.task_durations(now)
    since = pauses_since()
    empty = [0] * counts.MINUTES
    if exact:
        by_worker, by_queue = counts.execution_counts(), counts.task_counts()
    else:
        history = counts.task_history()
    wanted_workers = worker_names if worker_names is not None else sorted(
        set(names.worker_names(stored=False)) | set(w_rate)
        | set(by_worker if exact else counts.stored_workers()))
    wanted_queues = queue_names if queue_names is not None else sorted(
        set(names.configured_queues()) | set(q_rate)
        | set(by_queue if exact else counts.waiting_queues()))

    def counted(name: str, kind: str) -> counts.Counted:
        if exact:
            found = (by_worker if kind == "worker" else by_queue).get(name)
            return counts.Counted(found or (counts.empty_execution_counts() if kind == "worker"
                                            else counts.empty_task_counts()))
        return counts.worker_counts(name) if kind == "worker" else \
            counts.queue_counts(name, history=history)

    def line(name: str, kind: str) -> Line:
        rate, took = (w_rate, w_time) if kind == "worker" else (q_rate, q_time)
        found = counted(name, kind)
        lag = counts.worker_lag(name, now) if kind == "worker" else \
            counts.queue_lag(name, now)
        return Line(name=name, counts=found.counts, lag_seconds=lag,
                    per_minute=rate.get(name, empty),
                    avg_seconds=took.get(name, {}).get("avg_seconds"),
                    max_seconds=took.get(name, {}).get("max_seconds"),
                    paused_since=since.get(f"{kind}:{name}"),
                    at_least=sorted(found.at_least))

    workers = [line(n, "worker") for n in wanted_workers]
    queues = [line(q, "queue") for q in wanted_queues]
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
