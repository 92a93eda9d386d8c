"""When a failed attempt runs again: count, exception filter, backoff and jitter. The
policy of a task (``@task(retries=...)``) and of a row worker (``@worker(retries=...)``):
the same options, checked and applied the same way."""

from __future__ import annotations

import math
import random
from datetime import datetime, timedelta
from inspect import isclass
from typing import Any, Protocol

from ..conf import MAX_DELAY

#: A retry delay grows at most by this factor per attempt (``delay * factor ** n`` is a float:
#: the retry delay is capped by ``retry_max_delay``, and this keeps the power finite).
MAX_BACKOFF_FACTOR = 1000.0
#: Attempts after the first, at most (an attempt number is a database integer).
MAX_RETRIES = 1_000_000


class Policy(Protocol):
    """What a retry policy is read from: a task (``DBWorkerTask``) or a row ``Worker``."""

    @property
    def retries(self) -> int: ...
    @property
    def retry_delay(self) -> float | timedelta: ...
    @property
    def retry_backoff(self) -> bool: ...
    @property
    def retry_backoff_factor(self) -> float: ...
    @property
    def retry_max_delay(self) -> float | timedelta: ...
    @property
    def retry_jitter(self) -> bool | float: ...
    @property
    def retry_for(self) -> tuple[type[BaseException], ...]: ...


def check_seconds(where: str, name: str, value: Any, error: type[Exception], *,
                  optional: bool = False) -> None:
    """A duration option: seconds >= 0 (finite) or a timedelta, at most ten years."""
    if optional and value is None:
        return
    given = value
    if isinstance(value, timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0 \
            or not math.isfinite(value):
        raise error(f"{where}: {name}={given!r} must be a number of seconds >= 0 (finite) "
                    "or a timedelta.")
    if value > MAX_DELAY:
        raise error(f"{where}: {name}={given!r} is more than {MAX_DELAY:g} seconds (ten "
                    "years); give a shorter duration.")


def check(where: str, policy: Any, error: type[Exception]) -> tuple[type[BaseException], ...]:
    """Refuse, with ``error`` naming the option, a policy that cannot be applied; return
    its ``retry_for`` as a tuple (one exception class may be given alone)."""
    retries = policy.retries
    if isinstance(retries, bool) or not isinstance(retries, int) \
            or not 0 <= retries <= MAX_RETRIES:
        raise error(f"{where}: retries={retries!r} must be an integer >= 0 and "
                    f"<= {MAX_RETRIES}.")
    check_seconds(where, "retry_delay", policy.retry_delay, error)
    check_seconds(where, "retry_max_delay", policy.retry_max_delay, error)
    factor = policy.retry_backoff_factor
    if isinstance(factor, bool) or not isinstance(factor, int | float) \
            or not 1 <= factor <= MAX_BACKOFF_FACTOR:
        raise error(f"{where}: retry_backoff_factor={factor!r} must be a finite number "
                    f"from 1 to {MAX_BACKOFF_FACTOR:g}.")
    if not isinstance(policy.retry_backoff, bool):
        raise error(f"{where}: retry_backoff={policy.retry_backoff!r} must be True/False.")
    jitter = policy.retry_jitter
    if not isinstance(jitter, bool) and not (isinstance(jitter, int | float)
                                             and 0 <= jitter <= 1):  # (NaN is not)
        raise error(f"{where}: retry_jitter={jitter!r} must be True/False or a fraction "
                    "between 0 and 1.")
    retry_for = policy.retry_for
    if isclass(retry_for):
        retry_for = (retry_for,)
    if not isinstance(retry_for, tuple | list) or not all(
        isclass(c) and issubclass(c, BaseException) for c in retry_for
    ):
        raise error(f"{where}: retry_for={policy.retry_for!r} must be a tuple of exception "
                    "classes.")
    return tuple(retry_for)


def should_retry(task: Policy, attempt: int, exc: BaseException) -> bool:
    """Retry after attempt number ``attempt`` (1-based) failed with ``exc``?"""
    return attempt <= task.retries and isinstance(exc, tuple(task.retry_for))


def delay(task: Policy, attempt: int, rng: random.Random | None = None) -> float:
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
