"""What a child and its supervisor share about the units handed to the child.

The supervisor sends a child its units in batches, each unit numbered (``seq``, counting up
per child), and may send the next batch before the child is through with the last: a
child that finishes a unit starts its next one without waiting for the supervisor. Since
units then wait in the child, the supervisor must know, without asking the busy child:

- which unit runs now and since when: for timeouts, cancellation, the heartbeat, and to
  say which unit a dead child was running (``running``);
- that a waiting unit will not start, so that it can give it to another child or back to
  the database (``take_back``): the child starts a unit only if its number is not below a
  floor that the supervisor raises, both under one lock, so a unit is either started by
  the child or taken back by the supervisor, never both.

Four numbers in shared memory and a lock, made before the fork. A child killed while it
holds the lock (for microseconds, as it starts a unit) never releases it: the supervisor
waits for it at most ``LOCK_WAIT`` seconds, then reads without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import BaseContext

_STARTED, _STARTED_AT, _FINISHED, _FLOOR = range(4)
#: Seconds the supervisor waits for the lock before it reads without it.
LOCK_WAIT = 0.5


class Handoff:
    def __init__(self, context: BaseContext) -> None:
        # Doubles hold every integer a child can count to exactly.
        self._values = context.RawArray("d", [-1.0, 0.0, -1.0, -math.inf])
        self._lock = context.Lock()

    # ----- the child ----------------------------------------------------------------

    def start(self, seq: int) -> bool:
        """Mark unit ``seq`` started, unless it was taken back; True if it may run."""
        with self._lock:
            if seq < self._values[_FLOOR]:
                return False
            self._values[_STARTED_AT] = time.monotonic()
            self._values[_STARTED] = seq
        return True

    def finish(self, seq: int) -> None:
        """Unit ``seq`` is through (recorded, or failed to record)."""
        self._values[_FINISHED] = seq

    # ----- the supervisor -----------------------------------------------------------

    def running(self) -> tuple[int, float] | None:
        """The unit the child runs now and when it started it (``time.monotonic()``, the
        same clock in every process of a host); None between units."""
        with self._supervisor_lock():
            started, at, finished = (self._values[_STARTED], self._values[_STARTED_AT],
                                     self._values[_FINISHED])
        return (int(started), at) if started > finished else None

    def started(self) -> int:
        """The number of the last unit the child started (-1: none yet)."""
        with self._supervisor_lock():
            return int(self._values[_STARTED])

    def take_back(self, sent: int) -> int:
        """Units numbered below ``sent`` that have not started never will; returns the
        number of the last one started (-1: none): every later one is taken back."""
        with self._supervisor_lock():
            self._values[_FLOOR] = sent
            return int(self._values[_STARTED])

    @contextmanager
    def _supervisor_lock(self) -> Iterator[None]:
        """The lock, unless its holder died holding it (then after ``LOCK_WAIT``: its
        child is dead or stopped, and nothing changes these numbers meanwhile)."""
        held = self._lock.acquire(timeout=LOCK_WAIT)
        try:
            yield
        finally:
            if held:
                self._lock.release()
