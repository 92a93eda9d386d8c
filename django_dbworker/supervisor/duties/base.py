"""The shape of a duty, the one timer they share, and the loop that runs what is due.

A duty says whether it is due at ``now`` and does its work when run (Oban's plugins, River's
maintenance services). ``now`` comes from one clock, a callable returning monotonic
seconds, so tests drive duties with a fake one.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import ClassVar, Protocol

from django.db import DatabaseError

from ...db import errors
from ...logs import log_event

type Clock = Callable[[], float]

#: Seconds between two log lines of the same failing duty.
FAILURE_LOG_INTERVAL = 60.0


class Duty(Protocol):
    @property
    def name(self) -> str:
        """A word for log lines: ``duty_failed duty=<name>`` (a class attribute will do)."""
        ...

    def due(self, now: float) -> bool: ...

    def run(self, now: float) -> None: ...


class Every:
    """Due once ``interval`` seconds passed since it last ran; due at once when new."""

    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.next = -math.inf

    def due(self, now: float) -> bool:
        return now >= self.next

    def ran(self, now: float) -> None:
        self.next = now + self.interval

    def again(self) -> None:
        """Due at the next look, not an interval later."""
        self.next = -math.inf

    def left(self, now: float) -> float:
        """Seconds until due; 0 or less when due."""
        return self.next - now


class Periodic:
    """A duty due every ``interval`` seconds, counted from the start of its last run.

    A run that raised a ``DatabaseError`` is due again at once (after the supervisor's
    outage back-off): what it did not do is still to be done.
    """

    name: ClassVar[str]

    def __init__(self, interval: float) -> None:
        self.every = Every(interval)

    def due(self, now: float) -> bool:
        return self.every.due(now)

    def left(self, now: float) -> float:
        """Seconds until due; 0 or less when due."""
        return self.every.left(now)

    def run(self, now: float) -> None:
        self.every.ran(now)
        try:
            self.work(now)
        except DatabaseError:
            self.every.again()
            raise

    def work(self, now: float) -> None:
        raise NotImplementedError


class Duties:
    """Runs the duties that are due, in their order (the supervisor's loop calls it).

    A ``DatabaseError`` stops the round and goes up to the supervisor's outage back-off, as
    the claims after the duties would fail on it too; one that another transaction's lock
    caused (``errors.transient``: SQLite's write lock, a deadlock) only defers its duty to
    a later round (``duty_deferred``, at most once per ``FAILURE_LOG_INTERVAL``). Anything
    else a duty raises is logged (``duty_failed``, at most once per ``FAILURE_LOG_INTERVAL``
    per duty) and the next duty runs: a broken duty never stops ``runworkers``.
    """

    def __init__(self, duties: Sequence[Duty], clock: Clock = time.monotonic) -> None:
        self.duties = list(duties)
        self.clock = clock
        self._logged = {duty.name: Every(FAILURE_LOG_INTERVAL) for duty in self.duties}

    def run_due(self) -> bool:
        """Run the duties due now; whether any was."""
        now = self.clock()
        ran = False
        for duty in self.duties:
            if not duty.due(now):
                continue
            ran = True
            try:
                duty.run(now)
            except DatabaseError as exc:
                if not errors.transient(exc):
                    raise
                # Another transaction's lock (SQLite's write lock past the loop's wait, a
                # deadlock): not an outage; due again at once (``Periodic.run``).
                self._said(logging.INFO, "duty_deferred", duty, exc, now)
            except Exception as exc:
                self._said(logging.ERROR, "duty_failed", duty, exc, now)
        return ran

    def _said(self, level: int, event: str, duty: Duty, exc: Exception, now: float) -> None:
        """Log what befell ``duty``, at most once per ``FAILURE_LOG_INTERVAL`` per duty."""
        logged = self._logged[duty.name]
        if logged.due(now):
            logged.ran(now)
            log_event(level, event, duty=duty.name,
                      error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                      next_log_in=FAILURE_LOG_INTERVAL)
