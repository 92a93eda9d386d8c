"""The supervisor's task work: claiming by queue and rate, cancellation, and
the task duties (``duties.tasks``: stops, cron, retention). The supervisor owns the
children; this says what to do with task units."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ..conf import Config
from ..db import notify
from ..logs import log_event
from ..models import TaskStatus
from ..pausing import ANNOUNCEMENT as PAUSES
from ..tasks import byqueue
from ..tasks import planner as taskplanner
from ..tasks import registry as task_registry
from ..tasks import store as taskstore
from ..tasks.concurrency import Seen
from ..tasks.names import configured_queues
from ..tasks.runner import record_stopped
from ..tasks.scheduler import Scheduler
from ..tasks.schedules import schedules
from ..tasks.stored_schedules import StoredSource
from ..tasks.unit import TaskUnit, is_task
from ..units import aio
from ..units.claimant import Claimant
from ..units.failures import FailureInfo
from .duties.base import Duty, Every
from .duties.tasks import Cron, Retention, TaskStops
from .pool import Child
from .prefetch import Prefetch

CANCELLED = "django_dbworker.exceptions.TaskCancelled"
CANCEL_POLL = 0.5


class TaskWork:
    def __init__(self, queues: list[str] | None, config: Config, claimant: Claimant,
                 *, schedule: bool = True) -> None:
        self.queues = queues
        self.config = config
        self.claimant = claimant
        known = task_registry.known()
        self.limits = {path: t.rate_limit for path, t in known.items() if t.rate_limit}
        #: A task has a concurrency limit: claims take keyed tasks (tasks.concurrency).
        self.keyed = any(t.concurrency_limit for t in known.values())
        #: Until when (monotonic) claims may be plain although ``keyed``: the last keyed
        #: claim saw every waiting task and none had a key, and new keyed tasks announce
        #: themselves (``announced``). Only while NOTIFY reaches us (``listening``).
        self._plain_until = 0.0
        #: NOTIFY reaches this supervisor now (its LISTEN connection is open).
        self.listening = False
        self.scheduler = Scheduler(schedules() if schedule else {},
                                   stored=StoredSource() if schedule else None)
        self.cancels = Every(CANCEL_POLL)
        self.cron = Cron(self.scheduler)
        self.retention = Retention(config)
        #: The configured queues (``QUEUES``), for claims around a paused queue's backlog.
        self.known_queues = configured_queues()

    def claim(self, room: int, paused: frozenset[str] = frozenset(), *,
              backlog: bool = False) -> list[TaskUnit]:
        """Claim up to ``room`` tasks of our queues but the ``paused`` ones; ``backlog``:
        tasks wait in a paused queue, so a claim of several queues is made queue by queue
        (``byqueue``) rather than walking past them.

        A keyed claim costs more statements than a plain one (tasks.concurrency). A
        supervisor that knows keyed tasks claims the keyed way until a keyed claim saw
        every waiting task and none with a key; then plain claims, for POLL_INTERVAL at
        most (a keyed task made ready without an announcement, by its ``run_after`` or a
        reaper, waits that long more at worst), or until new tasks that may be keyed are
        announced. Without NOTIFY every claim is keyed."""
        now = time.monotonic()
        keyed = self.keyed and (now >= self._plain_until or not self.listening)
        seen = Seen() if keyed and self.listening else None
        claims = self._claim_queues(room, paused, backlog, keyed, seen)
        if seen is not None and seen.read and not seen.keyed:
            self._plain_until = now + self.config.POLL_INTERVAL
        return claims

    def _claim_queues(self, room: int, paused: frozenset[str], backlog: bool, keyed: bool,
                      seen: Seen | None) -> list[TaskUnit]:
        queues = self.queues
        if paused:
            if queues is not None:
                queues = [q for q in queues if q not in paused]
            if backlog:
                queues = queues if queues is not None else [
                    q for q in self.known_queues if q not in paused]
                if len(queues) > 1:
                    return self._claim_by_queue(queues, room, keyed, seen)
            if queues == []:
                return []
        return self._claim(queues, room, keyed, seen, paused)

    def announced(self, payloads: set[str]) -> None:
        """What NOTIFY announced since the last claim: new tasks that may have a key
        (``notify.TASKS``), or a queue paused or resumed, make the next claim keyed
        again."""
        if notify.TASKS in payloads or PAUSES in payloads:
            self._plain_until = 0.0

    def _claim(self, queues: list[str] | None, room: int, keyed: bool, seen: Seen | None,
               paused: frozenset[str] = frozenset()) -> list[TaskUnit]:
        return taskplanner.claim_limited(
            queues, room, self.claimant, self.config.LEASE_SECONDS,
            limits=self.limits, global_limit=self.config.TASK_RATE_LIMIT,
            exclude_queues=paused, keyed=keyed, seen=seen,
        )

    def _claim_by_queue(self, queues: list[str], room: int, keyed: bool,
                        seen: Seen | None) -> list[TaskUnit]:
        claims = [c for queue, n in byqueue.shares(queues, room).items()
                  for c in self._claim([queue], n, keyed, seen)]
        claims.sort(key=taskstore.claim_order)  # merged: priority, then age
        return claims

    def duties(self, children: Callable[[], list[Child]],
               stop: Callable[[Child, TaskUnit], bool], waiting: Prefetch) -> list[Duty]:
        """The task duties, in the order the supervisor runs them (``maintain``'s
        arguments, ``children`` asked for at each run)."""
        return [TaskStops(self, children, stop, waiting), self.cron, self.retention]

    def maintain(self, children: list[Child], stop: Callable[[Child, TaskUnit], bool],
                 waiting: Prefetch) -> None:
        """Stop cancelled tasks (``waiting``: claimed ahead, not started; units waiting in
        a child are taken back there first). Timeouts: ``duties.timeouts``."""
        now = time.monotonic()
        if self.cancels.due(now):
            running = {c.task_id: ch for ch in children for c, _ in ch.running_all()
                       if is_task(c)}
            self.cancels.ran(now)
            queued = [c for ch in children for c in ch.waiting()] + waiting.units()
            queued_ids = {c.task_id for c in queued if is_task(c)}
            cancelled = set(taskstore.cancel_requested([*running, *queued_ids]))
            if cancelled & queued_ids:
                for ch in children:
                    waiting.put(ch.take_back(), now, front=True)  # claimed before them
                for c in waiting.units():
                    if is_task(c) and c.task_id in cancelled:
                        waiting.remove(c)
                        self._cancel_waiting(c)
            for task_id in cancelled:
                holder = running.get(task_id)
                now_running = holder.running_all() if holder is not None else []
                found = [c for c, _ in now_running if is_task(c) and c.task_id == task_id]
                if holder is None or not found:
                    continue  # it finished meanwhile (its child may run the next one)
                if aio.concurrent(found[0]):
                    # Cancelled on its child's loop, where it records itself CANCELLED;
                    # the child is stopped only if that did not end it (a blocked loop).
                    asked = holder.cancel(found[0])
                    if asked is None or asked <= aio.STOP_GRACE:
                        continue
                self._stop(holder, found[0], stop)

    def _stop(self, ch: Child, c: TaskUnit, stop: Callable[[Child, TaskUnit], bool]) -> None:
        """A task cancelled while it ran: its child is stopped, the task CANCELLED."""
        if not stop(ch, c):  # killed and forgotten before its unit is recorded
            return  # it finished meanwhile
        record_stopped(c.task_path, c, FailureInfo(CANCELLED, "the task was cancelled while "
                       "it ran and its process was stopped"), status=TaskStatus.CANCELLED)
        log_event(logging.WARNING, "cancelled", task=c.task_path, id=c.task_id,
                  attempt=c.attempt, child=ch.pid)

    def _cancel_waiting(self, c: TaskUnit) -> None:
        """A task claimed ahead was cancelled before a child started it."""
        record_stopped(c.task_path, c, FailureInfo(CANCELLED, "the task was cancelled before "
                       "it ran"), status=TaskStatus.CANCELLED)
        log_event(logging.WARNING, "cancelled", task=c.task_path, id=c.task_id,
                  attempt=c.attempt)
