"""The ``DBWORKER`` setting: defaults, types and validation."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed

from .tasks.rates import parse_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """The keys of ``settings.DBWORKER`` and their defaults."""

    #: Database alias holding our tables and the queue.
    DATABASE: str = "default"
    #: Seconds a claim stays valid without renewal; the supervisor renews every third of it.
    LEASE_SECONDS: float = 30.0
    #: Seconds between two heartbeats of a supervisor (at most a third of LEASE_SECONDS).
    #: One that misses three in a row (6 s by default, by the database's clock) is dead, and
    #: another supervisor takes its units back at once instead of waiting for their leases
    #: (PostgreSQL, MariaDB, MySQL; on SQLite the lease stays the bound and the heartbeat
    #: comes every third of it). Raise it to make a busy database or a slow network less
    #: likely to make a live one look dead; a third of LEASE_SECONDS leaves the takeover to
    #: the lease. See docs/operations.md.
    HEARTBEAT_INTERVAL: float = 2.0
    #: Seconds between claim attempts when there was nothing to claim (and no wake-up).
    POLL_INTERVAL: float = 1.0
    #: PostgreSQL: NOTIFY on new work and LISTEN in supervisors (turn off behind a
    #: transaction-pooling PgBouncer, which cannot LISTEN; polling remains; runworkers
    #: does not LISTEN where it detects one: db/pooler.py, check W005).
    NOTIFY: bool = True
    #: PostgreSQL: our own status statements (claims, task completions, row completions in
    #: a transaction that wrote nothing else) commit without waiting for the WAL flush
    #: (``synchronous_commit = off`` for their transaction only). A database crash may
    #: forget the last fraction of a second of them: those units run again, as after a lost
    #: lease. A handler's writes always wait. See docs/operations.md.
    ASYNC_COMMIT: bool = True
    #: PostgreSQL: the statements each row unit runs (its source-row read, its completion)
    #: are prepared once per connection of a runworkers child, so the server does not parse
    #: and plan them every time (turn off behind a transaction-pooling PgBouncer; off
    #: where runworkers detects one). See docs/operations.md.
    PREPARED_STATEMENTS: bool = True
    #: Seconds running handlers get to finish after SIGTERM before they are cut off.
    GRACE_PERIOD: float = 30.0
    #: Seconds runworkers keeps trying to reach the database at start-up (a database
    #: starting beside it, failing over, a dropped connection) before it gives up; 0: once.
    STARTUP_WAIT: float = 60.0
    #: Times a unit may kill its process (or lose its lease) before it is marked FAILED.
    MAX_CRASHES: int = 3
    #: Seconds between passes that find source rows written without ``Model.save()``
    #: above each worker's watermark (integer primary keys; one indexed query when there
    #: are none). See docs/workers.md.
    SWEEP_INTERVAL: float = 2.0
    #: Seconds between full passes over every source row and execution (rows made eligible
    #: by ``update()``, keys below the watermark, sources without integer keys, executions
    #: of rows deleted without the ORM); None: only the first one.
    FULL_SWEEP_INTERVAL: float | None = 3600.0
    #: Source rows (then executions) looked at per sweep step.
    SWEEP_BATCH: int = 1000
    #: Child processes per supervisor when ``runworkers --concurrency`` is not given.
    CONCURRENCY: int = max(os.cpu_count() or 1, 1)
    #: Units per child the supervisor may claim ahead of free children, and a child's batch
    #: size minus one, while recent units ran briefly (0: one unit at a time, claimed for
    #: free children only). See supervisor/prefetch.py.
    PREFETCH: int = 32
    #: Async units (``async def`` tasks and non-transactional row handlers) a child runs
    #: at once on its event loop; 1: one at a time. See units/aio.py.
    ASYNC_CONCURRENCY: int = 10
    #: Units a child runs before it is replaced (``None``: never replaced).
    MAX_TASKS_PER_CHILD: int | None = None
    #: Seconds a SQLite connection waits for the write lock before giving up.
    SQLITE_BUSY_TIMEOUT: float = 30.0
    #: Largest JSON return value a task may store, in bytes; larger ones fail the task.
    RESULT_MAX_BYTES: int = 1_000_000
    #: Largest JSON of a task's arguments (args and kwargs together), in bytes; a larger
    #: ``enqueue()`` raises InvalidTaskArguments and stores nothing.
    ARGUMENTS_MAX_BYTES: int = 1_000_000
    #: Resident memory, in MiB, above which a child is replaced once its current unit is
    #: through (a leaking handler cannot grow a child for ever); None: never replaced for it.
    CHILD_MAX_MEMORY_MB: int | None = 2048
    #: Finished tasks older than this many seconds (or timedelta) are pruned; None keeps all.
    RETENTION: float | timedelta | None = 7 * 24 * 3600.0
    #: Start rate of all tasks together across all supervisors, e.g. "100/s"; None: no limit.
    TASK_RATE_LIMIT: str | None = None
    #: Cron schedules: {name: {"task": "app.tasks.f", "cron": "*/5 * * * *", ...}}.
    SCHEDULES: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: How runworkers writes its log: "text" (key=value) or "json" (one object per line).
    LOG_FORMAT: str = "text"
    #: The health view answers 503 when a worker or queue waited longer than this many
    #: seconds (None: lag is not checked)...
    HEALTH_MAX_LAG: float | None = 300.0
    #: ...or when fewer supervisors than this are alive.
    HEALTH_MIN_SUPERVISORS: int = 1
    #: The health view warns (without answering 503) when another connection's
    #: transaction has been open longer than this many seconds: it holds back the cleanup
    #: of dead rows (PostgreSQL's MVCC horizon, InnoDB's purge). None: not checked.
    HEALTH_MAX_TRANSACTION_AGE: float | None = 300.0
    #: The metrics view adds prometheus_client's process_*, python_info and python_gc_*
    #: metrics, which describe the web process serving the scrape (not the workers).
    METRICS_PROCESS: bool = True


_NUMBERS = (int, float)
LOG_FORMATS = ("text", "json")
#: The longest duration any setting of seconds may hold (one year): a longer lease, poll,
#: grace period or busy timeout is a typo, and ``now + timedelta(seconds=...)`` of a huge one
#: overflows a datetime.
MAX_SECONDS = 365 * 24 * 3600.0
#: The longest delay of anything scheduled ahead (a retry, ``Unfinished(delay=...)``, a
#: task's ``run_after`` timedelta or timeout): ten years; ``now + timedelta(seconds=1e12)``
#: overflows a datetime.
MAX_DELAY = 10 * MAX_SECONDS
#: RETENTION may be longer (100 years); ``now - RETENTION`` must stay a datetime.
MAX_RETENTION = 100 * 365 * 24 * 3600.0
#: SQLite takes its busy timeout in milliseconds as a C int.
MAX_SQLITE_BUSY_TIMEOUT = (2**31 - 1) / 1000
#: The largest count any integer setting may hold (a database integer).
MAX_COUNT = 2**31 - 1
#: Child processes per supervisor, at most (each one is a process and a connection).
MAX_CONCURRENCY = 1000
_LIMITS = {"RETENTION": (MAX_RETENTION, "100 years"),
           "SQLITE_BUSY_TIMEOUT": (MAX_SQLITE_BUSY_TIMEOUT, "SQLite's limit")}
_POSITIVE = {"LEASE_SECONDS", "HEARTBEAT_INTERVAL", "POLL_INTERVAL", "SWEEP_INTERVAL",
             "FULL_SWEEP_INTERVAL", "SQLITE_BUSY_TIMEOUT"}
_NULLABLE = {
    "MAX_TASKS_PER_CHILD", "CHILD_MAX_MEMORY_MB", "RETENTION", "FULL_SWEEP_INTERVAL",
    "TASK_RATE_LIMIT", "HEALTH_MAX_LAG", "HEALTH_MAX_TRANSACTION_AGE",
}
_AT_LEAST_ONE = {
    "MAX_CRASHES", "SWEEP_BATCH", "CONCURRENCY", "MAX_TASKS_PER_CHILD", "RESULT_MAX_BYTES",
    "ARGUMENTS_MAX_BYTES", "CHILD_MAX_MEMORY_MB", "ASYNC_CONCURRENCY",
}


def _check(key: str, value: Any) -> None:
    where = f"settings.DBWORKER[{key!r}]"
    raw = value
    if key == "DATABASE":
        if not isinstance(value, str) or value not in settings.DATABASES:
            raise ImproperlyConfigured(
                f"{where} is {value!r}; it must name a database in settings.DATABASES "
                f"({', '.join(sorted(settings.DATABASES))})."
            )
        return
    if key in _NULLABLE and value is None:
        return
    if key == "LOG_FORMAT":
        if value not in LOG_FORMATS:
            raise ImproperlyConfigured(
                f"{where} is {value!r}; it must be one of {', '.join(map(repr, LOG_FORMATS))}."
            )
        return
    if key in ("HEALTH_MIN_SUPERVISORS", "PREFETCH"):
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_COUNT:
            raise ImproperlyConfigured(
                f"{where} is {value!r}; it must be an integer >= 0 and <= {MAX_COUNT}."
            )
        return
    if key == "RETENTION" and isinstance(value, timedelta):
        value = value.total_seconds()
    if key == "TASK_RATE_LIMIT":
        try:
            parse_rate(value)
        except ValueError as exc:
            raise ImproperlyConfigured(f"{where}: {exc}") from None
        return
    if key in ("NOTIFY", "ASYNC_COMMIT", "PREPARED_STATEMENTS", "METRICS_PROCESS"):
        if not isinstance(value, bool):
            raise ImproperlyConfigured(f"{where} is {value!r}; it must be True or False.")
        return
    if key == "SCHEDULES":
        if not isinstance(value, dict):
            raise ImproperlyConfigured(
                f"{where} is {type(value).__name__}; it must be a dict of schedules by name."
            )
        return
    if key in _AT_LEAST_ONE:
        most = MAX_CONCURRENCY if key in ("CONCURRENCY", "ASYNC_CONCURRENCY") else MAX_COUNT
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
            raise ImproperlyConfigured(
                f"{where} is {value!r}; it must be an integer >= 1 and <= {most}."
            )
        return
    if isinstance(value, bool) or not isinstance(value, _NUMBERS):
        raise ImproperlyConfigured(f"{where} is {value!r}; it must be a number of seconds.")
    if not math.isfinite(value):
        raise ImproperlyConfigured(
            f"{where} is {value!r}; it must be a finite number of seconds."
        )
    limit, told = _LIMITS.get(key, (MAX_SECONDS, "one year"))
    if value > limit:
        raise ImproperlyConfigured(
            f"{where} is {raw!r}; it must be at most {limit:g} seconds ({told})."
        )
    if key in _POSITIVE | {"RETENTION", "HEALTH_MAX_LAG", "HEALTH_MAX_TRANSACTION_AGE"} \
            and value <= 0:
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


_cached: Config | None = None


def get() -> Config:
    """The validated configuration, cached until a setting changes (override_settings)."""
    global _cached
    if _cached is None:
        _cached = load()
    return _cached


def _forget(*, setting: str, **kwargs: Any) -> None:
    global _cached
    if setting in ("DBWORKER", "DATABASES", "TIME_ZONE"):
        _cached = None


setting_changed.connect(_forget, dispatch_uid="dbworker-conf")
