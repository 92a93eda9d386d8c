"""What a handler returns: ``Finished()`` or ``Unfinished(delay=...)``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

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
