"""The task duties: stopping tasks whose cancel was asked for, cron, retention (timeouts
of both kinds: ``duties.timeouts``)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from django.db import DatabaseError, connections
from django.utils import timezone

from ...conf import Config
from ...db import space
from ...db.connections import connected
from ...logs import log_event
from ...tasks import store as taskstore
from ...tasks.scheduler import Scheduler
from ...workflows import retention
from .base import Every, Periodic

if TYPE_CHECKING:
    from ...tasks.unit import TaskUnit
    from ..pool import Child
    from ..prefetch import Prefetch
    from ..taskwork import TaskWork

SCHEDULE_POLL = 1.0
PRUNE_POLL = 10.0
PRUNE_BATCH = 1000
PRUNE_ERROR_INTERVAL = 60.0


class TaskStops(Periodic):
    """Every ``CANCEL_POLL``: stop the tasks whose cancel was asked for, running or
    claimed ahead (``TaskWork.maintain``)."""

    name = "task_stops"

    def __init__(self, work: TaskWork, children: Callable[[], list[Child]],
                 stop: Callable[[Child, TaskUnit], bool], waiting: Prefetch) -> None:
        super().__init__(0.0)
        self.tasks = work
        self.children = children
        self.stop = stop
        self.waiting = waiting

    def work(self, now: float) -> None:
        self.tasks.maintain(self.children(), self.stop, self.waiting)


class Cron(Periodic):
    """Every second, when schedules exist or may be stored: enqueue the cron ticks that are
    due."""

    name = "cron"

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(SCHEDULE_POLL)
        self.scheduler = scheduler

    def due(self, now: float) -> bool:
        return self.scheduler.active() and super().due(now)

    def work(self, now: float) -> None:
        self.scheduler.tick()


def retention_cutoff(retention: float | timedelta | None, now: datetime) -> datetime | None:
    """``now - retention``, or None when nothing can be that old (no retention, or a
    retention reaching before the first representable date)."""
    if retention is None:
        return None
    try:
        keep = retention if isinstance(retention, timedelta) else timedelta(seconds=retention)
        return now - keep
    except (OverflowError, ValueError):
        return None


class Retention(Periodic):
    """Every ``PRUNE_POLL`` seconds, when ``RETENTION`` is set: delete a batch of tasks
    finished before now - RETENTION; the next batch at the next round while batches come
    back full. An error other than a lost database is logged (``prune_failed``, once per
    ``PRUNE_ERROR_INTERVAL``) and retention tried again later: it never stops the
    supervisor."""

    name = "retention"

    def __init__(self, config: Config) -> None:
        super().__init__(PRUNE_POLL)
        self.config = config
        self._logged = Every(PRUNE_ERROR_INTERVAL)

    def due(self, now: float) -> bool:
        return self.config.RETENTION is not None and super().due(now)

    def work(self, now: float) -> None:
        # the connection it begins on: a session the server ended mid-batch is an outage
        # even where leaving the batch's atomic() opened a new connection, which answers
        raw = connections[self.config.DATABASE].connection
        try:
            self._prune_batch()
        except Exception as exc:
            if isinstance(exc, DatabaseError) and not connected(self.config.DATABASE, raw):
                raise  # the supervisor's outage back-off
            if self._logged.due(now):
                self._logged.ran(now)
                log_event(logging.ERROR, "prune_failed",
                          error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                          next_log_in=PRUNE_ERROR_INTERVAL)

    def _prune_batch(self) -> None:
        cutoff = retention_cutoff(self.config.RETENTION, timezone.now())
        if cutoff is None:
            return
        pruned = taskstore.prune_batch(cutoff, PRUNE_BATCH)
        if pruned < PRUNE_BATCH:  # the tasks are done: the workflows they left
            workflows = retention.prune_batch(cutoff, PRUNE_BATCH)
            if workflows:
                log_event(logging.INFO, "pruned_workflows", workflows=workflows,
                          older_than=cutoff.isoformat())
                if workflows == PRUNE_BATCH:
                    self.every.again()
        if pruned:
            # SQLite in incremental auto-vacuum mode gives the freed pages back (space.py).
            pages = space.after_prune(self.config.DATABASE)
            log_event(logging.INFO, "pruned", tasks=pruned, older_than=cutoff.isoformat(),
                      **({"pages_released": pages} if pages else {}))
            if pruned == PRUNE_BATCH:
                self.every.again()  # more to do: next round, not in 10 s
