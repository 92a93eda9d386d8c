"""What a handler returns: ``Finished()`` or ``Unfinished(delay=...)``; and ``RunOutcome``,
what became of one run of a unit, as it is logged and counted."""

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
    """Call the handler again for this unit later, not before ``delay`` has passed."""

    delay: float | timedelta | None = None

    def __post_init__(self) -> None:
        delay = self.delay
        if delay is None:
            return
        if isinstance(delay, bool) or not isinstance(delay, int | float | timedelta):
            raise TypeError(
                f"Unfinished(delay={delay!r}): delay must be a number of seconds or a "
                "timedelta."
            )
        seconds = self.seconds
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"Unfinished(delay={delay!r}): delay must be a finite number of seconds >= 0."
            )
        if seconds > MAX_DELAY:
            raise ValueError(
                f"Unfinished(delay={delay!r}): delay must be at most {MAX_DELAY:g} seconds "
                "(ten years); a longer one overflows the date of the next attempt."
            )

    @property
    def seconds(self) -> float:
        if self.delay is None:
            return 0.0
        if isinstance(self.delay, timedelta):
            return self.delay.total_seconds()
        return float(self.delay)


type Outcome = Finished | Unfinished


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
    #: The task raised and has retries left: it is RETRYING.
    RETRYING = "retrying"
    #: The handler or task raised (for good, for a task): FAILED, the failure recorded.
    FAILED = "failed"
    #: The execution's source row was deleted: the execution is removed, nothing ran.
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
