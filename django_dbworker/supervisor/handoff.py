"""What a child and its supervisor share about the units handed to the child.

The supervisor sends a child its units in batches, each unit numbered (``seq``, counting up
per child), and may send the next batch before the child is through with the last: a
child that finishes a unit starts its next one without waiting for the supervisor. Since
units then wait in the child, the supervisor must know, without asking the busy child:

- which units run now and since when: for timeouts, cancellation, the heartbeat, and to
  say which units a dead child was running (``running``, ``running_all``): one at a time,
  or up to ``slots`` at once for async units (``units/aio.py``), started in order
  and finished in any order;
- that a waiting unit will not start, so that it can give it to another child or back to
  the database (``take_back``): the child starts a unit only if its number is not below a
  floor that the supervisor raises, both under one lock, so a unit is either started by
  the child or taken back by the supervisor, never both.

Two numbers and a (number, start time) pair per slot in shared memory and a lock, made
before the fork. A child killed while it
holds the lock (for microseconds, as it starts a unit) never releases it: the supervisor
waits for it at most ``LOCK_WAIT`` seconds, then reads without it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.context import BaseContext

_STARTED, _FLOOR = range(2)
#: Where the slots begin: slot i is (unit number, start time) at ``_SLOTS + 2 * i``.
_SLOTS = 2
#: Seconds the supervisor waits for the lock before it reads without it.
LOCK_WAIT = 0.5


class Handoff:
    def __init__(self, context: BaseContext, slots: int = 1) -> None:
        # Doubles hold every integer a child can count to exactly.
        self._values = context.RawArray("d", [-1.0, -math.inf] + [-1.0, 0.0] * slots)
        self._lock = context.Lock()
        #: How many units may run at once in the child.
        self.slots = slots

    # ----- the child ----------------------------------------------------------------

    def start(self, seq: int) -> bool:
        """Mark unit ``seq`` started, unless it was taken back; True if it may run. A
        slot must be free (the child runs at most ``slots`` units at once)."""
        values = self._values
        with self._lock:
            if seq < values[_FLOOR]:
                return False
            free = next(i for i in range(_SLOTS, _SLOTS + 2 * self.slots, 2)
                        if values[i] < 0)
            values[free + 1] = time.monotonic()
            values[free] = seq
            values[_STARTED] = seq
        return True

    def finish(self, seq: int) -> None:
        """Unit ``seq`` is through (recorded, or failed to record)."""
        values = self._values
        with self._lock:
            for i in range(_SLOTS, _SLOTS + 2 * self.slots, 2):
                if values[i] == seq:
                    values[i] = -1.0

    # ----- the supervisor -----------------------------------------------------------

    def running(self) -> tuple[int, float] | None:
        """The unit the child runs now (the one it started first, if it runs several) and
        when it started it (``time.monotonic()``, the same clock in every process of a
        host); None between units."""
        now = self.running_all()
        return now[0] if now else None

    def running_all(self) -> list[tuple[int, float]]:
        """Every unit the child runs now and when it started it, first started first."""
        with self._supervisor_lock():
            values = list(self._values[_SLOTS:_SLOTS + 2 * self.slots])
        return sorted((int(values[i]), values[i + 1]) for i in range(0, len(values), 2)
                      if values[i] >= 0)

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
