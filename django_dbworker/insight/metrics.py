"""The snapshot as Prometheus metrics, through ``prometheus_client``.

``SnapshotCollector`` reads the database on every scrape (one ``take()``) and yields one
gauge family per name in ``FAMILIES``; ``registry()`` is a registry of our own (never the
library's global one), with the library's process, platform and gc collectors beside it
unless ``process=False``. ``render()`` writes the text format (version 0.0.4, the format
``generate_latest`` writes) and raises DatabaseError before writing anything when the
database cannot be read."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from . import horizon
from .snapshot import Snapshot, take

#: The text format ``generate_latest`` writes; the header the hand-written text had.
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4

FAMILIES = {
    "dbworker_executions": "Executions by worker and status (pending: not claimed yet).",
    "dbworker_tasks": "Tasks by queue and status.",
    "dbworker_lag_seconds": "Seconds the oldest due waiting unit has waited (0: none).",
    "dbworker_completed": "Units completed in the last window (1m, 5m, 15m).",
    "dbworker_duration_seconds": "Run time of units completed in the last 15 minutes.",
    "dbworker_failed": "Units FAILED for good, by their last exception class.",
    "dbworker_supervisors": "Supervisors seen in the last day, by state.",
    "dbworker_paused_since_seconds": "Unix time a paused worker or queue was paused "
                                     "(only paused ones have a sample).",
    "dbworker_oldest_transaction_seconds": "Seconds the oldest open transaction of another "
                                           "connection has run (0: none).",
    "dbworker_dead_rows": "Dead row versions of the units' tables (PostgreSQL).",
    "dbworker_history_list_length": "Row versions waiting for InnoDB's purge "
                                    "(MariaDB/MySQL).",
}


def _horizon_samples(found: dict[str, Any]) -> Iterator[tuple[str, dict[str, object], float]]:
    oldest = found.get("oldest_transaction")
    yield "dbworker_oldest_transaction_seconds", {}, oldest["seconds"] if oldest else 0.0
    for table, n in (found.get("dead_rows") or {}).items():
        yield "dbworker_dead_rows", {"table": table}, n
    if found.get("history_length") is not None:
        yield "dbworker_history_list_length", {}, found["history_length"]


def _samples(snap: Snapshot) -> Iterator[tuple[str, dict[str, object], float]]:
    for kind, lines in (("worker", snap.workers), ("queue", snap.queues)):
        family = "dbworker_executions" if kind == "worker" else "dbworker_tasks"
        for line in lines:
            for status, n in line.counts.items():
                yield family, {kind: line.name, "status": status.lower()}, n
            yield "dbworker_lag_seconds", {kind: line.name}, line.lag_seconds or 0.0
            for window, n in line.throughput.items():
                yield "dbworker_completed", {kind: line.name, "window": window}, n
            if line.paused_since is not None:
                yield "dbworker_paused_since_seconds", {kind: line.name}, \
                    line.paused_since.timestamp()
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


def families(snap: Snapshot, found: dict[str, Any] | None = None) -> list[Metric]:
    """One gauge family per name in FAMILIES, each present even without samples.

    Families differ in their labels from sample to sample (``worker`` or ``queue``), so
    samples are added with their own labels rather than through a fixed label list."""
    by_name = {name: GaugeMetricFamily(name, help_text) for name, help_text in FAMILIES.items()}
    samples = _samples(snap)
    if found is not None:  # ``horizon.read()``
        samples = itertools.chain(samples, _horizon_samples(found))
    for name, labels, value in samples:
        by_name[name].add_sample(name, {k: str(v) for k, v in labels.items()}, float(value))
    return list(by_name.values())


class SnapshotCollector(Collector):
    """The dbworker_* families, read from the database at each scrape."""

    def collect(self) -> Iterator[Metric]:
        yield from families(take(), horizon.read())

    def describe(self) -> Iterator[Metric]:
        # Names only, for the registry's duplicate check; registering reads no database.
        for name, help_text in FAMILIES.items():
            yield GaugeMetricFamily(name, help_text)


@functools.cache
def registry(*, process: bool = True) -> CollectorRegistry:
    """Our registry; ``process``: with the library's process_*, python_info and
    python_gc_* metrics, which describe the process that serves the scrape."""
    reg = CollectorRegistry()
    reg.register(SnapshotCollector())
    if process:
        # Instances of our own: the library's global registry is left alone.
        ProcessCollector(registry=reg)
        PlatformCollector(registry=reg)
        GCCollector(registry=reg)
    return reg


def render(*, process: bool = True) -> bytes:
    """The text exposition of a fresh snapshot (and of this process, unless told not)."""
    return generate_latest(registry(process=process))
