"""Duties that keep leases true: writes retried after an error, renewal, reaping."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from django.db import DatabaseError

from ...logs import log_event
from ...units.claimant import Claimant
from ...units.failures import FailureInfo
from .. import takeover, units
from ..units import Unit
from .base import Every, Periodic


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
    """The heartbeat every ``heartbeat`` seconds (``HEARTBEAT_INTERVAL``, at most a third of
    the lease; None: a third of the lease), and every third of a lease the renewal of every
    unit held here.

    Held units are found by this supervisor's id (``units.renew``): running or waiting in
    a child, or claimed ahead, whatever the main loop is doing. The supervisor runs this
    duty in its renewer thread (``supervisor/renewer.py``), on a connection of its own,
    never in the main loop's ``Duties``: no claim, sweep or prune can hold it up.

    Each run does one part, the beat first when both are due, and the renewer runs the
    duty while it is due, each run a transaction of its own: a renewal that waits in vain
    for a lock (or fails) takes no beat back with it, and is tried again without beating
    again. ``every`` is the beat's timer (the renewer's shortest wait), ``renewing`` the
    renewal's."""

    name = "renewal"

    def __init__(self, claimant: Claimant, lease: float, beat: Callable[[], None], *,
                 tasks: bool, heartbeat: float | None = None) -> None:
        super().__init__(lease / 3 if heartbeat is None else min(heartbeat, lease / 3))
        self.renewing = Every(lease / 3)
        self.claimant = claimant
        self.lease = lease
        self.beat = beat
        self.tasks = tasks

    def due(self, now: float) -> bool:
        return self.every.due(now) or self.renewing.due(now)

    def left(self, now: float) -> float:
        return min(self.every.left(now), self.renewing.left(now))

    def run(self, now: float) -> None:
        timer = self.every if self.every.due(now) else self.renewing
        timer.ran(now)
        try:
            if timer is self.every:
                self.beat()
            else:
                units.renew(self.claimant, self.lease, tasks=self.tasks)
        except DatabaseError:
            timer.again()
            raise


class Witness(Protocol):
    """The reaper's own supervisor's heartbeat (``supervisor/heartbeat.py``)."""

    #: Seconds between two beats.
    interval: float
    #: Whether silence tells death on this database (not SQLite: ``heartbeat.takes_over``).
    takes_over: bool

    def beating_for(self) -> float:
        """Seconds its beats have gone through without a break (0: not beating now)."""
        ...


class Reaping(Periodic):
    """Every third of a lease, at most 5 s (and at most a heartbeat interval, given the
    ``witness``): take back the units of supervisors that stopped beating (``takeover``),
    then release units whose lease expired (their supervisor died or lost the database),
    counting a crash.

    The first is the fast path: a supervisor silent past its bound (three heartbeat
    intervals) is dead, and its units come back at once, fenced by their tokens, without
    waiting for their leases; only with a ``witness`` that has been beating longer than
    that bound itself (not after an outage that silenced everyone), and only where silence
    tells death (not SQLite). The lease stays the last resort.

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
                 held: Callable[[], list[Unit]] | None = None,
                 witness: Witness | None = None) -> None:
        every = min(lease / 3, 5.0)
        super().__init__(every if witness is None else min(every, witness.interval))
        self.lease = lease
        self.max_crashes = max_crashes
        self.tasks = tasks
        self.spare = spare
        self.held = held
        self.witness = witness

    def work(self, now: float) -> None:
        if self.spare is not None and self.witness is not None:
            self.take_over(self.spare, self.witness)
        reaped = units.reap(self.max_crashes, tasks=self.tasks, spare=self.spare)
        if reaped:
            log_event(logging.WARNING, "reaped", units=reaped, reason="lease expired")
        if self.spare is not None and self.held is not None:
            lost = units.release_untracked(self.spare, self.held(), tasks=self.tasks)
            if lost:
                log_event(logging.WARNING, "released_untracked", units=lost,
                          reason="held in the database by this supervisor, not in memory")

    def take_over(self, spare: Claimant, witness: Witness) -> None:
        """Take back the units of the supervisors that are dead (silent past their bound
        while ``witness`` beat) or marked themselves stopped (``takeover``)."""
        beating = witness.beating_for()  # before the statement: never more than it was
        gone = [g for g in takeover.gone(spare.supervisor_id, 2 * self.lease,
                                         dead=witness.takes_over)
                # a dead one: only if seen long enough that the database took writes
                if g.stopped or beating > g.bound]
        if not gone:
            return
        for g, taken in takeover.take_back(gone, self.max_crashes, tasks=self.tasks).items():
            log_event(logging.WARNING, "reaped", units=taken,
                      reason="supervisor stopped" if g.stopped else "supervisor dead",
                      supervisor=str(g), silent_for=round(g.silent_for, 1))
