"""What a handler returns: ``Finished()`` or ``Unfinished(delay=...)``; what a task raises to
run later without using an attempt: ``Snooze(seconds)``; and ``RunOutcome``, what became of
one run of a unit, as it is logged and counted."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum

from .conf import MAX_DELAY


@dataclass(frozen=True, slots=True)
class Finished:
    """The unit is done: it will not be offered again without an explicit reset."""


@dataclass(frozen=True, slots=True)
class Unfinished:
    """Call the handler again for this unit later, not before ``delay`` has passed.

    ``delay`` is seconds or a ``timedelta``, at most ten years (None: it may be claimed
    again at once). A bad one raises ``TypeError`` or ``ValueError`` naming it.
    """

    #: Seconds or a timedelta; None: no delay.
    delay: float | timedelta | None = None

    def __post_init__(self) -> None:
        if self.delay is not None:
            _checked_seconds(self.delay, f"Unfinished(delay={self.delay!r})")

    @property
    def seconds(self) -> float:
        """The delay in seconds (0.0 without one)."""
        if self.delay is None:
            return 0.0
        if isinstance(self.delay, timedelta):
            return self.delay.total_seconds()
        return float(self.delay)


type Outcome = Finished | Unfinished
"""What a handler returns: ``Finished()`` or ``Unfinished()`` (for type hints)."""


def _checked_seconds(delay: object, where: str) -> float:
    """``delay`` (seconds or a timedelta) as seconds, or the error naming it and the fix."""
    if isinstance(delay, bool) or not isinstance(delay, int | float | timedelta):
        raise TypeError(f"{where}: delay must be a number of seconds or a timedelta.")
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{where}: delay must be a finite number of seconds >= 0.")
    if seconds > MAX_DELAY:
        raise ValueError(
            f"{where}: delay must be at most {MAX_DELAY:g} seconds (ten years); a longer one "
            "overflows the date of the next attempt."
        )
    return seconds


class Snooze(Exception):
    """Raised by a task: "not now, run me again in ``delay``" (seconds or a timedelta).

    The task goes back to READY, available after the delay, without using an attempt and
    without an entry in its errors; its ``snoozes`` count goes up by one. More than the
    task's ``max_snoozes`` (default 100) and a snooze counts as a failed attempt
    (``SnoozeLimitExceeded``), retried like any other. A bad delay raises ``TypeError`` or
    ``ValueError`` here, naming it: that attempt fails with that message.

    A row-as-queue handler may raise it too: its execution becomes UNFINISHED as with
    ``Unfinished(delay=...)``, but a transactional handler's writes are rolled back.
    """

    def __init__(self, delay: float | timedelta) -> None:
        #: The delay in seconds.
        self.seconds = _checked_seconds(delay, f"Snooze({delay!r})")
        #: The delay as given.
        self.delay = delay
        super().__init__(delay)

    def __str__(self) -> str:
        return f"snoozed for {self.seconds:g} seconds"


class RunOutcome(StrEnum):
    """What became of one run of a unit (an execution or a task), as data: the event name
    of its log line and the key of the supervisor's counts. In the order people see them.
    Its members are strings, equal to the names written before it existed."""

    #: The handler returned ``Finished()``: the execution is FINISHED.
    FINISHED = "finished"
    #: The task returned: it is SUCCESSFUL.
    SUCCESSFUL = "successful"
    #: The handler returned ``Unfinished()``: the execution is UNFINISHED, to be run again.
    UNFINISHED = "unfinished"
    #: The task raised ``Snooze``: READY again after its delay, no attempt used.
    SNOOZED = "snoozed"
    #: The task raised and has retries left: it is RETRYING.
    RETRYING = "retrying"
    #: The handler or task raised (for good, for a task): FAILED, the failure recorded.
    FAILED = "failed"
    #: The execution's source row was deleted, before its handler ran (nothing ran) or
    #: while it ran (its execution went with it; a transactional handler's writes were
    #: rolled back, unless the handler deleted the row itself): nothing is recorded.
    GONE = "gone"
    #: The claim was lost (lease expired, taken over, cancelled): nothing was recorded.
    LEASE_LOST = "lease_lost"
    #: The process running it died; the unit was released (FAILED after ``MAX_CRASHES``).
    CRASHED = "crashed"


@dataclass(frozen=True, slots=True)
class Result:
    """One run of a unit, as its runner reports it (``rows.runner``, ``tasks.runner``) and
    the supervisor counts it."""

    unit_id: int | str
    worker: str
    outcome: RunOutcome
    seconds: float
    error: str = ""
