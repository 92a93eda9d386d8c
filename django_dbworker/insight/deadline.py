"""A time limit on the statements of a read, so a slow database degrades the health and
metrics views (``Overdue``) instead of holding a probe or a scrape past its own timeout."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections, transaction

from ..db import engine_for

#: Seconds the health and metrics views give the database (a Kubernetes probe gives up
#: after 1 s by default).
SECONDS = 0.8


class Overdue(DatabaseError):
    """The database did not answer within the limit."""


@contextmanager
def limited(using: str, seconds: float = SECONDS) -> Iterator[None]:
    """Run the block's statements with a limit of ``seconds`` each, in one transaction
    (the engine's ``limit_statements``: PostgreSQL's ``statement_timeout``, MariaDB's
    ``max_statement_time``, MySQL's ``max_execution_time``, a progress handler on SQLite,
    which needs no transaction: one there would wait for the write lock a handler holds);
    raises ``Overdue`` when the database stopped one."""
    connection = connections[using]
    engine = engine_for(connection)
    scope = (contextlib.nullcontext() if engine.read_transactions_lock
             else transaction.atomic(using=using))
    try:
        with scope:
            connection.ensure_connection()
            undo = engine.limit_statements(connection, seconds)
            try:
                yield
            finally:
                undo()
    except DatabaseError as exc:
        if isinstance(exc, Overdue) or engine.stopped_by_limit(exc):
            raise Overdue(f"no answer within {seconds:g}s") from exc
        raise
