"""The back-off while the database fails the supervisor, and one line once it answers."""

from __future__ import annotations

import logging
import time

from ...logs import log_event
from .base import Clock

FIRST_BACKOFF = 0.5
#: The longest wait: a restart or a failover is usually over in seconds, and a supervisor
#: that waited 30 s after a failed round found the database back up to 30 s late (a
#: connection attempt every 5 s to a database that is down costs nothing).
MAX_BACKOFF = 5.0


class Outage:
    """How long to wait after a failed round: 0.5 s, doubling up to 5 s (``longest``),
    back to 0 after a round that went through; since when and how often the database failed
    us. It doubles only after a wait that was waited out: a round that failed again sooner
    (the supervisor woke early: a child reported, a signal) keeps the wait it had, or a
    burst of such rounds at the start of an outage would reach the longest wait at once.
    ``part`` names, in its log lines, a part other than the main loop (``renewer``)."""

    def __init__(self, clock: Clock = time.monotonic, *, longest: float = MAX_BACKOFF,
                 part: str | None = None) -> None:
        self.clock = clock
        self.longest = longest
        self.context = {} if part is None else {"part": part}
        self.backoff = 0.0
        #: Since when (``clock``) and how many times in a row the database failed us.
        self.since: float | None = None
        self.attempts = 0
        #: When the last round failed (``clock``).
        self.last: float | None = None

    def failed(self, exc: Exception) -> float:
        """Log the error; returns the seconds to wait before the next round."""
        now = self.clock()
        if self.since is None:
            self.since = now
        self.attempts += 1
        waited = self.last is None or now - self.last >= self.backoff
        self.last = now
        if not waited:  # woken early: counted (``attempts``), said by the next full wait
            return self.backoff
        self.backoff = min(max(self.backoff * 2, FIRST_BACKOFF), self.longest)
        log_event(logging.WARNING, "database_error", error=str(exc).strip()[:300],
                  retry_in=self.backoff, **self.context)
        return self.backoff

    def went_through(self, connected: bool) -> None:
        """A round went through. After errors, say once that the database answers again
        if the round used a connection (``connected``: one is open, opened since the
        failure closed the last). At the level of ``database_error``, so whoever sees
        that one sees this too."""
        self.backoff = 0.0
        self.last = None
        if self.since is None or not connected:
            return
        log_event(logging.WARNING, "reconnected", down_for=round(self.clock() - self.since, 2),
                  attempts=self.attempts, **self.context)
        self.since = None
        self.attempts = 0
