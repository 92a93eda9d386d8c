"""The supervisor's row in ``Supervisor``: who runs, where, since when, and what.

One UPDATE per heartbeat (an INSERT the first time), every ``HEARTBEAT_INTERVAL`` (at most
a third of the lease), from the renewer thread (``renewer.py``), committed on its own: no
claim, and no renewal that waits for a lock, holds it up. The row says ``alive`` while
``heartbeat_expires_at`` (the last beat plus ``MISSED_BEATS`` intervals: ``bound``) is
ahead, and ``stopped`` once the supervisor marks it on its way out, after that thread was
joined. A supervisor that dies leaves it to go stale: ``dead``, and another supervisor
takes its units back at once (``takeover.py``).

Both times are the database's clock (``models.DatabaseNow``), as is the ``now`` they are
judged by, so a host whose clock is off neither looks dead nor keeps a dead one alive.

On SQLite silence is not death: a connection's write transaction (a claim, a
transactional handler) holds up every other connection's heartbeat, for as long as it
lasts. There the bound is the lease (``takes_over`` False) and the lease reaper takes the
units back, as before, and the heartbeat keeps the renewal's pace (every third of the
lease): each beat takes the one write lock.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

from django.utils import timezone

from .. import conf
from ..db import engine
from ..models import Supervisor, database_now
from ..units.claimant import Claimant
from ..units.failures import sanitise
from . import units

#: Rows of supervisors gone longer than this are deleted when another one starts.
FORGET_AFTER = timedelta(days=7)
#: Heartbeats in a row a supervisor may miss before it is dead (``bound``).
MISSED_BEATS = 3


def takes_over(using: str) -> bool:
    """Whether a supervisor whose heartbeat went silent is dead on this database: not on
    SQLite, where one connection's write transaction holds up every other heartbeat
    (``Engine.concurrent_writers``)."""
    return engine(using).concurrent_writers


class Heartbeat:
    """Beats (``beat``, in the renewer thread) and remembers how long its beats have been
    going through without a break (``beating_for``, read by the reaper in the main loop:
    the witness that the database took writes while another supervisor was silent)."""

    def __init__(self, claimant: Claimant, *, lease: float, concurrency: int,
                 workers: list[str], queues: list[str] | None, tasks: bool,
                 burst: bool, interval: float | None = None) -> None:
        self.claimant = claimant
        self.takes_over = takes_over(conf.get().DATABASE)
        #: Seconds between two beats: ``HEARTBEAT_INTERVAL``, at most a third of the lease.
        #: A third of the lease where silence does not tell death (SQLite: each beat takes
        #: the one write lock, and nothing but the admin reads it sooner) or when None.
        self.interval = (lease / 3 if interval is None or not self.takes_over
                         else min(interval, lease / 3))
        #: Silent this long, a supervisor is dead: ``MISSED_BEATS`` intervals; the lease
        #: where silence does not tell death (``takes_over`` False: SQLite).
        self.bound = timedelta(seconds=(MISSED_BEATS * self.interval if self.takes_over
                                        else lease))
        self.started_at = timezone.now()
        self.fields = {
            "host": claimant.host, "pid": claimant.pid, "concurrency": concurrency,
            "workers": workers, "queues": (queues if tasks else []), "burst": burst,
        }
        self._created = False
        #: (monotonic seconds of the first beat of the current unbroken run, of the last).
        self._run: tuple[float, float] | None = None

    def _rows(self) -> Any:
        return Supervisor.objects.using(conf.get().DATABASE)

    def beat(self, children: list[Any], done: int) -> None:
        """Say we are alive and what each busy child runs; one statement. ``children``:
        a copy of the main loop's list (this runs in the renewer thread)."""
        try:
            self._write(children, done)
        except BaseException:
            self._run = None  # the database did not take it: the run is broken
            raise
        self._went_through(time.monotonic())

    def _write(self, children: list[Any], done: int) -> None:
        values = {"last_heartbeat": database_now(),
                  "heartbeat_expires_at": database_now(self.bound),
                  "running": _running(children), "units_done": done}
        if self._created and self._rows().filter(pk=self.claimant.supervisor_id).update(
                **values):
            return
        self._rows().filter(last_heartbeat__lt=timezone.now() - FORGET_AFTER).delete()
        self._rows().update_or_create(
            pk=self.claimant.supervisor_id,
            defaults={**self.fields, **values, "started_at": self.started_at},
        )
        self._created = True

    def _went_through(self, at: float) -> None:
        """A beat went through at ``at`` (after its commit: no earlier than the database
        took it). A beat later than two intervals after the last one starts a new run."""
        run = self._run
        if run is None or at - run[1] > 2 * self.interval:
            self._run = (at, at)
        else:
            self._run = (run[0], at)

    def beating_for(self, now: float | None = None) -> float:
        """Seconds this supervisor's beats have gone through without a break (each within
        two intervals of the one before, the last within two intervals of ``now``); 0 when
        it is not beating now. While it beats, the database takes writes: another
        supervisor silent all that time, and longer than its bound, was not silenced by an
        outage that silenced everyone (a restart, a failover), which would end this run
        too. Safe from the main thread: one tuple, replaced whole."""
        run = self._run
        now = time.monotonic() if now is None else now
        if run is None or now - run[1] > 2 * self.interval:
            return 0.0
        return now - run[0]

    def stop(self, exit_code: int, done: int) -> None:
        if self._created:
            self._rows().filter(pk=self.claimant.supervisor_id).update(
                stopped_at=timezone.now(), exit_code=exit_code, running=[], units_done=done)


def _running(children: list[Any]) -> list[dict[str, Any]]:
    """What the children run, for the row; nothing rather than no beat if that cannot be
    told (a beat that fails makes this supervisor look dead to the others)."""
    try:
        return [described for ch in children for described in running_all(ch)]
    except Exception:
        return []


def running_all(child: Any) -> list[dict[str, Any]]:
    """The units a child runs now as JSON (one, or several async units: ``aio``): the
    log fields of each unit, the child and since when; none for a child between units.

    Safe from the renewer thread while the main loop changes the child: it reads the
    numbers the child shares (under their lock) and looks each unit up in ``sent`` (dict
    lookups; nothing the main loop changes is iterated), and a claim is frozen."""
    return [_described(child, c, started) for c, started in child.running_all()]


def _described(child: Any, c: Any, started: float) -> dict[str, Any]:
    since = time.time() - (time.monotonic() - started)
    # Sanitised: a NUL in a source key would make PostgreSQL refuse every beat, and a
    # supervisor that cannot beat is taken for dead.
    described = {k: (v if isinstance(v, int) else sanitise(str(v)))
                 for k, v in units.describe(c).items()}
    return {**described, "child": child.pid,
            "since": datetime.fromtimestamp(since, UTC).isoformat()}
