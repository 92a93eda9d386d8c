"""Units claimed ahead: committed and leased, waiting in the supervisor for a free child.

One claim statement then brings several units, and a child that finishes gets its next
unit from here at once instead of waiting for a claim. A unit waits here only while that
helps the throughput:

- Nothing is claimed ahead until units are known to be short: the supervisor keeps as
  many waiting as its children run in about ``WAIT`` seconds (from the smoothed run time
  of recent units), at most ``DBWORKER["PREFETCH"]`` per child.
- A unit that waited ``HOLD`` seconds (at most a third of the lease) is given back, and
  units count as slow from then on.
- A stopping supervisor (SIGTERM) gives back what waits here at once. Meanwhile the
  leases of waiting units are renewed with the running ones.

Giving back is ``unclaim``: the unit returns to the state the claim took it from, its
attempt taken back; it is not a crash. A supervisor killed outright leaves its waiting
units to the reaper, as it does its running ones.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from . import units
from .units import Unit

#: Seconds of work kept waiting for the children, at the recent run time per unit.
WAIT = 0.05
#: Seconds a unit may wait here before it is given back (capped at a third of the lease).
HOLD = 1.0
#: Weight of the newest run time in the smoothed run time.
SMOOTHING = 0.2


@dataclass(slots=True)
class Waiting:
    unit: Unit
    since: float  # time.monotonic() when it was claimed


class Prefetch:
    def __init__(self, per_child: int, concurrency: int, lease: float) -> None:
        self.concurrency = concurrency
        self.limit = per_child * concurrency
        self.hold = min(HOLD, lease / 3)
        self.waiting: deque[Waiting] = deque()
        #: Smoothed seconds a unit ran in a child; None until one finished.
        self.average: float | None = None

    def __len__(self) -> int:
        return len(self.waiting)

    def ahead(self) -> int:
        """How many units should wait here now."""
        if not self.limit or self.average is None:
            return 0
        if self.average <= 0:
            return self.limit
        return min(self.limit, int(self.concurrency * WAIT / self.average))

    def ran(self, seconds: float) -> None:
        """A child finished a unit in ``seconds``."""
        if self.average is None:
            self.average = seconds
        else:
            self.average += SMOOTHING * (seconds - self.average)

    def put(self, claimed: list[Unit], now: float) -> None:
        self.waiting.extend(Waiting(c, now) for c in claimed)

    def take(self) -> Unit | None:
        return self.waiting.popleft().unit if self.waiting else None

    def expired(self, now: float) -> list[Unit]:
        """Take out the units that waited too long; from now on units count as slow."""
        old = [w.unit for w in self.waiting if now - w.since >= self.hold]
        if old:
            self.waiting = deque(w for w in self.waiting if now - w.since < self.hold)
            self.average = max(self.average or 0.0, self.hold)
        return old

    def next_expiry(self, now: float) -> float | None:
        """Seconds until the oldest waiting unit expires; None when nothing waits."""
        return max(0.0, self.waiting[0].since + self.hold - now) if self.waiting else None

    def units(self) -> list[Unit]:
        return [w.unit for w in self.waiting]

    def drain(self) -> list[Unit]:
        """Take out everything waiting (to give it back)."""
        taken = self.units()
        self.waiting.clear()
        return taken

    def remove(self, unit: Unit) -> None:
        self.waiting = deque(w for w in self.waiting if w.unit is not unit)

    def groups(self) -> Counter[str]:
        """Waiting units per concurrency group (``units.group``)."""
        return Counter(units.group(w.unit) for w in self.waiting)
