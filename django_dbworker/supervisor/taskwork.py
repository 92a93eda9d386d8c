"""The supervisor's task duties: claiming by queue and rate, timeouts, cancellation, cron
and retention. The supervisor owns the children; this says what to do with task units."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from django.db import DatabaseError
from django.utils import timezone

from ..conf import Config
from ..db.connections import connected
from ..logs import log_event
from ..models import TaskStatus
from ..rows.store import Claimant, FailureInfo
from ..scheduling import Scheduler, schedules
from ..tasks import registry as task_registry
from ..tasks import store as taskstore
from ..tasks.store import TaskClaim
from ..tasks.unit import is_task
from .pool import Child
from .prefetch import Prefetch

TIMEOUT = "django_dbworker.exceptions.TaskTimeout"
CANCELLED = "django_dbworker.exceptions.TaskCancelled"
CANCEL_POLL = 0.5
SCHEDULE_POLL = 1.0
PRUNE_POLL = 10.0
PRUNE_BATCH = 1000
PRUNE_ERROR_INTERVAL = 60.0


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


class TaskWork:
    def __init__(self, queues: list[str] | None, config: Config, claimant: Claimant,
                 *, schedule: bool = True) -> None:
        self.queues = queues
        self.config = config
        self.claimant = claimant
        known = task_registry.known()
        self.limits = {path: t.rate_limit for path, t in known.items() if t.rate_limit}
        self.timeouts = {path: t.timeout_seconds for path, t in known.items()
                         if t.timeout_seconds}
        self.scheduler = Scheduler(schedules() if schedule else {})
        self._next = {"cancel": 0.0, "schedule": 0.0, "prune": 0.0}
        self._prune_logged = -PRUNE_ERROR_INTERVAL

    def claim(self, room: int) -> list[TaskClaim]:
        return taskstore.claim_limited(
            self.queues, room, self.claimant, self.config.LEASE_SECONDS,
            limits=self.limits, global_limit=self.config.TASK_RATE_LIMIT,
        )

    def maintain(self, children: list[Child], stop: Callable[[Child, TaskClaim], bool],
                 waiting: Prefetch) -> None:
        """Stop timed-out and cancelled tasks (``waiting``: claimed ahead, not started;
        units waiting in a child are taken back there first); enqueue due cron ticks;
        prune old tasks."""
        now = time.monotonic()
        running: dict[uuid.UUID, Child] = {}
        for ch in children:
            unit = ch.running()
            if unit is None or not is_task(unit[0]):
                continue
            c, since = unit
            limit = self.timeouts.get(c.task_path)
            if limit and now - since > limit:
                self._stop(ch, c, stop, TaskStatus.FAILED, FailureInfo(
                    TIMEOUT, f"the task ran longer than its timeout of {limit:g}s and its "
                    "process was stopped"))
            else:
                running[c.task_id] = ch
        if now >= self._next["cancel"]:
            self._next["cancel"] = now + CANCEL_POLL
            queued = [c for ch in children for c in ch.waiting()] + waiting.units()
            queued_ids = {c.task_id for c in queued if is_task(c)}
            cancelled = set(taskstore.cancel_requested([*running, *queued_ids]))
            if cancelled & queued_ids:
                for ch in children:
                    waiting.put(ch.take_back(), now)
                for c in waiting.units():
                    if is_task(c) and c.task_id in cancelled:
                        waiting.remove(c)
                        self._cancel_waiting(c)
            for task_id in cancelled:
                ch = running.get(task_id)
                unit = ch.running() if ch is not None else None
                if ch is None or unit is None or not is_task(unit[0]) \
                        or unit[0].task_id != task_id:
                    continue  # it finished meanwhile (its child may run the next one)
                self._stop(ch, unit[0], stop, TaskStatus.CANCELLED, FailureInfo(
                    CANCELLED, "the task was cancelled while it ran and its process was "
                    "stopped"))
        if now >= self._next["schedule"] and self.scheduler.schedules:
            self._next["schedule"] = now + SCHEDULE_POLL
            self.scheduler.tick()
        if now >= self._next["prune"] and self.config.RETENTION is not None:
            self._next["prune"] = now + PRUNE_POLL
            self._prune()

    def _stop(self, ch: Child, c: TaskClaim, stop: Callable[[Child, TaskClaim], bool],
              status: TaskStatus, info: FailureInfo) -> None:
        from ..tasks.runner import record_stopped

        if not stop(ch, c):  # killed and forgotten before its unit is recorded
            return  # it finished meanwhile
        record_stopped(c.task_path, c, info, status=status)
        log_event(logging.WARNING, "cancelled" if status == TaskStatus.CANCELLED else
                  "timed_out", task=c.task_path, id=c.task_id, attempt=c.attempt,
                  child=ch.pid)

    def _cancel_waiting(self, c: TaskClaim) -> None:
        """A task claimed ahead was cancelled before a child started it."""
        from ..tasks.runner import record_stopped

        record_stopped(c.task_path, c, FailureInfo(CANCELLED, "the task was cancelled before "
                       "it ran"), status=TaskStatus.CANCELLED)
        log_event(logging.WARNING, "cancelled", task=c.task_path, id=c.task_id,
                  attempt=c.attempt)

    def _prune(self) -> None:
        """Delete a batch of tasks finished before now - RETENTION. An error other than a
        lost database is logged (once per PRUNE_ERROR_INTERVAL) and retention tried again
        later: it never stops the supervisor."""
        try:
            self._prune_batch()
        except Exception as exc:
            if isinstance(exc, DatabaseError) and not connected(self.config.DATABASE):
                raise  # the supervisor's outage back-off
            now = time.monotonic()
            if now - self._prune_logged >= PRUNE_ERROR_INTERVAL:
                self._prune_logged = now
                log_event(logging.ERROR, "prune_failed",
                          error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                          next_log_in=PRUNE_ERROR_INTERVAL)

    def _prune_batch(self) -> None:
        cutoff = retention_cutoff(self.config.RETENTION, timezone.now())
        if cutoff is None:
            return
        pruned = taskstore.prune_batch(cutoff, PRUNE_BATCH)
        if pruned:
            log_event(logging.INFO, "pruned", tasks=pruned, older_than=cutoff.isoformat())
            if pruned == PRUNE_BATCH:
                self._next["prune"] = 0.0  # more to do: next loop, not in 10 s
