"""New task rows: built as plain values and stored in one statement (enqueue -> READY).

``enqueue_many`` of thousands of calls is bound by what Python does per row, so a new row
is not a model instance: it is a ``NewTask`` (the attributes ``results.to_result`` reads),
and the rows of one call share everything but their id and arguments. They are stored
with one statement that names every column of ``TaskRecord``: on PostgreSQL one
``INSERT ... SELECT ... FROM unnest(ids, args, kwargs)``, elsewhere one ``executemany``.
A keyed call (one row) goes through ``bulk_create(ignore_conflicts=True)``.
"""

from __future__ import annotations

import json
import os
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.tasks import Task
from django.utils import timezone

from ..models import TaskRecord, TaskStatus

#: The columns that differ between the rows of one enqueue call.
PER_ROW = ("id", "args", "kwargs")
#: A keyed task's id is uuid5(KEY_NAMESPACE, key).
KEY_NAMESPACE = uuid.UUID("5d1c2f7e-3b0a-4c7e-9a51-6f0d8b9e2c41")


@dataclass(frozen=True, slots=True)
class Shared:
    """What the rows of one enqueue call have in common."""

    task_path: str
    backend: str
    queue_name: str
    priority: int
    run_after: datetime | None
    available_at: datetime
    enqueued_at: datetime
    idempotency_key: str | None
    schedule: str

    @classmethod
    def of(cls, task: Task) -> Shared:
        now = timezone.now()
        run_after = task.run_after
        if isinstance(run_after, timedelta):
            run_after = now + run_after
        return cls(task.module_path, task.backend, task.queue_name, task.priority, run_after,
                   run_after or now, now, getattr(task, "idempotency_key", None),
                   getattr(task, "_schedule", ""))


@dataclass(slots=True)
class NewTask:
    """A task row about to be stored; reads like a ``TaskRecord`` fresh from the database."""

    id: uuid.UUID
    args: list[Any]
    kwargs: dict[str, Any]
    #: ``args`` and ``kwargs`` as the JSON text stored.
    args_json: str
    kwargs_json: str
    shared: Shared
    status: str = TaskStatus.READY
    started_at: datetime | None = None
    last_attempted_at: datetime | None = None
    finished_at: datetime | None = None
    errors: list[Any] = field(default_factory=list)
    worker_ids: list[str] = field(default_factory=list)
    return_value: Any = None
    progress: float | None = None
    progress_message: str = ""

    def __getattr__(self, name: str) -> Any:  # task_path, queue_name, ...: the shared values
        return getattr(self.shared, name)

    @property
    def pk(self) -> uuid.UUID:
        return self.id

    def record(self) -> TaskRecord:
        s = self.shared
        return TaskRecord(
            id=self.id, task_path=s.task_path, backend=s.backend, queue_name=s.queue_name,
            priority=s.priority, args=self.args, kwargs=self.kwargs, status=self.status,
            run_after=s.run_after, available_at=s.available_at, enqueued_at=s.enqueued_at,
            idempotency_key=s.idempotency_key, schedule=s.schedule,
        )


def new(shared: Shared, args: list[Any], kwargs: dict[str, Any], args_json: str | None = None,
        kwargs_json: str | None = None, *, task_id: uuid.UUID | None = None) -> NewTask:
    """A new row; ``args`` and ``kwargs`` JSON-ready (``normalize_json``), with their JSON
    text if the caller has it; ``task_id`` from ``ids()`` (default: a fresh one)."""
    if task_id is None:
        (task_id,) = ids(shared, 1)
    return NewTask(
        task_id, args, kwargs,
        json.dumps(args, allow_nan=False) if args_json is None else args_json,
        json.dumps(kwargs, allow_nan=False) if kwargs_json is None else kwargs_json,
        shared,
    )


def ids(shared: Shared, count: int) -> list[uuid.UUID]:
    """Ids for ``count`` new rows: random (version 4), read from the OS in one call.

    A keyed task's id follows from its key, so a result handed out before the row is
    stored (enqueue on commit) names the task that holds the key, whoever wrote it.
    """
    key = shared.idempotency_key
    if key:
        return [uuid.uuid5(KEY_NAMESPACE, key)] * count
    random = os.urandom(16 * count)
    return [uuid.UUID(bytes=random[i:i + 16], version=4) for i in range(0, 16 * count, 16)]


def insert(rows: list[NewTask], using: str) -> None:
    """Store ``rows`` (all of one ``Shared``) in one statement; the caller's transaction."""
    if not rows:
        return
    connection = connections[using]
    columns = TaskRecord._meta.concrete_fields
    shared = {f.name: f.get_db_prep_save(getattr(rows[0], f.name, f.get_default()), connection)
              for f in columns if f.name not in PER_ROW}
    quote = connection.ops.quote_name
    head = (f"INSERT INTO {quote(TaskRecord._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in columns)})")
    if connection.vendor == "postgresql":
        # The per-row values travel as one JSON array of [id, args, kwargs] (one string
        # parameter, cheap to send); every value is typed, as the SELECT list gives the
        # INSERT no column types to infer.
        per_row = {"id": "(e->>0)::uuid", "args": "e->1", "kwargs": "e->2"}
        select = ", ".join(per_row[f.name] if f.name in PER_ROW
                           else f"%s::{f.db_type(connection)}" for f in columns)
        params = [shared[f.name] for f in columns if f.name not in PER_ROW]
        params.append("[" + ",".join(f'["{r.id}",{r.args_json},{r.kwargs_json}]'
                                     for r in rows) + "]")
        with connection.cursor() as cursor:
            cursor.execute(f"{head} SELECT {select} FROM jsonb_array_elements(%s::jsonb) e",
                           params)
        return
    pk = TaskRecord._meta.pk
    template = [shared.get(f.name) for f in columns]
    slots = [i for i, f in enumerate(columns) if f.name in PER_ROW]
    assert [columns[i].name for i in slots] == list(PER_ROW)

    def values(row: NewTask) -> list[Any]:
        params = template.copy()
        params[slots[0]] = pk.get_db_prep_save(row.id, connection)
        params[slots[1]], params[slots[2]] = row.args_json, row.kwargs_json
        return params

    with connection.cursor() as cursor:
        cursor.executemany(f"{head} VALUES ({', '.join(['%s'] * len(columns))})",
                           [values(r) for r in rows])
