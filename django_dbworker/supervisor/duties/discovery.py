"""Discovery: the passes that find eligible rows written without ``save()``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.db import connections

from ... import conf
from ...logs import log_event
from ...rows.sweep import Sweeper
from .base import Every


class Discovery:
    """Every ``SWEEP_INTERVAL`` a pass starts for every worker (``Sweeper.restart``):
    while its urgent work lasts (rows above the watermark; a full pass that is a source's
    only discovery), each round takes one chunk of it per worker, so claims go on between
    chunks. A full pass that nothing waits for takes a paced chunk a round
    (``Sweeper.background``).

    ``sweeping``: the workers whose urgent work is not over (the supervisor polls at once
    while it lasts, and ``--burst`` waits for it). ``paused(name, now)``: whether a worker
    is left alone after a failure; ``failed(name, exc, raw)``: what a failed step does
    (the supervisor's broken-source pause, which raises a lost connection), ``raw`` the
    DB-API connection the step began on: a session the server ended mid-step is an outage
    even where leaving the step's ``atomic()`` opened a new connection, which answers.
    """

    name = "discovery"

    def __init__(self, sweepers: list[Sweeper], interval: float,
                 paused: Callable[[str, float], bool],
                 failed: Callable[[str, Exception, object], None]) -> None:
        self.sweepers = sweepers
        self.every = Every(interval)
        self.paused = paused
        self.failed = failed
        #: Indexes of the sweepers whose urgent work is not over.
        self.sweeping: set[int] = set()
        #: When the last pass started (the clock of ``run``; 0.0 before the first).
        self.started = 0.0

    def due(self, now: float) -> bool:
        return (bool(self.sweeping) or self.every.due(now)
                or any(s.full_phase for s in self.sweepers))

    def left(self, now: float) -> float:
        """Seconds until discovery has work: none while a pass's urgent work lasts, else
        until the next paced step of a full pass or the next pass."""
        if self.sweeping:
            return 0.0
        waits = [self.every.left(now)]
        waits += [w for s in self.sweepers if (w := s.next_step_in(now)) is not None]
        return max(0.0, min(waits))

    def start(self, now: float) -> None:
        """Start a pass now (``--burst`` does, before it stops: rows may have been written
        since the last one); the next one an interval later."""
        for sweeper in self.sweepers:
            sweeper.restart()
        self.sweeping = set(range(len(self.sweepers)))
        self.started = now
        self.every.ran(now)

    def run(self, now: float) -> None:
        if self.every.due(now):
            self.start(now)
        for i, sweeper in enumerate(self.sweepers):
            if self.paused(sweeper.worker.name, now):
                continue
            raw = connections[conf.get().DATABASE].connection
            try:
                if i in self.sweeping:
                    added, done = sweeper.step(now)
                    if done:
                        self.sweeping.discard(i)
                else:
                    added = sweeper.background(now)
            except Exception as exc:
                self.failed(sweeper.worker.name, exc, raw)
                continue
            if added:
                log_event(logging.INFO, "swept", worker=sweeper.worker.name, added=added)
