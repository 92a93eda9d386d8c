"""When a failed task attempt runs again: count, exception filter, backoff and jitter."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .backend import DBWorkerTask


def should_retry(task: DBWorkerTask, attempt: int, exc: BaseException) -> bool:
    """Retry after attempt number ``attempt`` (1-based) failed with ``exc``?"""
    return attempt <= task.retries and isinstance(exc, tuple(task.retry_for))


def delay(task: DBWorkerTask, attempt: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before the attempt after ``attempt`` (1-based)."""
    base = _seconds(task.retry_delay)
    if task.retry_backoff:
        base *= task.retry_backoff_factor ** (attempt - 1)
    base = min(base, _seconds(task.retry_max_delay))
    jitter = task.retry_jitter
    if jitter:
        fraction = 1.0 if jitter is True else float(jitter)
        base -= (rng or random).uniform(0, base * fraction)
    return max(base, 0.0)


def _seconds(value: object) -> float:
    from datetime import timedelta

    return value.total_seconds() if isinstance(value, timedelta) else float(value)  # type: ignore[arg-type]
