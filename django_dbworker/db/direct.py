"""SQLite: a unit's own statements on the driver's connection, past Django's cursor layers.

A row unit on SQLite runs its BEGIN IMMEDIATE, its source-row read and its completion
while it holds the database's only write lock, which every other process then waits for.
Through ``connection.cursor()`` each of them costs 7-8 µs of Python (the cursor wrappers,
the ``%s`` -> ``?`` conversion, the checks): a third of the time a no-op unit holds the
lock. So they run on the ``sqlite3`` connection directly where nothing could tell the
difference: no ``execute_wrappers`` (they must see every query), queries not logged
(``DEBUG``: ``connection.queries``), an open connection, and a transaction not marked for
rollback (Django's cursor refuses to run then; the usual path raises as it would). Errors
are translated as Django's own are (``wrap_database_errors``).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from django.db.backends.base.base import BaseDatabaseWrapper

#: A ``%s`` placeholder that is not an escaped ``%%s`` (the conversion Django's SQLite
#: cursor makes for every query, made here once per statement text).
_PLACEHOLDER = re.compile(r"(?<!%)%s")
_converted: dict[str, str] = {}


def connection_for(connection: BaseDatabaseWrapper) -> sqlite3.Connection | None:
    """The ``sqlite3`` connection to run one of our statements on, or None: use a cursor."""
    if (connection.vendor != "sqlite" or connection.connection is None
            or connection.execute_wrappers or connection.queries_logged
            or connection.needs_rollback):
        return None
    return connection.connection


def execute(connection: BaseDatabaseWrapper, raw: sqlite3.Connection, sql: str,
            params: Sequence[Any]) -> sqlite3.Cursor:
    """Run ``sql`` (Django's ``%s`` style) with ``params`` on ``raw``, the driver's
    connection of ``connection`` (``connection_for``); returns the driver's cursor."""
    query = _converted.get(sql)
    if query is None:
        query = _converted[sql] = _PLACEHOLDER.sub("?", sql).replace("%%", "%")
    with connection.wrap_database_errors:
        return raw.execute(query, params)
