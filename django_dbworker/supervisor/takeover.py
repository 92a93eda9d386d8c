"""The units of a supervisor that stopped beating, taken back before their leases expire.

A supervisor beats its heartbeat every ``HEARTBEAT_INTERVAL`` (``heartbeat.py``); one whose
last beat is older than the bound it declared with it (``heartbeat_expires_at``: three
intervals, 6 s by default) is dead (its process or its host is gone, or it is cut off from
the database). Its units need not wait out their leases (30 s): the reaper of any other
supervisor (``duties.leases.Reaping``) takes them back at once, in two steps:

1. ``gone``: the few supervisors, other than its own, that are dead or marked themselves
   stopped, and beat within the last two leases (older ones' leases have expired: the
   lease reaper's), from the small ``Supervisor`` table, by the database's clock. One
   statement; usually no row.
2. ``take_back``: the units they still hold, WORKING (RUNNING) with one of their ids, read
   (one statement per kind) through the index renewal reads (``dbworker_execution_working``,
   ``dbworker_task_running``: the units in flight, never the history), each released
   fenced by its token exactly as the lease reaper releases: a crash counted
   (``LeaseLost``, naming the supervisor and how long it was silent), FAILED at
   ``MAX_CRASHES``. A supervisor that is alive after all (paused, cut off) and comes back
   cannot commit them: its token no longer matches. One that marked itself stopped left
   them behind when giving them back failed: they go back without a crash, as its own
   shutdown would have given them.

Silence is death only where the reaper's own supervisor has been beating for longer than
the dead one's bound (``Heartbeat.beating_for``): after an outage that silenced every
supervisor (a restart, a failover), everyone's last beat is old, and the others come back
within an interval or two; a reaper waits until it has seen the database take its own beats
for that long. The lease stays the last resort: a supervisor with no row (not beating yet)
and one that died during such an outage are left to it.

Not on SQLite (``heartbeat.takes_over``): a write transaction there holds up every other
connection's heartbeat, so silence does not tell death; the lease does. A stopped
supervisor's units go back there too.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta

from django.db.models import Q

from .. import conf
from ..models import Supervisor, database_now
from ..units.failures import FailureInfo
from . import units

LEASE_LOST = "django_dbworker.exceptions.LeaseLost"


@dataclass(frozen=True, slots=True)
class Gone:
    """A supervisor that stopped beating or marked itself stopped."""

    supervisor_id: uuid.UUID
    host: str
    pid: int
    stopped: bool
    #: Seconds since its last beat, by the database's clock.
    silent_for: float
    #: The silence after which it is dead, as it declared it (``heartbeat_expires_at`` -
    #: ``last_heartbeat``; a supervisor of an older version declared its lease).
    bound: float

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    def crash(self) -> FailureInfo | None:
        """What its units' release counts: a crash for a dead one, none for a stopped one."""
        if self.stopped:
            return None
        return FailureInfo(
            LEASE_LOST,
            f"the supervisor running this unit, {self}, stopped beating its heartbeat "
            f"{self.silent_for:.1f} s before another took the unit back (its process or "
            "its host gone, or cut off from the database); if it comes back it cannot "
            "record the unit: its claim's token no longer matches")


def gone(spare: uuid.UUID, within: float, *, dead: bool) -> list[Gone]:
    """The supervisors other than ``spare`` that marked themselves stopped or, with
    ``dead``, are dead, and beat within ``within`` seconds (by the database's clock)."""
    now = database_now()
    left = Q(stopped_at__isnull=False)
    if dead:
        left |= Q(heartbeat_expires_at__lt=now)
    rows = (Supervisor.objects.using(conf.get().DATABASE)
            .filter(left, last_heartbeat__gte=database_now(-timedelta(seconds=within)))
            .exclude(pk=spare)
            .annotate(database_now=now)
            .values_list("pk", "host", "pid", "stopped_at", "last_heartbeat",
                         "heartbeat_expires_at", "database_now"))
    return [Gone(pk, host, pid, stopped_at is not None,
                 silent_for=(at - last).total_seconds(),
                 bound=(expires - last).total_seconds())
            for pk, host, pid, stopped_at, last, expires, at in rows]


def take_back(gone: list[Gone], max_crashes: int, *, tasks: bool) -> dict[Gone, int]:
    """Release the units the ``gone`` supervisors hold (tasks too when ``tasks``), fenced
    by their tokens: one read per kind for all of them. How many went back, by holder."""
    holders = {g.supervisor_id: g.crash() for g in gone}
    taken = units.reap_held(holders, max_crashes, tasks=tasks)
    return {g: taken[g.supervisor_id] for g in gone if taken[g.supervisor_id]}
