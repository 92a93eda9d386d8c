"""Duties that keep leases true: writes retried after an error, renewal, reaping."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ...logs import log_event
from ...rows.store import Claimant, FailureInfo
from .. import units
from ..units import Unit
from .base import Periodic


class Retries:
    """Releases and unclaims that failed on the database, retried every round until
    they go through, before anything else (in order; one release at a time, so what went
    through is not written again)."""

    name = "retries"

    def __init__(self, max_crashes: int) -> None:
        self.max_crashes = max_crashes
        #: Units to release, with the crash to count (None: released without one).
        self.releases: list[tuple[Unit, FailureInfo | None]] = []
        #: Units claimed ahead that never ran, to give back.
        self.unclaims: list[Unit] = []

    def due(self, now: float) -> bool:
        return bool(self.releases or self.unclaims)

    def run(self, now: float) -> None:
        self.release_all()
        if self.unclaims:
            units.unclaim(self.unclaims)
            self.unclaims.clear()

    def release_all(self) -> None:
        while self.releases:
            c, crashed = self.releases[0]
            units.release(c, crashed=crashed, max_crashes=self.max_crashes)
            self.releases.pop(0)


class Renewal(Periodic):
    """Every third of a lease: renew the lease of every unit held here (running, waiting
    in a child, claimed ahead) in one statement per kind, then beat the heartbeat."""

    name = "renewal"

    def __init__(self, claimant: Claimant, lease: float, held: Callable[[], list[Unit]],
                 beat: Callable[[], None]) -> None:
        super().__init__(lease / 3)
        self.claimant = claimant
        self.lease = lease
        self.held = held
        self.beat = beat

    def work(self, now: float) -> None:
        units.renew(self.claimant, self.held(), self.lease)
        self.beat()


class Reaping(Periodic):
    """Every third of a lease, at most 5 s: release units whose lease expired (their
    supervisor died or lost the database), counting a crash."""

    name = "reaping"

    def __init__(self, lease: float, max_crashes: int, *, tasks: bool) -> None:
        super().__init__(min(lease / 3, 5.0))
        self.max_crashes = max_crashes
        self.tasks = tasks

    def work(self, now: float) -> None:
        reaped = units.reap(self.max_crashes, tasks=self.tasks)
        if reaped:
            log_event(logging.WARNING, "reaped", units=reaped, reason="lease expired")
