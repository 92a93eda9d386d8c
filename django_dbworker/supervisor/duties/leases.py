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
    """Every third of a lease: renew the lease of every unit held here, then beat the
    heartbeat.

    Held units are found by this supervisor's id (``units.renew``): running or waiting in
    a child, or claimed ahead, whatever the main loop is doing. The supervisor runs this
    duty in its renewer thread (``supervisor/renewer.py``), on a connection of its own,
    never in the main loop's ``Duties``: no claim, sweep or prune can hold it up."""

    name = "renewal"

    def __init__(self, claimant: Claimant, lease: float, beat: Callable[[], None], *,
                 tasks: bool) -> None:
        super().__init__(lease / 3)
        self.claimant = claimant
        self.lease = lease
        self.beat = beat
        self.tasks = tasks

    def work(self, now: float) -> None:
        units.renew(self.claimant, self.lease, tasks=self.tasks)
        self.beat()


class Reaping(Periodic):
    """Every third of a lease, at most 5 s: release units whose lease expired (their
    supervisor died or lost the database), counting a crash.

    Never those of its own supervisor (``spare``): it knows where they are, and releases
    them itself when their child exits. On SQLite a renewal waits while another connection
    holds the write lock (a long claim, a transactional handler), so a lease of a healthy
    supervisor can lapse there; its own reaper must not take such units back. Instead, the
    units its supervisor holds in the database but not in memory (``held``: a claim whose
    answer was lost) go back, not as a crash (``units.release_untracked``): renewal finds
    units by the supervisor's id and would keep them forever."""

    name = "reaping"

    def __init__(self, lease: float, max_crashes: int, *, tasks: bool,
                 spare: Claimant | None = None,
                 held: Callable[[], list[Unit]] | None = None) -> None:
        super().__init__(min(lease / 3, 5.0))
        self.max_crashes = max_crashes
        self.tasks = tasks
        self.spare = spare
        self.held = held

    def work(self, now: float) -> None:
        reaped = units.reap(self.max_crashes, tasks=self.tasks, spare=self.spare)
        if reaped:
            log_event(logging.WARNING, "reaped", units=reaped, reason="lease expired")
        if self.spare is not None and self.held is not None:
            lost = units.release_untracked(self.spare, self.held(), tasks=self.tasks)
            if lost:
                log_event(logging.WARNING, "released_untracked", units=lost,
                          reason="held in the database by this supervisor, not in memory")
