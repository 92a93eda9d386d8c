"""Connection set-up our processes rely on (SQLite pragmas, transaction markers)."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from . import conf


def on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """WAL and a busy timeout for every SQLite connection to our database."""
    if connection.vendor != "sqlite" or connection.alias != conf.get().DATABASE:
        return
    if connection.is_in_memory_db():
        return
    timeout_ms = int(conf.get().SQLITE_BUSY_TIMEOUT * 1000)
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA busy_timeout = {timeout_ms}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")


def answer_json_probe(using: str) -> None:
    """Tell Django whether SQLite has JSON support before it asks the database.

    Django probes inside ``transaction.atomic()``; under ``transaction_mode='IMMEDIATE'``
    that BEGIN waits for the write lock, which a running transactional handler holds for its
    whole run. The system checks of every management command (a second ``runworkers`` too)
    would wait out the busy timeout, then call JSONField unsupported (fields.E180) and
    refuse to start while any handler runs. The answer depends only on the SQLite library,
    so an in-memory database gives it without touching the file.
    """
    connection = connections[using]
    if connection.vendor != "sqlite" or "supports_json_field" in vars(connection.features):
        return
    try:
        with closing(sqlite3.connect(":memory:")) as probe:
            probe.execute("""SELECT JSON('{"a": "b"}')""")
    except sqlite3.OperationalError:
        supported = False
    else:
        supported = True
    connection.features.supports_json_field = supported


def use_immediate_transactions(using: str) -> None:
    """In our own processes, SQLite transactions take the write lock when they begin.

    A deferred transaction that reads and then writes fails at once with "database is
    locked" when another process wrote meanwhile; an immediate one waits its turn.
    """
    connection = connections[using]
    if connection.vendor == "sqlite":
        connection.settings_dict.setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"
        connection.transaction_mode = "IMMEDIATE"


def transaction_marker(using: str) -> Any:
    """A value that changes if the current transaction ends and another begins."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT now()")
            return cursor.fetchone()[0]
    if connection.vendor == "sqlite":
        raw = connection.connection
        return None if raw is None or not raw.in_transaction else "in-transaction"
    return None
