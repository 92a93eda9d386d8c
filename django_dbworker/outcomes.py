"""What a handler returns: ``Finished()`` or ``Unfinished(delay=...)``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


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
        if self.seconds < 0:
            raise ValueError(f"Unfinished(delay={delay!r}): delay must not be negative.")

    @property
    def seconds(self) -> float:
        if self.delay is None:
            return 0.0
        if isinstance(self.delay, timedelta):
            return self.delay.total_seconds()
        return float(self.delay)


type Outcome = Finished | Unfinished
