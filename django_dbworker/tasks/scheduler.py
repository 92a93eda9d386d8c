"""The scheduler of cron ticks (``schedules.py`` holds the declarations): every round, a
supervisor enqueues the ticks that came due, each once with the idempotency key
``cron:<name>:<tick>``, whatever the number of supervisors; missed ticks follow the
schedule's misfire policy."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections
from django.utils import timezone

from .. import conf
from ..db.connections import connected
from ..exceptions import UnknownTask
from ..logs import log_event
from . import registry as task_registry
from . import store as taskstore
from .schedules import Schedule
from .task import DBWorkerTask

if TYPE_CHECKING:
    from .stored_schedules import StoredSource


class Scheduler:
    """Enqueues the ticks that came due since it last looked.

    Ticks of the last ``RECENT`` seconds are always enqueued; older ones were missed (nothing
    ran, or this supervisor was paused) and follow the schedule's misfire policy. A schedule
    that raises is logged (at most once per ``ERROR_INTERVAL``) and skipped; the others go on.
    """

    RECENT = 60.0
    #: Missed ticks a schedule with misfire="all" enqueues per round at most; the next
    #: rounds take the rest, oldest first.
    MISSED_PER_ROUND = 100
    #: Seconds between two ``schedule_failed`` lines of one schedule.
    ERROR_INTERVAL = 60.0

    def __init__(self, schedules: dict[str, Schedule], now: datetime | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 stored: StoredSource | None = None) -> None:
        #: The code-declared schedules; ``schedules`` adds the stored ones of the last round.
        self.code = dict(schedules)
        self.schedules = dict(schedules)
        self.stored = stored
        self.clock = clock
        self.start = now or timezone.now()
        self.last = {name: self._since_start(s) for name, s in schedules.items()}
        #: name -> the tick after which the next round goes on (misfire="all" catching up)
        self._resume: dict[str, datetime] = {}
        #: name -> (when it was last logged, failures not logged since)
        self._failures: dict[str, tuple[float, int]] = {}
        #: stored schedule name -> the version in use (None before the first read)
        self._stored: dict[str, Schedule] | None = None

    def _since_start(self, s: Schedule) -> datetime:
        """Where a schedule's ticks start when the scheduler starts: now, or as far back as
        its misfire window for ``latest`` and ``all``."""
        return self.start - timedelta(seconds=s.misfire_window if s.misfire != "skip" else 0)

    def active(self) -> bool:
        """Whether a round may have anything to do (stored schedules may appear any time)."""
        return bool(self.schedules) or self.stored is not None

    def refresh(self, now: datetime) -> None:
        """Take the stored schedules as their rows are now: new and edited rows from their
        last save on (misfires as far back as that save, never before it; a row first seen
        after the first round no further back than ``RECENT``), disabled and deleted rows
        gone. A code schedule of the same name wins (``StoredSource`` logs it)."""
        if self.stored is None:
            return
        raw = _raw_connection()
        try:
            rows = self.stored.read(self.code)
        except Exception as exc:
            if _database_away(exc, raw):
                raise
            self._failed("(stored schedules)", "-", exc)  # the last rows read go on
            return
        first, self._stored = self._stored is None, self._stored or {}
        for name in [n for n in self._stored if n not in rows]:
            del self._stored[name], self.schedules[name]
            self.last.pop(name, None)
            self._resume.pop(name, None)
        for name, (schedule, saved) in rows.items():
            if self._stored.get(name) == schedule:
                continue
            since = max(saved, self._since_start(schedule))
            if not first:
                since = max(since, now - timedelta(seconds=self.RECENT))
            self._stored[name] = self.schedules[name] = schedule
            self.last[name] = since
            self._resume.pop(name, None)

    def due(self, schedule: Schedule, now: datetime) -> list[datetime]:
        name = schedule.name
        last = self.last[name]
        recent_from = now - timedelta(seconds=self.RECENT)
        recent = [t for t in schedule.ticks(max(last, recent_from - timedelta(seconds=1)), now)
                  if t >= recent_from]
        if schedule.misfire == "skip" or last >= recent_from:
            return recent
        if schedule.misfire == "latest":
            if recent:
                return recent
            tick = schedule.previous(recent_from)
            return [tick] if last < tick < recent_from else []
        window_from = now - timedelta(seconds=schedule.misfire_window)
        start = max(last, window_from - timedelta(seconds=1))
        missed = [t for t in schedule.ticks(start, recent_from, self.MISSED_PER_ROUND + 1)
                  if window_from <= t < recent_from]
        if len(missed) > self.MISSED_PER_ROUND:  # the rest next round, then the recent ones
            missed = missed[:self.MISSED_PER_ROUND]
            self._resume[name] = missed[-1]
            return missed
        return missed + recent

    def tick(self, now: datetime | None = None) -> int:
        now = now or timezone.now()
        self.refresh(now)
        enqueued = 0
        for name, schedule in self.schedules.items():
            raw = _raw_connection()
            try:
                for when in self.due(schedule, now):
                    enqueued += enqueue_tick(schedule, when)
            except Exception as exc:
                if _database_away(exc, raw):
                    raise  # the supervisor's outage back-off; these ticks are tried again
                self._resume.pop(name, None)
                self._failed(schedule.name, schedule.task_path, exc)
            self.last[name] = self._resume.pop(name, now)
        return enqueued

    def _failed(self, name: str, task_path: str, exc: Exception) -> None:
        at = self.clock()
        logged, skipped = self._failures.get(name, (-math.inf, 0))
        if at - logged < self.ERROR_INTERVAL:
            self._failures[name] = (logged, skipped + 1)
            return
        self._failures[name] = (at, 0)
        log_event(logging.ERROR, "schedule_failed", schedule=name, task=task_path,
                  error=_describe(exc), not_logged=skipped, next_log_in=self.ERROR_INTERVAL)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be read)"
    return f"{type(exc).__name__}: {text.strip()[:300]}"


def _raw_connection() -> Any:
    """The DB-API connection statements run on now (None if none is open), for
    ``_database_away``."""
    return connections[conf.get().DATABASE].connection


def _database_away(exc: Exception, raw: Any = None) -> bool:
    """A database error on a connection that no longer works: an outage, not a schedule's
    fault. ``raw``: the DB-API connection the failed work began on; a session the server
    ended is an outage even where leaving an ``atomic()`` opened a new connection, which
    answers (the tick is then tried again, not skipped)."""
    return isinstance(exc, DatabaseError) and not connected(conf.get().DATABASE, raw)


def enqueue_tick(schedule: Schedule, tick: datetime) -> int:
    """Enqueue one tick once; 1 if this call created it, 0 if it existed already. Raises
    UnknownTask when the schedule's task is not a registered DBWorkerBackend task."""
    task = task_registry.resolve(schedule.task_path)
    if not isinstance(task, DBWorkerTask):
        raise UnknownTask(f"{schedule.task_path} does not use DBWorkerBackend")
    key = schedule.key(tick)
    if taskstore.key_exists(key):
        return 0
    call = replace(task.using(idempotency_key=key), _schedule=schedule.name)
    result = call.enqueue(*schedule.args, **schedule.kwargs)
    log_event(logging.INFO, "scheduled", schedule=schedule.name, tick=tick.isoformat(),
              id=result.id)
    return 1
