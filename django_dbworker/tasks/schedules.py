"""Cron schedules: ``@cron("*/5 * * * *")`` over a task, or ``DBWORKER["SCHEDULES"]``.

Every supervisor computes the ticks that came due and enqueues each with the idempotency
key ``cron:<name>:<tick>``; the unique key makes every tick run once however many
supervisors run, with no leader. Ticks missed while nothing ran follow the misfire policy:
``skip`` (the default) forgets them, ``latest`` enqueues the last one, ``all`` every one,
looking back at most ``misfire_window`` seconds (at most ``MAX_MISFIRE_WINDOW``), at most
``Scheduler.MISSED_PER_ROUND`` of them per round (the rest in the next rounds).

A schedule is validated where it is declared (``@cron``, and the system check E004 for
``DBWORKER["SCHEDULES"]``): its cron expression must fire, its arguments must be JSON, its
task must be registered (E004 only: tasks are registered as their modules are imported).
One that still fails at run time (its enqueue raising) is logged and skipped, never
stopping the supervisor or the other schedules.

Schedules stored in the database (``StoredSchedule`` rows, ``stored_schedules.py``) join
them at run time: a supervisor's ``Scheduler`` (``scheduler.py``) reads the enabled rows
every round, and a new or edited row counts its ticks from its last save. A code schedule
wins a name clash. This module holds the declarations, checked without a database.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from .. import conf
from ..djtasks import Task
from .arguments import has_nul, plain

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,60}$")
MISFIRE = ("skip", "latest", "all")
#: The longest misfire_window: 31 days (a month of missed ticks is the most worth catching up).
MAX_MISFIRE_WINDOW = 31 * 86400.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    name: str
    task_path: str
    cron: str
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    timezone: str | None = None
    misfire: str = "skip"
    misfire_window: float = 3600.0

    def zone(self) -> ZoneInfo:
        return ZoneInfo(self.timezone or settings.TIME_ZONE or "UTC")

    def ticks(self, after: datetime, until: datetime, limit: int = 10_000) -> list[datetime]:
        """Ticks in (after, until], at most ``limit`` (the first ones), as aware datetimes
        in the schedule's zone."""
        from croniter import croniter  # only where schedules exist: 4.7 MB in every process

        zone = self.zone()
        it = croniter(self.cron, after.astimezone(zone))
        found: list[datetime] = []
        while len(found) < limit and (tick := it.get_next(datetime)) <= until:
            found.append(tick)
        return found

    def next(self, after: datetime) -> datetime:
        """The first tick after ``after`` (the next run shown by the admin and the CLI)."""
        from croniter import croniter

        return croniter(self.cron, after.astimezone(self.zone())).get_next(datetime)

    def previous(self, before: datetime) -> datetime:
        """The last tick before ``before``."""
        from croniter import croniter

        return croniter(self.cron, before.astimezone(self.zone())).get_prev(datetime)

    def key(self, tick: datetime) -> str:
        return f"cron:{self.name}:{tick.astimezone(ZoneInfo('UTC')).isoformat()}"


_declared: dict[str, Schedule] = {}


def validate(schedule: Schedule) -> None:
    """Raise ImproperlyConfigured naming the schedule and what is wrong with it."""
    from croniter import croniter

    where = f"Schedule {schedule.name!r}"
    if not isinstance(schedule.name, str) or not NAME_RE.match(schedule.name):
        raise ImproperlyConfigured(f"{where}: names use letters, digits and _.:- (1-60).")
    if not isinstance(schedule.task_path, str) or not schedule.task_path:
        raise ImproperlyConfigured(
            f"{where}: task={schedule.task_path!r} must be the dotted path of a task."
        )
    if (problem := cron_syntax_problem(schedule.cron)) is not None:
        raise ImproperlyConfigured(f"{where}: {problem}")
    if schedule.misfire not in MISFIRE:
        raise ImproperlyConfigured(
            f"{where}: misfire={schedule.misfire!r}; use one of {', '.join(MISFIRE)}."
        )
    window = schedule.misfire_window
    if isinstance(window, bool) or not isinstance(window, int | float) \
            or not math.isfinite(window) or not 0 < window <= MAX_MISFIRE_WINDOW:
        raise ImproperlyConfigured(
            f"{where}: misfire_window={window!r} must be a number of seconds > 0 and at "
            f"most {MAX_MISFIRE_WINDOW:g} (31 days), or a timedelta."
        )
    try:
        zone = schedule.zone()
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ImproperlyConfigured(f"{where}: unknown time zone {schedule.timezone!r}.") from None
    try:
        croniter(schedule.cron, datetime.now(zone)).get_next(datetime)
    except (ValueError, OverflowError, KeyError, TypeError):  # CroniterBadDateError
        raise ImproperlyConfigured(
            f"{where}: {schedule.cron!r} never fires (no date matches it, e.g. February "
            "30th); fix the day and month fields."
        ) from None
    _check_arguments(where, schedule.args, schedule.kwargs)


def cron_syntax_problem(expression: Any) -> str | None:
    """Why ``expression`` is not a cron expression (croniter's reason and the fix), or None."""
    from croniter import croniter

    if isinstance(expression, str) and croniter.is_valid(expression):
        return None
    reason = "it is not text"
    if isinstance(expression, str):
        try:
            croniter(expression)
        except (ValueError, KeyError, TypeError, OverflowError) as exc:  # CroniterBadCronError
            reason = str(exc).strip() or type(exc).__name__
    return (f"{expression!r} is not a valid cron expression ({reason}); give five fields, "
            "or six with seconds last, e.g. '*/5 * * * *'.")


def _check_arguments(where: str, args: Any, kwargs: Any) -> None:
    """A schedule's args and kwargs must be what ``enqueue()`` would store."""
    if not isinstance(args, list | tuple):
        raise ImproperlyConfigured(f"{where}: args={args!r} must be a list.")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        raise ImproperlyConfigured(f"{where}: kwargs={kwargs!r} must be a dict with string keys.")
    try:
        text = json.dumps([plain(list(args)), plain(kwargs)], allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"{where}: its args/kwargs cannot be stored as JSON ({exc}); give plain values "
            "(strings, numbers, lists, dicts)."
        ) from None
    if has_nul(list(args)) or has_nul(kwargs):
        raise ImproperlyConfigured(
            f"{where}: its args/kwargs contain a NUL character (U+0000), which PostgreSQL "
            "cannot store; remove it."
        )
    limit = conf.get().ARGUMENTS_MAX_BYTES
    if len(text) > limit:
        raise ImproperlyConfigured(
            f"{where}: its args/kwargs are {len(text)} bytes of JSON, more than "
            f"DBWORKER['ARGUMENTS_MAX_BYTES'] ({limit})."
        )


def cron(
    expression: str,
    *,
    name: str | None = None,
    args: list[Any] | tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    timezone: str | None = None,
    misfire: str = "skip",
    misfire_window: float | timedelta = 3600.0,
) -> Callable[[Task], Task]:
    """Run the decorated ``django.tasks`` task on a cron schedule (put it above ``@task``).

    ``expression`` has five fields, or six with seconds last. ``name`` defaults to the
    task's dotted path; ``args`` and ``kwargs`` (JSON) go to every run; ``timezone``
    defaults to ``TIME_ZONE`` (else UTC). ``misfire`` says what becomes of ticks missed
    while no supervisor ran: ``"skip"`` them, enqueue the ``"latest"`` or ``"all"`` of
    those within ``misfire_window`` (seconds or a timedelta, at most 31 days). Each tick
    is enqueued once, however many supervisors run. A bad schedule raises
    ``ImproperlyConfigured`` naming it.
    """

    def decorate(task: Task) -> Task:
        if not isinstance(task, Task):
            raise ImproperlyConfigured(
                f"@cron({expression!r}) must decorate a django.tasks task: put it above @task."
            )
        window = misfire_window
        _check_arguments(f"Schedule {name or task.module_path!r}", args,
                         {} if kwargs is None else kwargs)
        schedule = Schedule(
            name=name or task.module_path,
            task_path=task.module_path,
            cron=expression,
            args=list(args),
            kwargs=dict(kwargs or {}),
            timezone=timezone,
            misfire=misfire,
            misfire_window=window.total_seconds() if isinstance(window, timedelta) else window,
        )
        validate(schedule)
        _declared[schedule.name] = schedule
        return task

    return decorate


def schedules() -> dict[str, Schedule]:
    """Declared schedules plus DBWORKER["SCHEDULES"] (validated)."""
    found = dict(_declared)
    for name, spec in conf.get().SCHEDULES.items():
        if not isinstance(spec, dict) or "task" not in spec or "cron" not in spec:
            raise ImproperlyConfigured(
                f"DBWORKER['SCHEDULES'][{name!r}] must be a dict with at least 'task' and "
                "'cron' keys."
            )
        unknown = set(spec) - {"task", "cron", "args", "kwargs", "timezone", "misfire",
                               "misfire_window"}
        if unknown:
            raise ImproperlyConfigured(
                f"DBWORKER['SCHEDULES'][{name!r}] has unknown keys {sorted(unknown)}."
            )
        args, kwargs = spec.get("args", []), spec.get("kwargs", {})
        _check_arguments(f"Schedule {name!r}", args, kwargs)
        window = spec.get("misfire_window", 3600.0)
        schedule = Schedule(
            name=name, task_path=spec["task"], cron=spec["cron"],
            args=list(args), kwargs=dict(kwargs),
            timezone=spec.get("timezone"), misfire=spec.get("misfire", "skip"),
            misfire_window=window.total_seconds() if isinstance(window, timedelta) else window,
        )
        validate(schedule)
        found[name] = schedule
    return found


