"""The space our tables take, and giving it back after pruning (``dbworker vacuum``).

Deleting rows frees no disk by itself. SQLite keeps the pages on the file's free list (a
``VACUUM`` rewrites the file without them; once ``dbworker vacuum`` has turned incremental
auto-vacuum on, retention gives them back batch by batch). PostgreSQL keeps dead row
versions until a ``VACUUM`` (autovacuum, when it is on) makes their space reusable; only
``VACUUM FULL`` gives it back. InnoDB reuses deleted rows' space by itself; ``OPTIMIZE
TABLE`` gives it back. docs/operations.md, "Retention and disk space".
"""

from __future__ import annotations

import time
from typing import Any

from django.apps import apps
from django.db import connections

from . import engine_for

#: The keys of ``report()``: ``scope`` ("database file" on SQLite, "tables" elsewhere),
#: ``total_bytes``, ``free_bytes`` (None where the database does not say), ``dead_rows``
#: (PostgreSQL's dead row versions; None elsewhere), and per database ``auto_vacuum``
#: (SQLite), ``autovacuum`` and ``live_rows`` (PostgreSQL).
SPACE_KEYS = ("scope", "total_bytes", "free_bytes", "dead_rows")


def tables() -> list[str]:
    """Our app's tables (not the proxies: the dashboard)."""
    config = apps.get_app_config("django_dbworker")
    return sorted({m._meta.db_table for m in config.get_models()
                   if not m._meta.proxy and m._meta.managed})


def report(using: str) -> dict[str, Any]:
    connection = connections[using]
    return engine_for(connection).space(connection, tables())


class VacuumInTransaction(RuntimeError):
    """``vacuum()`` was called inside a transaction, where no database can run it."""


def vacuum(using: str, *, full: bool = False) -> dict[str, Any]:
    """Give the space of deleted rows back (see the module's docstring); the space before
    and after, the statements run and how long they took."""
    connection = connections[using]
    if connection.in_atomic_block:
        raise VacuumInTransaction(
            f"dbworker vacuum cannot run inside a transaction (database {using!r}): call it "
            "outside transaction.atomic().")
    engine = engine_for(connection)
    before = engine.space(connection, tables())
    statements = engine.vacuum_statements(connection, tables(), full=full)
    started = time.monotonic()
    with connection.cursor() as cursor:
        for sql in statements:
            cursor.execute(sql)
            if cursor.description:  # MariaDB's OPTIMIZE and ANALYZE answer with rows
                cursor.fetchall()
    seconds = time.monotonic() - started
    return {"before": before, "after": engine.space(connection, tables()),
            "statements": statements, "seconds": round(seconds, 3), "full": full}


def after_prune(using: str) -> int:
    """Retention's cheap step after a batch (``Engine.after_prune``): pages given back."""
    connection = connections[using]
    return engine_for(connection).after_prune(connection)
