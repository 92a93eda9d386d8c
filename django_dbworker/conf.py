"""The ``DBWORKER`` setting: defaults, types and validation."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    #: Database alias holding our tables and the queue.
    DATABASE: str = "default"
    #: Seconds a claim stays valid without renewal; the supervisor renews every third of it.
    LEASE_SECONDS: float = 30.0
    #: Seconds between claim attempts when there was nothing to claim.
    POLL_INTERVAL: float = 1.0
    #: Seconds running handlers get to finish after SIGTERM before they are cut off.
    GRACE_PERIOD: float = 30.0
    #: Times a unit may kill its process (or lose its lease) before it is marked FAILED.
    MAX_CRASHES: int = 3
    #: Seconds between sweeps that find source rows written without ``Model.save()``.
    SWEEP_INTERVAL: float = 60.0
    #: Source rows looked at per sweep statement.
    SWEEP_BATCH: int = 1000
    #: Child processes per supervisor when ``runworkers --concurrency`` is not given.
    CONCURRENCY: int = max(os.cpu_count() or 1, 1)
    #: Units a child runs before it is replaced (``None``: never replaced).
    MAX_TASKS_PER_CHILD: int | None = None
    #: Seconds a SQLite connection waits for the write lock before giving up.
    SQLITE_BUSY_TIMEOUT: float = 30.0


_NUMBERS = (int, float)
_POSITIVE = {"LEASE_SECONDS", "POLL_INTERVAL", "SWEEP_INTERVAL", "SQLITE_BUSY_TIMEOUT"}
_AT_LEAST_ONE = {"MAX_CRASHES", "SWEEP_BATCH", "CONCURRENCY", "MAX_TASKS_PER_CHILD"}


def _check(key: str, value: Any) -> None:
    where = f"settings.DBWORKER[{key!r}]"
    if key == "DATABASE":
        if not isinstance(value, str) or value not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"{where} is {value!r}; it must name a database in settings.DATABASES "
                f"({', '.join(sorted(settings.DATABASES))})."
            )
        return
    if key == "MAX_TASKS_PER_CHILD" and value is None:
        return
    if key in _AT_LEAST_ONE:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ImproperlyConfigured(f"{where} is {value!r}; it must be an integer >= 1.")
        return
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        raise ImproperlyConfigured(f"{where} is {value!r}; it must be a number of seconds.")
    if key in _POSITIVE and value <= 0:
        raise ImproperlyConfigured(f"{where} is {value!r}; it must be greater than 0.")
    if value < 0:
        raise ImproperlyConfigured(f"{where} is {value!r}; it must not be negative.")


def load() -> Config:
    """Read and validate ``settings.DBWORKER``; raise ImproperlyConfigured naming the key."""
    raw = getattr(settings, "DBWORKER", {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(
            f"settings.DBWORKER must be a dict, not {type(raw).__name__}."
        )
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ImproperlyConfigured(
            f"settings.DBWORKER has unknown keys {', '.join(map(repr, unknown))}; "
            f"known keys are {', '.join(sorted(known))}."
        )
    for key, value in raw.items():
        _check(key, value)
    return Config(**raw)


def get() -> Config:
    """The validated configuration (read anew each call, so override_settings works)."""
    return load()
