"""Cron schedules: ``@cron("*/5 * * * *")`` over a task, or ``DBWORKER["SCHEDULES"]``.

Every supervisor computes the ticks that came due and enqueues each with the idempotency
key ``cron:<name>:<tick>``; the unique key makes every tick run once however many
supervisors run, with no leader. Ticks missed while nothing ran follow the misfire policy:
``skip`` (the default) forgets them, ``latest`` enqueues the last one, ``all`` every one,
looking back at most ``misfire_window`` seconds (at most ``MAX_MISFIRE_WINDOW``), at most
``Scheduler.MISSED_PER_ROUND`` of them per round (the rest in the next rounds).

A schedule is validated where it is declared (``@cron``, and the system check E004 for
``DBWORKER["SCHEDULES"]``): its cron expression must fire, its arguments must be JSON. One
that still fails at run time (its task gone, its enqueue raising) is logged and skipped,
never stopping the supervisor or the other schedules.

Schedules stored in the database (``StoredSchedule`` rows, ``tasks/stored_schedules.py``)
join them at run time: a supervisor's ``Scheduler`` reads the enabled rows every round, and
a new or edited row counts its ticks from its last save. A code schedule wins a name clash.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from .djtasks import Task
from .logs import log_event

if TYPE_CHECKING:
    from .tasks.stored_schedules import StoredSource

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
    from . import conf
    from .tasks.newtasks import has_nul, plain

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


class Scheduler:
    """Enqueues the ticks that came due since it last looked.

    Ticks of the last ``RECENT`` seconds are always enqueued; older ones were missed (nothing
    ran, or this supervisor was paused) and follow the schedule's misfire policy. A schedule
    that raises is logged (at most once per ``ERROR_INTERVAL``) and skipped; the others go on.
    """

    RECENT = 60.0
    #: Missed ticks a schedule with misfire="all" enqueues per round at most; the next
    #: rounds take the rest, oldest first.
    MISSED_PER_ROUND = 100
    #: Seconds between two ``schedule_failed`` lines of one schedule.
    ERROR_INTERVAL = 60.0

    def __init__(self, schedules: dict[str, Schedule], now: datetime | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 stored: StoredSource | None = None) -> None:
        #: The code-declared schedules; ``schedules`` adds the stored ones of the last round.
        self.code = dict(schedules)
        self.schedules = dict(schedules)
        self.stored = stored
        self.clock = clock
        self.start = now or timezone.now()
        self.last = {name: self._since_start(s) for name, s in schedules.items()}
        #: name -> the tick after which the next round goes on (misfire="all" catching up)
        self._resume: dict[str, datetime] = {}
        #: name -> (when it was last logged, failures not logged since)
        self._failures: dict[str, tuple[float, int]] = {}
        #: stored schedule name -> the version in use (None before the first read)
        self._stored: dict[str, Schedule] | None = None

    def _since_start(self, s: Schedule) -> datetime:
        """Where a schedule's ticks start when the scheduler starts: now, or as far back as
        its misfire window for ``latest`` and ``all``."""
        return self.start - timedelta(seconds=s.misfire_window if s.misfire != "skip" else 0)

    def active(self) -> bool:
        """Whether a round may have anything to do (stored schedules may appear any time)."""
        return bool(self.schedules) or self.stored is not None

    def refresh(self, now: datetime) -> None:
        """Take the stored schedules as their rows are now: new and edited rows from their
        last save on (misfires as far back as that save, never before it; a row first seen
        after the first round no further back than ``RECENT``), disabled and deleted rows
        gone. A code schedule of the same name wins (``StoredSource`` logs it)."""
        if self.stored is None:
            return
        raw = _raw_connection()
        try:
            rows = self.stored.read(self.code)
        except Exception as exc:
            if _database_away(exc, raw):
                raise
            self._failed("(stored schedules)", "-", exc)  # the last rows read go on
            return
        first, self._stored = self._stored is None, self._stored or {}
        for name in [n for n in self._stored if n not in rows]:
            del self._stored[name], self.schedules[name]
            self.last.pop(name, None)
            self._resume.pop(name, None)
        for name, (schedule, saved) in rows.items():
            if self._stored.get(name) == schedule:
                continue
            since = max(saved, self._since_start(schedule))
            if not first:
                since = max(since, now - timedelta(seconds=self.RECENT))
            self._stored[name] = self.schedules[name] = schedule
            self.last[name] = since
            self._resume.pop(name, None)

    def due(self, schedule: Schedule, now: datetime) -> list[datetime]:
        name = schedule.name
        last = self.last[name]
        recent_from = now - timedelta(seconds=self.RECENT)
        recent = [t for t in schedule.ticks(max(last, recent_from - timedelta(seconds=1)), now)
                  if t >= recent_from]
        if schedule.misfire == "skip" or last >= recent_from:
            return recent
        if schedule.misfire == "latest":
            if recent:
                return recent
            tick = schedule.previous(recent_from)
            return [tick] if last < tick < recent_from else []
        window_from = now - timedelta(seconds=schedule.misfire_window)
        start = max(last, window_from - timedelta(seconds=1))
        missed = [t for t in schedule.ticks(start, recent_from, self.MISSED_PER_ROUND + 1)
                  if window_from <= t < recent_from]
        if len(missed) > self.MISSED_PER_ROUND:  # the rest next round, then the recent ones
            missed = missed[:self.MISSED_PER_ROUND]
            self._resume[name] = missed[-1]
            return missed
        return missed + recent

    def tick(self, now: datetime | None = None) -> int:
        now = now or timezone.now()
        self.refresh(now)
        enqueued = 0
        for name, schedule in self.schedules.items():
            raw = _raw_connection()
            try:
                for when in self.due(schedule, now):
                    enqueued += enqueue_tick(schedule, when)
            except Exception as exc:
                if _database_away(exc, raw):
                    raise  # the supervisor's outage back-off; these ticks are tried again
                self._resume.pop(name, None)
                self._failed(schedule.name, schedule.task_path, exc)
            self.last[name] = self._resume.pop(name, now)
        return enqueued

    def _failed(self, name: str, task_path: str, exc: Exception) -> None:
        at = self.clock()
        logged, skipped = self._failures.get(name, (-math.inf, 0))
        if at - logged < self.ERROR_INTERVAL:
            self._failures[name] = (logged, skipped + 1)
            return
        self._failures[name] = (at, 0)
        log_event(logging.ERROR, "schedule_failed", schedule=name, task=task_path,
                  error=_describe(exc), not_logged=skipped, next_log_in=self.ERROR_INTERVAL)


def _describe(exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = "(its message cannot be read)"
    return f"{type(exc).__name__}: {text.strip()[:300]}"


def _raw_connection() -> Any:
    """The DB-API connection statements run on now (None if none is open), for
    ``_database_away``."""
    from django.db import connections

    from . import conf

    return connections[conf.get().DATABASE].connection


def _database_away(exc: Exception, raw: Any = None) -> bool:
    """A database error on a connection that no longer works: an outage, not a schedule's
    fault. ``raw``: the DB-API connection the failed work began on; a session the server
    ended is an outage even where leaving an ``atomic()`` opened a new connection, which
    answers (the tick is then tried again, not skipped)."""
    from django.db import DatabaseError

    from . import conf
    from .db.connections import connected

    return isinstance(exc, DatabaseError) and not connected(conf.get().DATABASE, raw)


def enqueue_tick(schedule: Schedule, tick: datetime) -> int:
    """Enqueue one tick once; 1 if this call created it, 0 if it existed already. Raises
    UnknownTask when the schedule's task is not a registered DBWorkerBackend task."""
    from .exceptions import UnknownTask
    from .tasks import registry as task_registry
    from .tasks import store as taskstore
    from .tasks.task import DBWorkerTask

    task = task_registry.resolve(schedule.task_path)
    if not isinstance(task, DBWorkerTask):
        raise UnknownTask(f"{schedule.task_path} does not use DBWorkerBackend")
    key = schedule.key(tick)
    if taskstore.key_exists(key):
        return 0
    call = replace(task.using(idempotency_key=key), _schedule=schedule.name)
    result = call.enqueue(*schedule.args, **schedule.kwargs)
    log_event(logging.INFO, "scheduled", schedule=schedule.name, tick=tick.isoformat(),
              id=result.id)
    return 1
