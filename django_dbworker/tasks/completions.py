"""Successful tasks a child records together: one statement for several tasks.

A child that runs a batch of short tasks would otherwise wait for one UPDATE and one commit
per task, longer than most tasks take. Here a successful task is kept (``add``) and the
child records what it kept in one ``taskstore.succeed_many`` (``flush``) when its batch is
through, before it reports the batch to the supervisor (which renews the leases meanwhile).
What follows a record (the ``on_success`` callback, ``task_finished``, the log line) comes
after it, in the child's main thread, as for a task recorded on its own.

A task that runs long must not hold back what finished before it: after ``PATIENCE``
seconds of one task, a thread of the child records what was kept (on a connection of its
own, opened the first time). The same thread records a batch when the child is through
with it (``record_behind``): the child tells the supervisor it has room and runs the next
batch while the record is on its way, instead of waiting a round trip to the database for
it (with the database 5 ms away, that wait was as long as the batch); what follows the
record comes when the child collects it (``recorded``), between two tasks or while it
waits. So what a child loses when it dies, or is stopped because a
task timed out or was cancelled, is at most a few milliseconds of finished tasks, which
then run again: the at-least-once of a child that dies between a task's end and its record.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections

from ..db import errors
from ..db.connections import own_process
from . import store as taskstore

if TYPE_CHECKING:
    from .unit import TaskUnit  # made by the planner; it imports this module's users

#: Seconds one task may run before the tasks that finished before it are recorded.
PATIENCE = 0.005
#: Most tasks kept before they are recorded, however short they are.
MOST = 100


@dataclass(slots=True)
class Kept:
    """A task that succeeded and is not recorded yet. ``after`` is called once it is (with
    True) or once it turned out lost (False: taken over, cancelled, its lease expired) and
    returns what to report; ``tag`` is the caller's."""
    claim: TaskUnit
    value: Any
    finished_at: datetime
    after: Callable[[bool], Any]
    tag: Any = None


class Completions:
    def __init__(self, using: str) -> None:
        self.using = using
        self._kept: list[Kept] = []
        self._recorded: list[tuple[Kept, bool]] = []
        self._cond = threading.Condition()
        self._busy_since: float | None = None
        self._writing = False
        self._closing = False
        #: The thread waits with no deadline: only a notify wakes it.
        self._idle = False
        self._thread: threading.Thread | None = None
        #: Record what is kept now (``record_behind``), not after ``PATIENCE``.
        self._now = False
        #: The thread's last record failed: the main thread records (``flush``) until one
        #: of its own succeeds.
        self._failed = False
        #: Readable once the thread recorded (or gave up): the child's wait includes it.
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    def __len__(self) -> int:
        return len(self._kept)

    def add(self, kept: Kept) -> None:
        with self._cond:
            self._kept.append(kept)

    def due(self) -> bool:
        """Whether so many are kept that they should be recorded before the next task."""
        return len(self._kept) >= MOST

    def started(self) -> None:
        """The main thread starts a task: what is kept gets recorded if it runs long.

        No lock and no wake-up per task while the thread waits for a deadline anyway (it
        looks at the start time again when it wakes): only when it waits for nothing."""
        if not self._kept:
            return
        self._busy_since = time.monotonic()
        if self._thread is None or self._idle:
            with self._cond:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._record_behind, name="dbworker-completions",
                        daemon=True)
                    self._thread.start()
                self._cond.notify()

    def finished(self) -> None:
        self._busy_since = None

    def record_behind(self) -> bool:
        """Have the thread record what is kept now, without waiting for it (its outcomes
        come through ``recorded``); False when it cannot (nothing kept, or its last record
        failed: ``flush`` then)."""
        with self._cond:
            if not self._kept or self._failed or self._closing:
                return False
            self._now = True
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._record_behind, name="dbworker-completions", daemon=True)
                self._thread.start()
            self._cond.notify()
        return True

    @property
    def behind(self) -> bool:
        """Whether the thread has a record to make or is making one (``record_behind``)."""
        return self._writing or (self._now and bool(self._kept))

    @property
    def has_recorded(self) -> bool:
        """Whether the thread recorded something not collected yet (``recorded``)."""
        return bool(self._recorded)

    def fileno(self) -> int:
        """A descriptor that becomes readable when the thread recorded or gave up."""
        return self._wake_r

    def recorded(self) -> list[tuple[Kept, bool]]:
        """What the thread recorded since the last look, without waiting."""
        with contextlib.suppress(BlockingIOError):
            os.read(self._wake_r, 4096)
        if not self._recorded:  # read without the lock: the next look takes the rest
            return []
        with self._cond:
            done, self._recorded = self._recorded, []
        return done

    @property
    def failed_behind(self) -> bool:
        """The thread's last record failed: record on the main thread (``flush``)."""
        return self._failed

    def flush(self) -> list[tuple[Kept, bool | Exception]]:
        """Record everything kept (after the thread, if it is recording): each kept task
        with True (recorded), False (lost) or the database error that stopped its record.
        The caller runs each one's ``after``, in the order they were kept."""
        with self._cond:
            while self._writing:
                self._cond.wait()
            kept, self._kept = self._kept, []
            self._now = False
            done: list[tuple[Kept, bool | Exception]] = [*self._recorded]
            self._recorded = []
        if kept:
            try:
                ids = taskstore.succeed_many([(k.claim, k.value, k.finished_at) for k in kept])
            except DatabaseError as exc:
                if len(kept) == 1 or not self._values_fault(exc):
                    # The connection or server went away, or anything else that is not
                    # a value's fault: every kept task has the same error (``contain``
                    # gives each back).
                    return done + [(k, exc) for k in kept]
                return done + self._one_by_one(kept)
            done += [(k, k.claim.task_id in ids) for k in kept]
            self._failed = False
        return done

    def _one_by_one(self, kept: list[Kept]) -> list[tuple[Kept, bool | Exception]]:
        """The batch's record failed on a usable connection: one value of it is at fault
        (values are checked before they are kept, so this is a backstop). Each on its own,
        so only that one's record fails and its batch-mates are recorded once."""
        done: list[tuple[Kept, bool | Exception]] = []
        for k in kept:
            try:
                ids = taskstore.succeed_many([(k.claim, k.value, k.finished_at)])
            except DatabaseError as exc:
                done.append((k, exc))
                if not self._values_fault(exc):  # lost meanwhile: the rest goes back too
                    return done + [(rest, exc) for rest in kept[len(done):]]
            else:
                done.append((k, k.claim.task_id in ids))
        return done

    def _values_fault(self, exc: DatabaseError) -> bool:
        """Whether the database refused a value of the record, on a session still there
        (``db.errors``): only then is it one task's fault."""
        return errors.classify(exc, self.using, None) == errors.VALUE

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(5)
        for fd in (self._wake_r, self._wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # ----- the thread -------------------------------------------------------------

    def _record_behind(self) -> None:
        own_process(self.using)  # this thread's connection is its own
        try:
            while True:
                with self._cond:
                    while not self._closing and not self._overdue():
                        # Idle first, then the start time: a task that starts in between
                        # sees the thread idle and wakes it.
                        self._idle = True
                        self._idle = (timeout := self._wait_for()) is None
                        self._cond.wait(timeout)
                    self._idle = False
                    if self._closing:
                        return
                    kept, self._kept = self._kept, []
                    self._writing = True
                    self._now = False
                try:
                    ids = taskstore.succeed_many(
                        [(k.claim, k.value, k.finished_at) for k in kept])
                    outcome: list[tuple[Kept, bool]] = [
                        (k, k.claim.task_id in ids) for k in kept]
                except Exception:  # left to the main thread's flush; a thread anew later
                    connections[self.using].close()
                    with self._cond:
                        self._kept = kept + self._kept
                        self._writing = False
                        self._thread = None
                        self._failed = True
                        self._now = False
                        self._cond.notify_all()
                    self._wake()
                    return
                with self._cond:
                    self._recorded += outcome
                    self._writing = False
                    self._cond.notify_all()
                self._wake()
        finally:
            connections[self.using].close()

    def _overdue(self) -> bool:
        if self._now and self._kept:
            return True
        since = self._busy_since
        return bool(self._kept) and since is not None and time.monotonic() - since >= PATIENCE

    def _wait_for(self) -> float | None:
        since = self._busy_since
        if self._now and self._kept:
            return 0.0
        if not self._kept or since is None:
            return None
        return max(0.0, since + PATIENCE - time.monotonic())
