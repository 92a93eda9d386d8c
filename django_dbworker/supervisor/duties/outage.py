"""The back-off while the database fails the supervisor, and one line once it answers."""

from __future__ import annotations

import logging
import time

from ...logs import log_event
from .base import Clock

FIRST_BACKOFF = 0.5
MAX_BACKOFF = 30.0


class Outage:
    """How long to wait after a failed round: 0.5 s, doubling up to 30 s (``longest``),
    back to 0 after a round that went through; since when and how often the database failed
    us. ``part`` names, in its log lines, a part other than the main loop (``renewer``)."""

    def __init__(self, clock: Clock = time.monotonic, *, longest: float = MAX_BACKOFF,
                 part: str | None = None) -> None:
        self.clock = clock
        self.longest = longest
        self.context = {} if part is None else {"part": part}
        self.backoff = 0.0
        #: Since when (``clock``) and how many times in a row the database failed us.
        self.since: float | None = None
        self.attempts = 0

    def failed(self, exc: Exception) -> float:
        """Log the error; returns the seconds to wait before the next round."""
        if self.since is None:
            self.since = self.clock()
        self.attempts += 1
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
        if self.since is None or not connected:
            return
        log_event(logging.WARNING, "reconnected", down_for=round(self.clock() - self.since, 2),
                  attempts=self.attempts, **self.context)
        self.since = None
        self.attempts = 0
