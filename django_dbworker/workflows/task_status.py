"""A task's status as an expression inside ordinary querysets: a row worker's ``eligible``
can wait for a task (``has_task_status``), as it waits for another worker's execution with
``has_execution_status``."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import models
from django.db.models import Exists, F, Func, OuterRef

from ..djtasks import TaskResultStatus
from ..models import TaskRecord, TaskStatus
from ..tasks.results import DJANGO_STATUS

#: A task id as text, with or without hyphens (``str(result.id)``, ``uuid.hex``).
_UUID_PATTERN = ("^[0-9a-fA-F]{8}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?[0-9a-fA-F]{4}-?"
                 "[0-9a-fA-F]{12}$")


class TaskId(Func):
    """The task id a field holds, in the form ``TaskRecord.id`` is stored, so that the
    comparison reads the task table's primary key. A ``UUIDField`` is compared as it is; a
    text field holding the id (``result.id``, with or without hyphens) is converted: on
    PostgreSQL cast to ``uuid`` where it looks like one (any other text matches no task,
    rather than failing the query), elsewhere the 32 hex digits the column holds (MariaDB
    10.7+: its ``uuid`` type converts text itself; text that is not a UUID matches none)."""

    output_field = models.UUIDField()

    def _text(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...], bool]:
        source = self.source_expressions[0]
        sql, params = compiler.compile(source)
        try:
            held = source.output_field
        except Exception:  # an expression whose type Django cannot tell: take it as text
            held = None
        return sql, tuple(params), isinstance(held, models.UUIDField)

    def as_sqlite(self, compiler: Any, connection: Any,
                  **extra: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params, is_uuid = self._text(compiler, connection)
        if is_uuid or connection.features.has_native_uuid_field:
            return sql, params
        return f"LOWER(REPLACE({sql}, '-', ''))", params

    as_mysql = as_sqlite  # MariaDB 10.7+: uuid converts text itself; else as SQLite

    def as_postgresql(self, compiler: Any, connection: Any,
                      **extra: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params, is_uuid = self._text(compiler, connection)
        if is_uuid:
            return sql, params
        return (f"(CASE WHEN ({sql})::text ~ '{_UUID_PATTERN}' THEN ({sql})::uuid END)",
                params + params)


def _statuses(statuses: Iterable[TaskStatus | TaskResultStatus | str] | str | None,
              ) -> list[str]:
    """Our statuses named by ``statuses``: ours by value (``"SUCCESSFUL"``,
    ``TaskStatus.WAITING``), or Django's ``TaskResultStatus`` members, each meaning every
    status of ours Django shows as it (``TaskResultStatus.FAILED``: FAILED and CANCELLED)."""
    if statuses is None:
        return list(TaskStatus.values)
    if isinstance(statuses, str):
        statuses = [statuses]
    found: list[str] = []
    for status in statuses:
        if isinstance(status, TaskResultStatus):
            found += [ours for ours, theirs in _DJANGO.items() if theirs == status]
        elif isinstance(status, str) and status in TaskStatus.values:
            found.append(str(TaskStatus(status).value))
        else:
            raise ValueError(
                f"{status!r} is not a task status; use one of {', '.join(TaskStatus.values)} "
                "(TaskStatus.SUCCESSFUL, ...) or a django.tasks TaskResultStatus."
            )
    if not found:
        raise ValueError("statuses= is empty; pass at least one task status.")
    return list(dict.fromkeys(found))


#: Django's status of each of ours, WAITING included (Django sees READY).
_DJANGO = {**DJANGO_STATUS, TaskStatus.WAITING: TaskResultStatus.READY}


def has_task_status(
    field: str | F | OuterRef | Any,
    statuses: Iterable[TaskStatus | TaskResultStatus | str] | str | None = None,
) -> Exists:
    """True where the task whose id ``field`` holds has one of ``statuses``.

    ``field``: the name of a field of the queryset's model holding a task id (a
    ``UUIDField``, or a ``CharField``/``TextField`` holding ``result.id``), or an expression
    (``OuterRef("report__task_id")``). ``statuses``: ``TaskStatus`` values (default: all,
    so "the task exists") or Django's ``TaskResultStatus``. A row whose field is empty,
    NULL, not a task id, or the id of a task that was pruned (``RETENTION``) matches no
    status. Use it in ``.filter()``, ``.exclude()``, ``Q`` and a worker's ``eligible``::

        eligible=lambda: Image.objects.filter(has_task_status("report_task_id", "SUCCESSFUL"))

    Each row costs one look-up of the task table's primary key.
    """
    if isinstance(field, str):
        if not field:
            raise ValueError("has_task_status(field=''): name the field holding the task id.")
        reference: Any = OuterRef(field)
    elif isinstance(field, F):  # OuterRef is an F
        reference = field if isinstance(field, OuterRef) else OuterRef(field.name)  # type: ignore[attr-defined]
    elif hasattr(field, "resolve_expression"):
        reference = field
    else:
        raise TypeError(
            f"has_task_status(field={field!r}): give the name of the field holding the task "
            "id (a string) or an expression such as OuterRef('report__task_id')."
        )
    return Exists(TaskRecord.objects.filter(id=TaskId(reference),
                                            status__in=_statuses(statuses)))
