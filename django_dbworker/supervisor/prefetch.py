"""Units claimed ahead: committed and leased, waiting in the supervisor for a child.

One claim statement then brings several units, and a child gets them in batches: it holds
its running unit and up to ``depth() - 1`` more (``handoff``), so that it starts the next
without waiting for the supervisor. A unit waits only while that helps the throughput:

- Nothing is claimed ahead until units are known to be short: the supervisor keeps as
  many waiting as its children run in about ``WAIT`` seconds (from the smoothed run time
  of recent units), at most ``DBWORKER["PREFETCH"]`` per child here and as many in each
  child.
- Units waiting in a child behind one that ran ``patience()`` seconds come back here.
- A unit that waited here ``HOLD`` seconds (at most a third of the lease) is given back,
  and units count as slow from then on.
- A stopping supervisor (SIGTERM) gives back what waits at once. Meanwhile the leases of
  waiting units are renewed with the running ones.

Giving back is ``unclaim``: the unit returns to the state the claim took it from, its
attempt taken back; it is not a crash. A supervisor killed outright leaves its waiting
units to the reaper, as it does its running ones.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

from . import units
from .units import Unit

#: Seconds of work kept waiting for the children, at the recent run time per unit.
WAIT = 0.05
#: Seconds a unit may wait here before it is given back (capped at a third of the lease).
HOLD = 1.0
#: Least seconds a unit runs before the units queued behind it in a child are taken back.
PATIENCE = 0.01
#: Weight of the newest run time in the smoothed run time (and claim time).
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
        #: Smoothed seconds a claim that brought units took (its round trip to the
        #: database included); 0 until one did.
        self.claim_time = 0.0
        #: Some of the work has per-key concurrency limits (``concurrency_limit``): units
        #: claimed ahead hold their key's places (they count as running), so no more than
        #: ``PREFETCH`` per child are (``cover`` is 0).
        self.limited = False

    def __len__(self) -> int:
        return len(self.waiting)

    def ahead(self) -> int:
        """How many units should wait here now: as many as the children run in ``WAIT``
        seconds, at most ``DBWORKER["PREFETCH"]`` per child; and, beyond that cap, as many
        as they run during a claim (``cover``)."""
        if not self.limit or self.average is None:
            return 0
        if self.average <= 0:
            return self.limit
        claiming = self.concurrency * self.cover()
        return min(self.limit + claiming,
                   int(self.concurrency * WAIT / self.average) + claiming)

    def cover(self) -> int:
        """How many units a child runs while the supervisor claims once, at the recent run
        time and claim time (0 while nothing is claimed ahead). A claim is a round trip to
        the database, and the supervisor feeds no child meanwhile: with the database a few
        milliseconds away, a child holding only the batch it runs would wait for the next
        one that long. So a child is topped up this many units sooner, and as many more
        per child wait here. None where keys are limited (``limited``): the more units
        claimed ahead, the more of a key's places they hold while they wait."""
        if not self.limit or not self.average or self.average <= 0 or self.limited:
            return 0
        return min(self.limit // self.concurrency * 4, int(self.claim_time / self.average))

    def depth(self) -> int:
        """How many units a child should hold at once, running and waiting: one, and while
        units are short as many more as it runs in about ``WAIT`` seconds (at most
        ``DBWORKER["PREFETCH"]``), so that it starts the next without waiting for us."""
        if not self.limit or self.average is None:
            return 1
        per_child = self.limit // self.concurrency
        if self.average <= 0:
            return 1 + per_child
        return 1 + min(per_child, int(WAIT / self.average))

    def patience(self) -> float:
        """Seconds a unit may run before the units waiting behind it in its child are
        taken back (to go to another child, or back to the database)."""
        return min(self.hold, max(PATIENCE, 10 * (self.average or 0.0)))

    def ran(self, seconds: float) -> None:
        """A child finished a unit in ``seconds``."""
        if self.average is None:
            self.average = seconds
        else:
            self.average += SMOOTHING * (seconds - self.average)

    def claimed(self, seconds: float) -> None:
        """A claim that brought units took ``seconds``."""
        if not self.claim_time:
            self.claim_time = seconds
        else:
            self.claim_time += SMOOTHING * (seconds - self.claim_time)

    def put(self, claimed: list[Unit], now: float, *, front: bool = False) -> None:
        """Keep ``claimed`` (in their claim order) until a child has room: behind the units
        waiting already, or, ``front``, before them (units taken back from a child were
        claimed before those)."""
        if front:
            self.waiting.extendleft(Waiting(c, now) for c in reversed(claimed))
        else:
            self.waiting.extend(Waiting(c, now) for c in claimed)

    def take(self, n: int = 1, allowed: Callable[[Unit], bool] | None = None) -> list[Unit]:
        """Up to ``n`` units, oldest first; with ``allowed``, only the units it accepts
        (asked in that order, once each), and the others keep their places."""
        if allowed is None:
            return [self.waiting.popleft().unit for _ in range(min(n, len(self.waiting)))]
        taken: list[Unit] = []
        kept: deque[Waiting] = deque()
        while self.waiting and len(taken) < n:
            w = self.waiting.popleft()
            if allowed(w.unit):
                taken.append(w.unit)
            else:
                kept.append(w)
        kept.extend(self.waiting)
        self.waiting = kept
        return taken

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
