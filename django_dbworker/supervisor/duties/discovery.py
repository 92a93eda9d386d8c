"""Discovery: the sweep that finds eligible rows written without ``save()``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...logs import log_event
from ...rows.pending import Sweeper
from .base import Every


class Discovery:
    """Every ``SWEEP_INTERVAL`` a pass starts over every worker's source rows; while it
    lasts, each round sweeps one chunk per worker (``Sweeper.step``), so a pass costs a
    round a chunk and claims go on between chunks.

    ``paused(name, now)``: whether a worker is left alone after a failure; ``failed(name,
    exc)``: what a failed step does (the supervisor's broken-source pause, which raises a
    lost connection).
    """

    name = "discovery"

    def __init__(self, sweepers: list[Sweeper], interval: float,
                 paused: Callable[[str, float], bool],
                 failed: Callable[[str, Exception], None]) -> None:
        self.sweepers = sweepers
        self.every = Every(interval)
        self.paused = paused
        self.failed = failed
        #: Indexes of the sweepers whose pass is not over.
        self.sweeping: set[int] = set()
        #: When the last pass started (the clock of ``run``; 0.0 before the first).
        self.started = 0.0

    def due(self, now: float) -> bool:
        return bool(self.sweeping) or self.every.due(now)

    def start(self, now: float) -> None:
        """Start a pass now (``--burst`` does, before it stops: rows may have become
        eligible since the last one); the next one an interval later."""
        self.sweeping = set(range(len(self.sweepers)))
        self.started = now
        self.every.ran(now)

    def run(self, now: float) -> None:
        if self.every.due(now):
            self.start(now)
        for i in list(self.sweeping):
            sweeper = self.sweepers[i]
            if self.paused(sweeper.worker.name, now):
                continue
            try:
                added, done = sweeper.step()
            except Exception as exc:
                self.failed(sweeper.worker.name, exc)
                continue
            if added:
                log_event(logging.INFO, "swept", worker=sweeper.worker.name, added=added)
            if done:
                self.sweeping.discard(i)
