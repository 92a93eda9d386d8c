"""The statements every row unit runs on PostgreSQL, prepared once per connection of a
``runworkers`` child (``activate``).

Django's psycopg cursors bind parameters on the client by default: each query goes to the
server as text, which parses and plans it every time. For a unit's source-row read and its
completion that was more than half of the server's work per unit (bench/README.md). So,
where a connection binds on the client, such a statement is prepared on it once
(``PREPARE dbworker_<hash> AS ...``, ``$1`` for each ``%s``) and run as ``EXECUTE
dbworker_<hash>(%s, ...)``: still client-side binding and the simple protocol, so it can
share a query with BEGIN or COMMIT as before. A name is a hash of the statement's text, so
it never stands for another statement, in any session: BLAKE2b, which Python implements
itself, not a hash of OpenSSL's (SHA-1 was): a child's first OpenSSL digest brings some
0.8 MB of libcrypto's pages into its RSS (its provider set-up), and nothing else a child
does at idle calls OpenSSL.

A PREPARE runs only outside a transaction, in a query of its own: a statement first needed
inside one (a completion) runs unprepared that time and is prepared before the next
transaction begins (``postgresql.execute_first``). So preparing never fails a unit's transaction.

Off with ``DBWORKER["PREPARED_STATEMENTS"] = False``: behind a transaction-pooling
PgBouncer, whose transactions each get some server connection, where the statement may not
be prepared. Django's own ``prepare_threshold`` (psycopg's automatic preparing, None by
default) does not apply: these are SQL statements. A session that lost a statement
(``DEALLOCATE``, ``DISCARD ALL``, or such a pooler) turns preparing off for the process, with
a warning; a table that changed the type of a column a statement returns ("cached plan must
not change result type") has its session prepare again. Either way the query that found
out fails (``lost``), and the caller runs it again unprepared or gives the unit back.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from weakref import WeakKeyDictionary

from django.db import DatabaseError
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import conf

logger = logging.getLogger("django_dbworker")

#: Statements one session may hold of ours (they need a handful): a guard.
LIMIT = 64
GONE, STALE, EXISTS = "26000", "0A000", "42P05"  # SQLSTATEs
_PLACEHOLDER = re.compile(r"%%|%s")


class _Session:
    """What one psycopg connection has prepared, and what it should prepare next."""

    __slots__ = ("pending", "stale", "statements")

    def __init__(self) -> None:
        self.statements: dict[str, str] = {}  # SQL -> the query that runs it
        self.pending: dict[str, None] = {}  # first needed inside a transaction: prepare next
        self.stale = False  # DEALLOCATE ALL before preparing again


_sessions: WeakKeyDictionary[Any, _Session] = WeakKeyDictionary()
_active = False  # this process runs units over and over: a runworkers child (``activate``)
_off = False  # a session lost a statement: this process prepares no more


def activate() -> None:
    """Prepare statements in this process from now on (a ``runworkers`` child). Elsewhere
    (web processes, whose connections may last one request, tests' ``run_until_idle``)
    a PREPARE would cost more than it saves."""
    global _active
    _active = True


def turn_off() -> None:
    """Prepare nothing more in this process (and the children it forks from now on):
    ``runworkers`` behind a transaction-pooling pooler (``db/pooler.py``)."""
    global _off
    _off = True


def enabled(connection: BaseDatabaseWrapper) -> bool:
    """Whether statements are prepared on ``connection`` (open)."""
    if not _active or _off or connection.vendor != "postgresql":
        return False
    return conf.get().PREPARED_STATEMENTS and binds_on_client(connection)


def query(cursor: Any, sql: str) -> str:
    """What to execute for ``sql`` (``%s`` placeholders, ``%%`` for a percent sign) with the
    same parameters: ``EXECUTE ...`` where it is prepared on the cursor's connection, else
    ``sql`` itself. Outside a transaction, what is not prepared yet is prepared now."""
    connection = cursor.db
    if not enabled(connection):
        return sql
    raw = connection.connection
    session = _sessions.get(raw)
    if session is None:
        session = _sessions[raw] = _Session()
    run = session.statements.get(sql)
    if run is not None and not session.pending:
        return run
    if not _outside_transaction(raw):
        if run is None and len(session.pending) < LIMIT:
            session.pending[sql] = None
        return run or sql
    if session.stale:
        cursor.execute("DEALLOCATE ALL")
        session.stale = False
    for waiting in [*session.pending, sql]:
        if waiting not in session.statements and len(session.statements) < LIMIT:
            session.statements[waiting] = _prepare(cursor, waiting)
    session.pending.clear()
    return session.statements.get(sql, sql)


def _outside_transaction(raw: Any) -> bool:
    """Whether a statement sent now runs in an implicit transaction of its own."""
    from psycopg.pq import TransactionStatus

    return raw.autocommit and raw.pgconn.transaction_status == TransactionStatus.IDLE


def _prepare(cursor: Any, sql: str) -> str:
    """PREPARE ``sql``; the EXECUTE that runs it (or ``sql`` if it cannot be prepared)."""
    numbered, count = _numbered(sql)
    name = "dbworker_" + hashlib.blake2b(numbered.encode(), digest_size=12).hexdigest()
    try:
        cursor.execute(f"PREPARE {name} AS {numbered}")
    except DatabaseError as exc:
        if _sqlstate(exc) != EXISTS:  # EXISTS: the same text (the name is its hash)
            logger.warning("dbworker: could not prepare a statement, it runs unprepared: "
                           "%s: %s", exc, sql)
            return sql
    return f"EXECUTE {name}({', '.join(['%s'] * count)})" if count else f"EXECUTE {name}"


def _numbered(sql: str) -> tuple[str, int]:
    """``sql`` with ``$1``, ``$2`` ... for its placeholders, and how many there are."""
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if match.group(0) == "%%":
            return "%"
        count += 1
        return f"${count}"

    return _PLACEHOLDER.sub(replace, sql), count


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc.__cause__, "sqlstate", None)


def lost(exc: BaseException) -> bool:
    """Whether ``exc`` says a prepared statement of ours was gone or stale."""
    if not isinstance(exc, DatabaseError):
        return False
    state = _sqlstate(exc)
    return ((state == GONE and "dbworker_" in str(exc))
            or (state == STALE and "cached plan" in str(exc)))


@contextmanager
def recovering(connection: BaseDatabaseWrapper) -> Iterator[None]:
    """Run a query that may execute prepared statements; when the server says one is gone
    (the process prepares no more) or stale (the session prepares again), the error is
    raised as it is (``lost``)."""
    global _off
    try:
        yield
    except DatabaseError as exc:
        if not lost(exc):
            raise
        if _sqlstate(exc) == GONE:
            if not _off:
                logger.warning(
                    "dbworker: a statement prepared on this database connection is gone "
                    "(%s); this process prepares no more statements. Behind a "
                    "transaction-pooling PgBouncer, set DBWORKER['PREPARED_STATEMENTS'] = "
                    "False.", exc)
            _off = True
        else:
            session = _sessions.get(connection.connection)
            if session is not None:
                session.pending.update(dict.fromkeys(session.statements))
                session.statements.clear()
                session.stale = True
        raise


def prepared(connection: BaseDatabaseWrapper) -> dict[str, str]:
    """The statements prepared on ``connection``'s session and in use: SQL -> the query
    that runs it."""
    session = _sessions.get(connection.connection)
    return dict(session.statements) if session is not None and not _off else {}


def binds_on_client(connection: BaseDatabaseWrapper) -> bool:
    """Whether the cursors of ``connection`` (open) are psycopg 3's with client-side binding
    (Django's default): their queries go with the simple protocol, so one query may hold
    several statements. Not with Django's ``"server_side_binding": True``, nor psycopg2
    (no ``nextset()`` to reach a statement's result)."""
    if connection.vendor != "postgresql" or connection.connection is None:
        return False
    try:
        import psycopg
    except ImportError:
        return False
    factory = getattr(connection.connection, "cursor_factory", None)
    return isinstance(factory, type) and issubclass(factory, psycopg.ClientCursor)
