"""When a failed task attempt runs again: count, exception filter, backoff and jitter."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from ..conf import MAX_DELAY

if TYPE_CHECKING:
    from ..backend import DBWorkerTask


def should_retry(task: DBWorkerTask, attempt: int, exc: BaseException) -> bool:
    """Retry after attempt number ``attempt`` (1-based) failed with ``exc``?"""
    return attempt <= task.retries and isinstance(exc, tuple(task.retry_for))


def delay(task: DBWorkerTask, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based)."""
    longest = _seconds(task.retry_max_delay)
    base = _seconds(task.retry_delay)
    if task.retry_backoff:
        try:
            base *= float(task.retry_backoff_factor) ** (attempt - 1)
        except OverflowError:  # many attempts: far beyond any maximum
            base = longest
    if not base <= longest:  # (NaN or inf too)
        base = longest
    jitter = task.retry_jitter
    if jitter:
        fraction = 1.0 if jitter is True else float(jitter)
        base -= (rng or random).uniform(0, base * fraction)
    return max(base, 0.0)


def at(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds``, capped at ``conf.MAX_DELAY`` seconds (and the last datetime),
    so no retry delay, however it was come by, overflows."""
    if not 0 <= seconds <= MAX_DELAY:
        seconds = MAX_DELAY if seconds > 0 or seconds != seconds else 0.0
    try:
        return now + timedelta(seconds=seconds)
    except OverflowError:
        return datetime.max.replace(tzinfo=now.tzinfo) - timedelta(days=2)


def _seconds(value: object) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)  # type: ignore[arg-type]
