"""Schedules stored in the database (``StoredSchedule`` rows), edited at runtime in the admin
or with ``manage.py dbworker schedules``: the validation the admin form, the command and the
supervisors share, saving and enabling rows, and the reading of the enabled rows each round.

A row becomes a ``schedules.Schedule`` only through ``to_schedule``, which refuses it with
``InvalidSchedule`` (every wrong field, each with a message naming the value and the fix).
The admin and the command refuse to save such a row (``StoredSchedule.save()`` does not:
a model cannot know the registered tasks, and a deploy may remove a task after its row was
saved); a supervisor logs one once per version (``stored_schedule_invalid``) and skips it,
and the system check W006 (``not_run``) names the enabled ones. A stored schedule whose
name a code-declared schedule has is refused by the admin and the command; a supervisor
runs the code one and logs ``stored_schedule_shadowed`` once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, transaction
from django.utils import timezone

from .. import conf
from ..exceptions import InvalidSchedule, UnknownTask
from ..logs import log_event
from ..models import StoredSchedule
from . import registry as task_registry
from .schedules import (
    MAX_MISFIRE_WINDOW,
    MISFIRE,
    NAME_RE,
    Schedule,
    _check_arguments,
    cron_syntax_problem,
    schedules,
)

#: The columns a supervisor reads each round; all but ``updated_at`` make a row's version.
COLUMNS = ("name", "task_path", "cron", "time_zone", "args", "kwargs", "misfire",
           "misfire_window", "updated_at")
IN_CODE = "@cron or DBWORKER['SCHEDULES']"


def code_schedules() -> dict[str, Schedule]:
    """The schedules declared in code; none when they are broken (system check E004 says
    why, and ``runworkers`` does not start)."""
    try:
        return schedules()
    except ImproperlyConfigured:
        return {}


def problems(row: StoredSchedule, *, code: Collection[str] = ()) -> dict[str, str]:
    """Each wrong field of ``row`` and why, naming the value and the fix; ``{}`` when it is
    right. ``code``: names of code-declared schedules, which a stored one may not take."""
    found: dict[str, str] = {}
    name = row.name
    if not isinstance(name, str) or not NAME_RE.match(name):
        found["name"] = (f"{name!r} is not a schedule name; use 1 to 60 letters, digits and "
                         "_.:- (e.g. 'nightly_report').")
    elif name in code:
        found["name"] = (f"{name!r} is the name of a schedule declared in code ({IN_CODE}); "
                         "give the stored schedule another name, or change the one in code.")
    try:
        task_registry.resolve(row.task_path)
    except UnknownTask as exc:
        found["task_path"] = str(exc)
    zone = _zone(row.time_zone)
    if zone is None:
        found["time_zone"] = (f"{row.time_zone!r} is not a known time zone; give an IANA name "
                              "such as 'Europe/Paris' or 'UTC', or leave it empty for "
                              f"TIME_ZONE ({settings.TIME_ZONE or 'UTC'}).")
    if (cron := _cron_problem(row.cron, zone or ZoneInfo("UTC"))) is not None:
        found["cron"] = cron
    found.update(_argument_problems(row.args, row.kwargs))
    if row.misfire not in MISFIRE:
        found["misfire"] = (f"{row.misfire!r} is not a misfire policy; use one of "
                            f"{', '.join(MISFIRE)}.")
    window = row.misfire_window
    if isinstance(window, bool) or not isinstance(window, int | float) \
            or not math.isfinite(window) or not 0 < window <= MAX_MISFIRE_WINDOW:
        found["misfire_window"] = (f"{window!r} is not a misfire window; give a number of "
                                   f"seconds > 0 and at most {MAX_MISFIRE_WINDOW:g} (31 days).")
    return found


def _zone(name: Any) -> ZoneInfo | None:
    """The zone named (``""``: TIME_ZONE), or None when there is no such zone."""
    if not isinstance(name, str):
        return None
    try:
        return ZoneInfo(name or settings.TIME_ZONE or "UTC")
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def _cron_problem(expression: Any, zone: ZoneInfo) -> str | None:
    from croniter import croniter

    if (problem := cron_syntax_problem(expression)) is not None:
        return problem
    try:
        croniter(expression, datetime.now(zone)).get_next(datetime)
    except (ValueError, OverflowError, KeyError, TypeError):  # CroniterBadDateError
        return (f"{expression!r} never fires (no date matches it, e.g. February 30th); fix "
                "the day and month fields.")
    return None


def _argument_problems(args: Any, kwargs: Any) -> dict[str, str]:
    found = {}
    if not isinstance(args, list):
        found["args"] = (f"{args!r} is not a JSON list; give the positional arguments as a "
                         "list, e.g. [1, \"a\"] ([] for none).")
    if not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs):
        found["kwargs"] = (f"{kwargs!r} is not a JSON object; give the keyword arguments as an "
                           "object with string keys, e.g. {\"user_id\": 42} ({} for none).")
    if not found:
        try:
            _check_arguments("They", args, kwargs)  # NUL characters, ARGUMENTS_MAX_BYTES
        except ImproperlyConfigured as exc:
            found["args"] = str(exc).removeprefix("They: ")
    return found


def to_schedule(row: StoredSchedule, *, code: Collection[str] = ()) -> Schedule:
    """The schedule a row describes; ``InvalidSchedule`` naming every wrong field."""
    if found := problems(row, code=code):
        raise InvalidSchedule(row.name, found)
    return Schedule(
        name=row.name, task_path=row.task_path, cron=row.cron, args=list(row.args),
        kwargs=dict(row.kwargs), timezone=row.time_zone or None, misfire=row.misfire,
        misfire_window=float(row.misfire_window),
    )


def next_run(schedule: Schedule, now: datetime | None = None) -> datetime:
    """When ``schedule`` fires next after ``now``, in its time zone."""
    return schedule.next(now or timezone.now())


# ----- writing rows ----------------------------------------------------------------------

def rows() -> Any:
    return StoredSchedule.objects.using(conf.get().DATABASE)


def save(row: StoredSchedule) -> StoredSchedule:
    """Validate ``row`` and write it (one INSERT or UPDATE, ``updated_at`` now); nothing is
    written when it is wrong: ``InvalidSchedule`` names each wrong field."""
    to_schedule(row, code=code_schedules())
    row.updated_at = timezone.now()
    using = conf.get().DATABASE
    try:
        with transaction.atomic(using=using):
            row.save(using=using)
    except IntegrityError:
        if row._state.adding and rows().filter(name=row.name).exists():
            raise InvalidSchedule(row.name, {"name": (
                f"a stored schedule named {row.name!r} exists already; edit it, or choose "
                "another name.")}) from None
        raise
    return row


def set_enabled(pks: Collection[Any], enabled: bool) -> int:
    """Enable or disable these rows; how many changed. ``updated_at`` is set: an enabled
    schedule counts its ticks from then, never from before it was disabled."""
    return int(rows().filter(pk__in=list(pks), enabled=not enabled).update(
        enabled=enabled, updated_at=timezone.now()))


# ----- reading rows each round -----------------------------------------------------------

class StoredSource:
    """The enabled rows, as schedules, for a supervisor's ``Scheduler``: read each round (one
    small SELECT), a row turned into a schedule once per version (its values). A wrong row
    is logged once per version and left out; so is one whose name a code schedule has."""

    def __init__(self) -> None:
        #: name -> (the row's version, its schedule or None when it is left out)
        self._seen: dict[str, tuple[tuple[Any, ...], Schedule | None]] = {}

    def read(self, code: Collection[str]) -> dict[str, tuple[Schedule, datetime]]:
        """Name -> (schedule, when its row was last saved) of the usable enabled rows."""
        found: dict[str, tuple[Schedule, datetime]] = {}
        seen: dict[str, tuple[tuple[Any, ...], Schedule | None]] = {}
        for values in rows().filter(enabled=True).values_list(*COLUMNS):
            version, saved = values[:-1], values[-1]
            name = version[0]
            before = self._seen.get(name)
            schedule = before[1] if before and before[0] == version else \
                self._convert(version, code)
            seen[name] = (version, schedule)
            if schedule is not None:
                found[name] = (schedule, saved)
        self._seen = seen
        return found

    def _convert(self, version: tuple[Any, ...], code: Collection[str]) -> Schedule | None:
        row = StoredSchedule(**dict(zip(COLUMNS, version, strict=False)))
        if row.name in code:
            log_event(logging.WARNING, "stored_schedule_shadowed", schedule=row.name,
                      task=row.task_path, reason=f"a schedule declared in code ({IN_CODE}) "
                      "has this name and runs instead; rename or remove the stored one")
            return None
        try:
            return to_schedule(row)
        except InvalidSchedule as exc:
            log_event(logging.ERROR, "stored_schedule_invalid", schedule=row.name,
                      task=row.task_path, error=str(exc),
                      fix="correct it in the admin or with 'dbworker schedules edit'")
            return None


def not_run() -> list[tuple[StoredSchedule, str]]:
    """The enabled rows a supervisor leaves out (a task no longer registered, a row written
    by SQL, a name a code schedule has), each with why (system check W006)."""
    code = code_schedules()
    found = []
    for row in rows().filter(enabled=True).order_by("name"):
        if row.name in code:
            found.append((row, f"a schedule declared in code ({IN_CODE}) has this name and "
                               "runs instead; rename or remove this one."))
        elif wrong := problems(row):
            found.append((row, " ".join(f"{field}: {why}" for field, why in wrong.items())))
    return found


def row_status(row: StoredSchedule, code: Collection[str],
               now: datetime | None = None) -> tuple[datetime | None, str | None]:
    """A row as a supervisor sees it: (its next run, None when it does not run; what is
    wrong with it, or None)."""
    if row.name in code:
        return None, (f"not run: a schedule declared in code ({IN_CODE}) has this name and "
                      "runs instead; rename or remove this one")
    try:
        schedule = to_schedule(row)
    except InvalidSchedule as exc:
        return None, f"not run: {exc}"
    return (next_run(schedule, now) if row.enabled else None), None
