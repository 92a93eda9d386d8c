"""The snapshot in Prometheus' text exposition format (version 0.0.4); no client needed."""

from __future__ import annotations

from collections.abc import Iterator

from .snapshot import Snapshot, take

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: object) -> str:
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _sample(name: str, labels: dict[str, object], value: float) -> str:
    inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
    return f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}"


FAMILIES = {
    "dbworker_executions": "Executions by worker and status (pending: not claimed yet).",
    "dbworker_tasks": "Tasks by queue and status.",
    "dbworker_lag_seconds": "Seconds the oldest due waiting unit has waited (0: none).",
    "dbworker_completed": "Units completed in the last window (1m, 5m, 15m).",
    "dbworker_duration_seconds": "Run time of units completed in the last 15 minutes.",
    "dbworker_failed": "Units FAILED for good, by their last exception class.",
    "dbworker_supervisors": "Supervisors seen in the last day, by state.",
}


def _samples(snap: Snapshot) -> Iterator[tuple[str, dict[str, object], float]]:
    for kind, lines in (("worker", snap.workers), ("queue", snap.queues)):
        family = "dbworker_executions" if kind == "worker" else "dbworker_tasks"
        for line in lines:
            for status, n in line.counts.items():
                yield family, {kind: line.name, "status": status.lower()}, n
            yield "dbworker_lag_seconds", {kind: line.name}, line.lag_seconds or 0.0
            for window, n in line.throughput.items():
                yield "dbworker_completed", {kind: line.name, "window": window}, n
            if line.avg_seconds is not None:
                yield "dbworker_duration_seconds", {kind: line.name, "stat": "avg"}, \
                    line.avg_seconds
                yield "dbworker_duration_seconds", {kind: line.name, "stat": "max"}, \
                    line.max_seconds or 0.0
    for group in snap.failures:
        owner = {"worker": group["worker"]} if group["kind"] == "execution" else \
            {"task": group["task"], "queue": group["queue"]}
        yield "dbworker_failed", {**owner, "exception_class": group["exception_class"]}, \
            group["count"]
    for state, n in snap.supervisors.items():
        yield "dbworker_supervisors", {"state": state}, n


def render(snap: Snapshot | None = None) -> str:
    snap = snap or take()
    by_family: dict[str, list[str]] = {name: [] for name in FAMILIES}
    for family, labels, value in _samples(snap):
        by_family[family].append(_sample(family, labels, value))
    lines: list[str] = []
    for family, samples in by_family.items():
        lines += [f"# HELP {family} {FAMILIES[family]}", f"# TYPE {family} gauge", *samples]
    return "\n".join(lines) + "\n"
