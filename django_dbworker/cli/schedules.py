"""``dbworker schedules [list|add|edit|enable|disable|remove] [NAME] [options]``: the cron
schedules, code-declared and stored, with their next run; stored ones changed at runtime
(``tasks/stored_schedules.py`` validates; nothing is written when a value is wrong)."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from datetime import datetime
from typing import Any

from django.core.management.base import CommandParser
from django.utils import timezone

from ..exceptions import InvalidSchedule
from ..models import StoredSchedule
from ..tasks import stored_schedules as stored
from ..tasks.schedules import Schedule
from . import OperationError
from .render import table

ACTIONS = ("list", "add", "edit", "enable", "disable", "remove")
#: The option that sets each field, for error messages.
OPTIONS = {"name": "NAME", "task_path": "--task", "cron": "--cron", "time_zone": "--timezone",
           "args": "--args", "kwargs": "--kwargs", "misfire": "--misfire",
           "misfire_window": "--misfire-window"}


def arguments(parser: CommandParser) -> None:
    parser.add_argument("action", nargs="?", default="list", choices=ACTIONS)
    parser.add_argument("name", nargs="?", metavar="NAME")
    parser.add_argument("--task", dest="task_path", metavar="PATH",
                        help="The task's dotted path, e.g. myapp.tasks.send_digest.")
    parser.add_argument("--cron", metavar="EXPR", help="e.g. '0 8 * * *' (quote it).")
    parser.add_argument("--args", dest="args_json", metavar="JSON",
                        help="Positional arguments, a JSON list (default []).")
    parser.add_argument("--kwargs", dest="kwargs_json", metavar="JSON",
                        help="Keyword arguments, a JSON object (default {}).")
    parser.add_argument("--timezone", dest="time_zone", metavar="ZONE",
                        help="An IANA zone, e.g. Europe/Paris; '' for TIME_ZONE.")
    parser.add_argument("--misfire", metavar="POLICY", help="skip (default), latest or all.")
    parser.add_argument("--misfire-window", dest="misfire_window", metavar="SECONDS")
    state = parser.add_mutually_exclusive_group()
    state.add_argument("--disabled", dest="enabled", action="store_false", default=None,
                       help="Save it disabled (add, edit).")
    state.add_argument("--enabled", dest="enabled", action="store_true", default=None,
                       help="Save it enabled (edit).")
    parser.add_argument("--yes", action="store_true", help="remove: do not ask.")


def run(options: dict[str, Any], confirm: Callable[[str], None]) -> dict[str, Any]:
    """Do the action; the document. ``confirm(question)`` returns when the operator agreed
    (only ``remove`` asks)."""
    action, name = options["action"], options["name"]
    code = stored.code_schedules()
    if action == "list":
        return {"action": "list", "schedules": listing(code, name)}
    if name is None:
        raise OperationError(f"'schedules {action}' needs the schedule's NAME, e.g. "
                             f"'dbworker schedules {action} nightly_report'.")
    if action == "add":
        missing = [o for o, key in (("--task", "task_path"), ("--cron", "cron"))
                   if options[key] is None]
        if missing:
            raise OperationError(f"'schedules add {name}' needs {' and '.join(missing)}; "
                                 "nothing was written.")
        row = StoredSchedule(name=name)
        _save(_edited(row, options, enabled_default=True))
        changed = True
    else:
        row = _find(name, code)
        if action == "edit":
            _save(_edited(row, options, enabled_default=row.enabled))
            changed = True
        elif action in ("enable", "disable"):
            changed = bool(stored.set_enabled([row.pk], action == "enable"))
            row.refresh_from_db(using=stored.rows().db)
        else:
            if not options["yes"]:
                confirm(f"Remove the stored schedule {row.name!r} ({row.cron} "
                        f"{row.task_path})?")
            changed = bool(stored.rows().filter(pk=row.pk).delete()[0])
            row.enabled = False  # it runs no more
    return {"action": action, "changed": changed, "schedule": describe_row(row, code)}


def _find(name: str, code: Collection[str]) -> StoredSchedule:
    row = stored.rows().filter(name=name).first()
    if row is not None:
        return row
    if name in code:
        raise OperationError(f"{name!r} is declared in code ({stored.IN_CODE}); change it "
                             "there: this command changes only stored schedules.")
    raise OperationError(f"No stored schedule is named {name!r}; 'dbworker schedules list' "
                         "shows them, 'dbworker schedules add' stores one.")


def _edited(row: StoredSchedule, options: dict[str, Any], *,
            enabled_default: bool) -> StoredSchedule:
    for key in ("task_path", "cron", "time_zone", "misfire"):
        if options[key] is not None:
            setattr(row, key, options[key])
    if options["args_json"] is not None:
        row.args = _json("--args", options["args_json"], "'[1, \"a\"]'")
    if options["kwargs_json"] is not None:
        row.kwargs = _json("--kwargs", options["kwargs_json"], "'{\"user_id\": 42}'")
    if (window := options["misfire_window"]) is not None:
        try:
            row.misfire_window = float(window)
        except ValueError:
            raise OperationError(f"--misfire-window {window!r} is not a number; give seconds, "
                                 "e.g. --misfire-window 3600. Nothing was written.") from None
    row.enabled = enabled_default if options["enabled"] is None else options["enabled"]
    return row


def _json(option: str, text: str, example: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise OperationError(f"{option} {text!r} is not JSON ({exc}); e.g. {option} {example}. "
                             "Nothing was written.") from None


def _save(row: StoredSchedule) -> None:
    try:
        stored.save(row)
    except InvalidSchedule as exc:
        details = " ".join(f"{OPTIONS.get(field, field)}: {text}"
                           for field, text in exc.problems.items())
        raise OperationError(f"Schedule {row.name!r} was not saved (nothing was written). "
                             f"{details}") from None


# ----- documents -------------------------------------------------------------------------

def listing(code: dict[str, Schedule], name: str | None = None) -> list[dict[str, Any]]:
    """Code schedules, then stored ones, each by name; only ``name`` when given."""
    now = timezone.now()
    found = [describe_code(s, now) for s in code.values() if name in (None, s.name)]
    rows = stored.rows().order_by("name")
    found += [describe_row(r, code, now) for r in (rows.filter(name=name) if name else rows)]
    if name is not None and not found:
        raise OperationError(f"No schedule is named {name!r}; 'dbworker schedules list' "
                             "shows them all.")
    return found


def describe_code(s: Schedule, now: datetime | None = None) -> dict[str, Any]:
    return {"name": s.name, "source": "code", "task": s.task_path, "cron": s.cron,
            "timezone": s.timezone or "", "args": s.args, "kwargs": s.kwargs, "enabled": True,
            "misfire": s.misfire, "misfire_window": s.misfire_window,
            "next_run": stored.next_run(s, now), "problem": None, "created_at": None,
            "updated_at": None}


def describe_row(row: StoredSchedule, code: Collection[str],
                 now: datetime | None = None) -> dict[str, Any]:
    next_run, problem = stored.row_status(row, code, now)
    return {"name": row.name, "source": "stored", "task": row.task_path, "cron": row.cron,
            "timezone": row.time_zone, "args": row.args, "kwargs": row.kwargs,
            "enabled": row.enabled, "misfire": row.misfire,
            "misfire_window": row.misfire_window, "next_run": next_run, "problem": problem,
            "created_at": row.created_at, "updated_at": row.updated_at}


def render(doc: dict[str, Any]) -> str:
    shown = doc["schedules"] if "schedules" in doc else [doc["schedule"]]
    text = table(["name", "source", "task", "cron", "zone", "enabled", "next run", "problem"], [
        (s["name"], s["source"], s["task"], s["cron"], s["timezone"],
         "yes" if s["enabled"] else "no", _local(s["next_run"]), s["problem"])
        for s in shown])
    if doc["action"] == "list":
        return text
    done = {"add": "Added", "edit": "Saved", "enable": "Enabled", "disable": "Disabled",
            "remove": "Removed"}[doc["action"]]
    return text + (f"\n{done} {doc['schedule']['name']!r}." if doc["changed"] else
                   f"\n{doc['schedule']['name']!r} was {doc['action']}d already.")


def _local(when: datetime | None) -> str | None:
    return None if when is None else when.strftime("%Y-%m-%d %H:%M:%S %Z")
