"""Cron schedules: ``@cron("*/5 * * * *")`` over a task, or ``DBWORKER["SCHEDULES"]``.

Every supervisor computes the ticks that came due and enqueues each with the idempotency
key ``cron:<name>:<tick>``; the unique key makes every tick run once however many
supervisors run, with no leader. Ticks missed while nothing ran follow the misfire policy:
``skip`` (the default) forgets them, ``latest`` enqueues the last one, ``all`` every one,
looking back at most ``misfire_window`` seconds.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.tasks import Task
from django.utils import timezone

from .logs import log_event

NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,60}$")
MISFIRE = ("skip", "latest", "all")


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

    def ticks(self, after: datetime, until: datetime) -> list[datetime]:
        """Ticks in (after, until], as aware datetimes in the schedule's zone."""
        from croniter import croniter  # only where schedules exist: 4.7 MB in every process

        zone = self.zone()
        it = croniter(self.cron, after.astimezone(zone))
        found: list[datetime] = []
        while (tick := it.get_next(datetime)) <= until:
            found.append(tick)
            if len(found) > 10_000:  # a "* * * * * *" schedule over a long outage
                break
        return found

    def key(self, tick: datetime) -> str:
        return f"cron:{self.name}:{tick.astimezone(ZoneInfo('UTC')).isoformat()}"


_declared: dict[str, Schedule] = {}


def validate(schedule: Schedule) -> None:
    """Raise ImproperlyConfigured naming the schedule and what is wrong with it."""
    from croniter import croniter

    where = f"Schedule {schedule.name!r}"
    if not NAME_RE.match(schedule.name):
        raise ImproperlyConfigured(f"{where}: names use letters, digits and _.:- (1-60).")
    if not isinstance(schedule.cron, str) or not croniter.is_valid(schedule.cron):
        raise ImproperlyConfigured(
            f"{where}: {schedule.cron!r} is not a valid cron expression (five fields, "
            "or six with seconds last, e.g. '*/5 * * * *')."
        )
    if schedule.misfire not in MISFIRE:
        raise ImproperlyConfigured(
            f"{where}: misfire={schedule.misfire!r}; use one of {', '.join(MISFIRE)}."
        )
    if isinstance(schedule.misfire_window, bool) or not isinstance(
        schedule.misfire_window, int | float
    ) or schedule.misfire_window <= 0:
        raise ImproperlyConfigured(f"{where}: misfire_window must be a number of seconds > 0.")
    try:
        schedule.zone()
    except (ZoneInfoNotFoundError, ValueError):
        raise ImproperlyConfigured(f"{where}: unknown time zone {schedule.timezone!r}.") from None


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
    """Run the decorated ``django.tasks`` task on a cron schedule (put it above ``@task``)."""

    def decorate(task: Task) -> Task:
        if not isinstance(task, Task):
            raise ImproperlyConfigured(
                f"@cron({expression!r}) must decorate a django.tasks task: put it above @task."
            )
        window = misfire_window
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
    from . import conf

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
        schedule = Schedule(
            name=name, task_path=spec["task"], cron=spec["cron"],
            args=list(spec.get("args", [])), kwargs=dict(spec.get("kwargs", {})),
            timezone=spec.get("timezone"), misfire=spec.get("misfire", "skip"),
            misfire_window=spec.get("misfire_window", 3600.0),
        )
        validate(schedule)
        found[name] = schedule
    return found


class Scheduler:
    """Enqueues the ticks that came due since it last looked.

    Ticks of the last ``RECENT`` seconds are always enqueued; older ones were missed (nothing
    ran, or this supervisor was paused) and follow the schedule's misfire policy.
    """

    RECENT = 60.0

    def __init__(self, schedules: dict[str, Schedule], now: datetime | None = None) -> None:
        self.schedules = schedules
        start = now or timezone.now()
        self.last = {
            name: start - timedelta(seconds=s.misfire_window if s.misfire != "skip" else 0)
            for name, s in schedules.items()
        }

    def due(self, schedule: Schedule, now: datetime) -> list[datetime]:
        ticks = schedule.ticks(self.last[schedule.name], now)
        recent_from = now - timedelta(seconds=self.RECENT)
        missed = [t for t in ticks if t < recent_from]
        recent = [t for t in ticks if t >= recent_from]
        if schedule.misfire == "skip":
            missed = []
        elif schedule.misfire == "latest":
            missed = missed[-1:] if not recent else []
        else:
            window_from = now - timedelta(seconds=schedule.misfire_window)
            missed = [t for t in missed if t >= window_from]
        return missed + recent

    def tick(self, now: datetime | None = None) -> int:
        now = now or timezone.now()
        enqueued = 0
        for name, schedule in self.schedules.items():
            for when in self.due(schedule, now):
                enqueued += enqueue_tick(schedule, when)
            self.last[name] = now
        return enqueued


def enqueue_tick(schedule: Schedule, tick: datetime) -> int:
    """Enqueue one tick once; 1 if this call created it, 0 if it existed already."""
    from . import task_registry
    from .backend import DBWorkerTask
    from .claims import taskstore
    from .exceptions import UnknownTask

    try:
        task = task_registry.resolve(schedule.task_path)
    except UnknownTask as exc:
        log_event(logging.ERROR, "schedule_failed", schedule=schedule.name, error=str(exc))
        return 0
    if not isinstance(task, DBWorkerTask):
        log_event(logging.ERROR, "schedule_failed", schedule=schedule.name,
                  error=f"{schedule.task_path} does not use DBWorkerBackend")
        return 0
    key = schedule.key(tick)
    if taskstore.key_exists(key):
        return 0
    call = replace(task.using(idempotency_key=key), _schedule=schedule.name)
    result = call.enqueue(*schedule.args, **schedule.kwargs)
    log_event(logging.INFO, "scheduled", schedule=schedule.name, tick=tick.isoformat(),
              id=result.id)
    return 1
