"""A time limit on the statements of a read, so a slow database degrades the health and
metrics views (``Overdue``) instead of holding a probe or a scrape past its own timeout."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from django.db import DatabaseError, connections, transaction

#: Seconds the health and metrics views give the database (a Kubernetes probe gives up
#: after 1 s by default).
SECONDS = 0.8


class Overdue(DatabaseError):
    """The database did not answer within the limit."""


#: What each database raises when its own limit stops a statement (by its message).
_STOPPED = ("statement timeout", "max_statement_time", "interrupted", "query execution was")


@contextmanager
def limited(using: str, seconds: float = SECONDS) -> Iterator[None]:
    """Run the block's statements with a limit of ``seconds`` each (PostgreSQL:
    ``SET LOCAL statement_timeout`` in a transaction of the block; MariaDB:
    ``max_statement_time``, MySQL: ``max_execution_time`` for the session, put back after;
    SQLite: a progress handler that interrupts past the deadline); raises ``Overdue``."""
    connection = connections[using]
    vendor = connection.vendor
    try:
        with transaction.atomic(using=using):
            connection.ensure_connection()
            undo = _limit(connection, vendor, seconds)
            try:
                yield
            finally:
                undo()
    except DatabaseError as exc:
        if isinstance(exc, Overdue) or any(s in str(exc).lower() for s in _STOPPED):
            raise Overdue(f"no answer within {seconds:g}s") from exc
        raise


def _limit(connection, vendor: str, seconds: float):  # type: ignore[no-untyped-def]
    if vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = %s", [f"{int(seconds * 1000)}ms"])
        return lambda: None
    if vendor == "mysql":
        mariadb = connection.mysql_is_mariadb
        name, value = (("max_statement_time", seconds) if mariadb
                       else ("max_execution_time", int(seconds * 1000)))
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT @@SESSION.{name}")
            (before,) = cursor.fetchone()
            cursor.execute(f"SET SESSION {name} = %s", [value])

        def undo() -> None:
            with connection.cursor() as cursor:
                cursor.execute(f"SET SESSION {name} = %s", [before])
        return undo
    if vendor == "sqlite":
        raw = connection.connection
        deadline = time.monotonic() + seconds
        raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        return lambda: raw.set_progress_handler(None, 0)
    return lambda: None
