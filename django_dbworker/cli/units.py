"""Executions and tasks as JSON-ready mappings, and finding them by the ids people type."""

from __future__ import annotations

import uuid
from typing import Any

from django.core.exceptions import ValidationError

from .. import conf
from ..db import keys
from ..models import Execution, TaskRecord
from ..rows.registry import Worker
from . import OperationError

#: Keys of schema version 1 that have a new name, kept beside it until version 2
#: (docs/cli.md): an execution's ``status`` (now ``execution_status``); an error's ``at``
#: (now ``occurred_at``) is added by ``_alias_errors``. Human tables leave them out.
EXECUTION_ALIASES = ("status",)


def execution(e: Execution, *, traceback: bool = True) -> dict[str, Any]:
    """``Execution.as_dict()`` plus the old names: ``status`` was the stored state
    (``PENDING`` included; ``execution_status`` is null for a PENDING execution)."""
    doc = e.as_dict(traceback=traceback)
    doc["status"] = e.state
    _alias_errors(doc)
    return doc


def task(t: TaskRecord, *, traceback: bool = True) -> dict[str, Any]:
    """``TaskRecord.as_dict()`` plus the old name of the errors' time."""
    doc = t.as_dict(traceback=traceback)
    _alias_errors(doc)
    return doc


def _alias_errors(doc: dict[str, Any]) -> None:
    doc["errors"] = [{**e, "at": e["occurred_at"]} for e in doc["errors"]]
    if doc["error"] is not None:
        doc["error"] = doc["errors"][-1]


def status(doc: dict[str, Any]) -> str:
    """The status of an execution's or a task's mapping, for people: a PENDING execution
    (no ``execution_status`` yet) shows as ``PENDING``."""
    if doc["kind"] == "task":
        return str(doc["status"])
    return str(doc["execution_status"] or "PENDING")


def last_error(doc: dict[str, Any]) -> str:
    errors = doc.get("errors") or []
    if not errors:
        return ""
    first_line = (errors[-1]["message"] or "").splitlines()[:1]
    return f"{errors[-1]['exception_class']}: {first_line[0] if first_line else ''}"


#: Execution.id is a BigAutoField.
MAX_EXECUTION_ID = 2**63 - 1


def shown(raw: str) -> str:
    """An id as the operator typed it, or its repr when it would not print plainly."""
    text = raw if raw.isprintable() and raw.strip() == raw and raw else repr(raw)
    return text if len(text) <= 100 else text[:100] + "..."


def find(ids: list[str]) -> tuple[list[Execution], list[TaskRecord]]:
    """The executions (numeric ids) and tasks (UUIDs) named; OperationError naming the
    ids that are neither, or that nothing has."""
    numbers: dict[str, int] = {}
    uuids: dict[str, uuid.UUID] = {}
    bad: dict[str, str] = {}
    for raw in dict.fromkeys(ids):
        if raw.isdigit():  # also true of '²' or '٣': only 0-9 make an execution id
            if not raw.isascii():
                bad[raw] = ("not an id: an execution id is a whole number written with the "
                            "digits 0-9, a task id a UUID")
            elif not 1 <= int(raw) <= MAX_EXECUTION_ID:
                bad[raw] = (f"out of range: execution ids are whole numbers from 1 to "
                            f"{MAX_EXECUTION_ID}")
            else:
                numbers[raw] = int(raw)
            continue
        try:
            uuids[raw] = uuid.UUID(raw)
        except ValueError:
            bad[raw] = "neither an execution id, a number, nor a task id, a UUID"
    using = conf.get().DATABASE
    executions = {e.pk: e for e in Execution.objects.using(using).filter(
        pk__in=list(numbers.values()))}
    tasks = {t.pk: t for t in TaskRecord.objects.using(using).filter(
        pk__in=list(uuids.values()))}
    bad |= {raw: "no execution has this id" for raw, pk in numbers.items()
            if pk not in executions}
    bad |= {raw: "no task has this id" for raw, pk in uuids.items() if pk not in tasks}
    if bad:
        named = [f"{shown(raw)} ({bad[raw]})" for raw in dict.fromkeys(ids) if raw in bad]
        raise OperationError(f"Unknown id(s): {'; '.join(named)}.")
    return list(executions.values()), list(tasks.values())


def find_rows(worker: Worker, pks: list[str]) -> list[Execution]:
    """``worker``'s executions on the source rows ``pks``; OperationError naming the pks
    that are not keys of its source model or have no execution."""
    using = conf.get().DATABASE
    wanted: dict[str, str] = {}
    bad: list[str] = []
    for raw in dict.fromkeys(pks):
        try:
            wanted[keys.to_key(worker.source, raw, using)] = raw
        except (ValidationError, ValueError, TypeError):
            bad.append(f"{shown(raw)} (not a primary key of {worker.source._meta.label})")
    found = {e.source_id: e for e in Execution.objects.using(using).filter(
        worker=worker.name, source_id__in=list(wanted))}
    bad += [f"{shown(raw)} (worker {worker.name!r} has no execution for this row)"
            for key, raw in wanted.items() if key not in found]
    if bad:
        raise OperationError(f"Unknown source row(s): {'; '.join(bad)}.")
    return list(found.values())
