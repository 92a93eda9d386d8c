"""``set_progress()``: report how far the running task or handler got, visible at once.

The write goes through a connection of its own, outside the handler's transaction, so other
processes see it while the unit runs. (On SQLite, whose single writer is the handler's own
transaction, a transactional handler's progress becomes visible when it commits.)
"""

from __future__ import annotations

import os
import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import conf
from ..db import engine_for
from ..models import Execution, TaskRecord


@dataclass(slots=True)
class Unit:
    kind: str  # "task" or "execution"
    id: str
    #: The last progress recorded for it in this process (None: none yet).
    percent: float | None = None
    message: str = ""


current: ContextVar[Unit | None] = ContextVar("dbworker_progress_unit", default=None)
#: The progress connection of each thread (a Django connection serves only the thread
#: that made it: async units write progress from other threads, ``units/aio.py``).
_side: dict[tuple[int, int], BaseDatabaseWrapper] = {}


def _side_connection(using: str) -> BaseDatabaseWrapper:
    key = (os.getpid(), threading.get_ident())
    connection = _side.get(key)
    if connection is None:
        connection = connections.create_connection(using)
        if any(pid != key[0] for pid, _ in list(_side)):
            _side.clear()  # inherited across a fork: not ours
        _side[key] = connection
    return connection


def set_progress(percent: float, message: str | None = None) -> bool:
    """Record progress (0-100) of the task or handler running in this process.

    Returns False, recording nothing, when no unit runs here (say, a handler called
    directly in a unit test); bad values raise wherever it is called.
    """
    unit = current.get()
    if isinstance(percent, bool) or not isinstance(percent, int | float) \
            or not 0 <= percent <= 100:
        raise ValueError(f"set_progress({percent!r}): percent must be a number from 0 to 100.")
    if message is not None and not isinstance(message, str):
        raise TypeError(f"set_progress(message={message!r}): message must be a string.")
    if unit is None:
        return False
    # A NUL (refused by PostgreSQL's text) is stored as the visible ``\x00`` everywhere.
    text = (message or "").replace("\x00", "\\x00")[:255]
    using = conf.get().DATABASE
    main = connections[using]
    model = TaskRecord if unit.kind == "task" else Execution
    # A task's id is a UUID's text, an execution's an int: mypy cannot pair it with model.
    key: Any = unit.id if unit.kind == "task" else int(unit.id)
    unit.percent, unit.message = float(percent), text
    if main.in_atomic_block and engine_for(main).progress_in_handler_transaction:
        model.objects.using(using).filter(pk=key).update(progress=percent,
                                                          progress_message=text)
        return True
    side = _side_connection(using)
    table = side.ops.quote_name(model._meta.db_table)
    pk = model._meta.pk.get_db_prep_value(model._meta.pk.to_python(key), side)
    visible = True
    if main.in_atomic_block and engine_for(main).writes_wait_for_uncommitted_rows:
        # A row only the caller's transaction wrote (a unit run inside a test's
        # transaction): the side connection's UPDATE would wait for that transaction's
        # lock on it, forever here. A plain read does not wait and does not see it.
        with side.cursor() as cursor:
            cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s", [pk])
            visible = cursor.fetchone() is not None
    if visible:
        with side.cursor() as cursor:
            cursor.execute(
                f"UPDATE {table} SET progress = %s, progress_message = %s WHERE id = %s",
                [float(percent), text, pk],
            )
            visible = cursor.rowcount > 0
    if not visible and main.in_atomic_block:
        # Not committed yet, so only the caller's transaction can write it.
        model.objects.using(using).filter(pk=key).update(progress=percent,
                                                          progress_message=text)
    return True


def close() -> None:
    """Close this process's progress connection (tests, and children before they exit)."""
    connection = _side.pop((os.getpid(), threading.get_ident()), None)
    if connection is not None:
        connection.close()
