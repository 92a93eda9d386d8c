"""Connection set-up our processes rely on (SQLite pragmas, transaction markers, pipelines)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import closing, contextmanager
from typing import Any

from django.db import DatabaseError, OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField
from django.db.models.expressions import RawSQL

from .. import conf
from . import direct, prepared

_UNSET: Any = object()


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


def connected(using: str, raw: Any = None) -> bool:
    """Whether ``using``'s connection is open and answers (and, given ``raw``, is still
    the DB-API connection ``raw``: leaving ``transaction.atomic()`` after a lost
    connection makes Django open a new one at once). False tells an outage (a lost
    connection, a restarted server) from a database error caused by one unit's value."""
    connection = connections[using]
    try:
        return (connection.connection is not None
                and (raw is None or connection.connection is raw)
                and connection.is_usable())
    except DatabaseError:
        return False


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
    """In our own processes, SQLite transactions take the write lock when they begin, and
    wait for it in short steps first (``_with_short_waits``).

    A deferred transaction that reads and then writes fails at once with "database is
    locked" when another process wrote meanwhile; an immediate one waits its turn.
    """
    connection = connections[using]
    if connection.vendor != "sqlite":
        return
    connection.settings_dict.setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"
    connection.transaction_mode = "IMMEDIATE"
    if not getattr(connection, "_dbworker_short_waits", False):
        begin = connection._start_transaction_under_autocommit

        def begin_now() -> None:
            raw = direct.connection_for(connection)
            if raw is None:
                return begin()
            mode = connection.transaction_mode
            direct.execute(connection, raw, "BEGIN" if mode is None else f"BEGIN {mode}", ())

        connection._start_transaction_under_autocommit = (  # type: ignore[method-assign]
            lambda: _with_short_waits(connection, begin_now))
        connection._dbworker_short_waits = True


#: Seconds between the tries of a SQLite write lock that was busy, before waiting for it
#: the way SQLite does (about 20 ms in all).
_PAUSES = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, *(0.001,) * 19)


def _with_short_waits(connection: Any, attempt: Callable[[], Any]) -> Any:
    """Run ``attempt`` (a BEGIN IMMEDIATE, or a write in autocommit) on SQLite; while the
    write lock is busy, try again after tens of microseconds, then after a millisecond.

    SQLite's own busy handler (``busy_timeout``) sleeps 1, 2, 5, 10 ms ... between tries: a
    supervisor and its children, which take the write lock for a fraction of a
    millisecond each, spent most of their time asleep in it while it was free. Our own
    tries go first, with the busy timeout off; then ``attempt`` waits as SQLite does."""
    raw = connection.connection
    if raw is None:
        return attempt()
    raw.execute("PRAGMA busy_timeout = 0")
    try:
        for pause in _PAUSES:
            try:
                return attempt()
            except (sqlite3.OperationalError, OperationalError) as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
            time.sleep(pause)
    finally:
        raw.execute(f"PRAGMA busy_timeout = {int(conf.get().SQLITE_BUSY_TIMEOUT * 1000)}")
    return attempt()


def transaction_marker(using: str) -> Any:
    """A value that changes if the current transaction ends and another begins."""
    connection = connections[using]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT transaction_timestamp()")
            return cursor.fetchone()[0]
    if connection.vendor == "sqlite":
        raw = connection.connection
        return None if raw is None or not raw.in_transaction else "in-transaction"
    return None


_STARTED = {"_dbworker_transaction": RawSQL("transaction_timestamp()", (),
                                             output_field=DateTimeField())}


class TransactionCheck:
    """Was the transaction of a transactional handler ended behind our back?

    A handler that sends COMMIT or ROLLBACK through a cursor ends the transaction Django
    opened; what it wrote before is committed without the unit's status. We compare a
    marker of the transaction (``transaction_marker``) taken before the handler runs with
    one taken after, without round trips of their own where we can:

    - PostgreSQL: the transaction's start time, selected with the source row (``annotate``)
      and returned by the fenced completion UPDATE (``returning``). After a COMMIT through
      a cursor, psycopg opens a new transaction for that UPDATE, so a mismatch found after
      it is rolled back with everything else.
    - SQLite: whether a transaction is open, read before the completion UPDATE (after a
      COMMIT, that UPDATE would run and commit on its own). It costs nothing.
    """

    #: The annotation carrying the marker on the source row; removed before the handler runs.
    NAME = next(iter(_STARTED))

    def __init__(self, using: str) -> None:
        self.using = using
        self.postgresql = connections[using].vendor == "postgresql"
        self.begun: Any = None

    @property
    def returning(self) -> str | None:
        """SQL for the completion UPDATE to return the marker with (None: not needed)."""
        return "transaction_timestamp()" if self.postgresql else None

    def annotations(self) -> dict[str, Any]:
        """What to select with the source row (``QuerySet.annotate``)."""
        return _STARTED if self.postgresql else {}

    def begin(self, instance: Any) -> None:
        """Take the marker at the start (from the annotated row on PostgreSQL)."""
        if self.NAME in vars(instance):
            self.begun = vars(instance).pop(self.NAME)
        else:
            self.begun = transaction_marker(self.using)

    def unchanged(self, marker: Any = _UNSET) -> bool:
        """Whether the transaction is still the one begun; ``marker``: as the completion
        UPDATE returned it (PostgreSQL), else it is read now."""
        if marker is _UNSET:
            marker = transaction_marker(self.using)
        return marker == self.begun


def execute_status(cursor: Any, sql: str, params: Sequence[Any]) -> None:
    """Execute one of our own status statements: a claim, a task's completion.

    Its loss in a database crash costs a re-run, never a unit: a claim lost is a unit
    waiting again, a completion lost a lease that expires. So with ``DBWORKER
    ["ASYNC_COMMIT"]`` on PostgreSQL its transaction does not wait for the WAL flush (an
    fsync, the most part of a one-row transaction's time): ``SET LOCAL synchronous_commit
    = off`` goes in the same query (one round trip; Django's client-side binding sends it
    with the simple protocol, which runs both in one transaction, the caller's or an
    implicit one). Later synchronous commits flush it anyway: WAL is written in order.
    Elsewhere, and with server-side binding, the statement runs as it is. The cursor is
    left at the statement's own result.
    """
    _execute(cursor, "SET LOCAL synchronous_commit = off", sql, params)


#: The end of a row completion's WHERE on PostgreSQL: no WAL flush at COMMIT for a
#: transaction that wrote nothing before it (``pg_current_xact_id_if_assigned()`` is NULL
#: until a transaction writes; ``set_config(..., true)`` is ``SET LOCAL``). An uncorrelated
#: subquery, so the server evaluates it once, before the UPDATE changes its row (which
#: assigns the transaction an id); always true.
STATUS_ONLY = (" AND (SELECT count(*) FROM (SELECT set_config('synchronous_commit', 'off', "
               "true) WHERE pg_current_xact_id_if_assigned() IS NULL) AS status_only) >= 0")


def status_only(connection: BaseDatabaseWrapper) -> str:
    """What a row completion's WHERE ends with on ``connection`` (open): ``STATUS_ONLY``
    with ``DBWORKER["ASYNC_COMMIT"]`` on PostgreSQL with client-side binding, else ""."""
    return STATUS_ONLY if conf.get().ASYNC_COMMIT and binds_on_client(connection) else ""


def execute_completion(cursor: Any, sql: str, params: Sequence[Any], then: str = "") -> None:
    """Execute a row's completion (its WHERE ending with ``status_only()``): the last
    statement of the transaction the handler ran in (transactional workers) or of its own
    (the others).

    With ``DBWORKER["ASYNC_COMMIT"]`` on PostgreSQL, a transaction in which nothing was
    written before the completion (the handler wrote nothing to the database, or ran
    before it: ``transactional=False``) commits without waiting for the WAL flush, as a
    task's completion does: a database crash may lose the status and the unit runs again;
    it never loses a write of the handler's, whose transactions still wait. Tested by the
    UPDATE itself (``STATUS_ONLY``).

    Prepared where ``prepared`` may (PostgreSQL, client-side binding). ``then``: a
    statement to run after it in the same query (PostgreSQL: COMMIT).
    """
    _execute(cursor, "", sql, params, prepare=True, then=then)


def _execute(cursor: Any, asynchronous: str, sql: str, params: Sequence[Any], *,
             prepare: bool = False, then: str = "") -> None:
    """``sql`` (with ``prepare``, as a prepared statement where ``prepared`` may) preceded
    in the same query by ``asynchronous``, if given, where it applies (see
    ``_async_commit``; the cursor is left at ``sql``'s result) and followed by ``then``; on
    SQLite in autocommit, with short waits for the write lock."""
    after = f"; {then}" if then else ""
    if prepare:
        sql = prepared.query(cursor, sql)
    with prepared.recovering(cursor.db):
        if asynchronous and _async_commit(cursor):
            cursor.execute(f"{asynchronous}; {sql}{after}", params)
            cursor.nextset()
        elif cursor.db.vendor == "sqlite" and cursor.db.get_autocommit() \
                and getattr(cursor.db, "_dbworker_short_waits", False):
            _with_short_waits(cursor.db, lambda: cursor.execute(sql + after, params))
        else:
            cursor.execute(sql + after, params)


def _async_commit(cursor: Any) -> bool:
    return conf.get().ASYNC_COMMIT and binds_on_client(cursor.db)


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


def execute_first(cursor: Any, sql: str, params: Sequence[Any], *,
                  prepare: bool = False) -> None:
    """Execute ``sql`` as the first statement of the transaction ``transaction.atomic()``
    just opened; the cursor is left at its result.

    psycopg sends a transaction's BEGIN in a round trip of its own before the first
    statement. With client-side binding it goes in the same query here (one round trip;
    BEGIN as psycopg words it, with the connection's isolation level): a transactional
    handler starts a round trip sooner, the most part of a millisecond when the database
    was idle. Anywhere else, or when the transaction has begun, ``sql`` runs as it is.

    ``prepare``: as a prepared statement where ``prepared`` may. Statements waiting to be
    prepared are prepared first, before the transaction begins; if the session lost the
    statement (``prepared.lost``), the transaction, which has run nothing else, is rolled
    back and begun again with ``sql`` unprepared.
    """
    raw = _beginning(cursor)
    if raw is None:
        if prepare:
            execute_prepared(cursor, sql, params)
        else:
            cursor.execute(sql, params)
        return
    begin = raw._get_tx_start_command().decode()
    raw._autocommit = True  # for this query only: psycopg would send its own BEGIN first
    try:
        run = prepared.query(cursor, sql) if prepare else sql
        try:
            with prepared.recovering(cursor.db):
                cursor.execute(f"{begin}; {run}", params)
        except DatabaseError as exc:
            if run is sql or not prepared.lost(exc):
                raise
            raw.rollback()
            cursor.execute(f"{begin}; {sql}", params)
    finally:
        raw._autocommit = False
    cursor.nextset()


def execute_prepared(cursor: Any, sql: str, params: Sequence[Any]) -> None:
    """Execute ``sql`` as a prepared statement where ``prepared`` may, else as it is."""
    with prepared.recovering(cursor.db):
        cursor.execute(prepared.query(cursor, sql), params)


def _beginning(cursor: Any) -> Any:
    """The psycopg connection under ``cursor`` if its transaction is due to begin with the
    next statement (out of autocommit, nothing sent yet, no pipeline); else None. psycopg's
    private ``_autocommit`` and ``_get_tx_start_command`` are looked for, not assumed."""
    if not binds_on_client(cursor.db):
        return None
    from psycopg.pq import TransactionStatus

    raw = cursor.db.connection
    if (raw is None or raw.autocommit or getattr(raw, "_pipeline", None) is not None
            or raw.pgconn.transaction_status != TransactionStatus.IDLE
            or not isinstance(getattr(raw, "_autocommit", None), bool)
            or not callable(getattr(raw, "_get_tx_start_command", None))):
        return None
    return raw


@contextmanager
def pipelined(using: str) -> Iterator[None]:
    """The statements of the block go to the server without waiting for each other's
    results (psycopg 3's pipeline mode), on PostgreSQL with a libpq that has it; elsewhere
    the block runs as it is.

    ``execute()`` then returns once the statement is sent: the server runs it while Python
    goes on (builds the next statement). An error is raised by a later ``execute()`` or when
    the block ends, and the statements after the failing one are not run; the caller's
    ``transaction.atomic()`` around the block then rolls all of them back. Only for
    statements whose results nobody reads.
    """
    connection = connections[using]
    if connection.vendor != "postgresql":
        yield
        return
    connection.ensure_connection()
    raw = connection.connection
    try:
        import psycopg
        from psycopg import Pipeline
    except ImportError:  # psycopg2
        yield
        return
    if not Pipeline.is_supported() or not isinstance(raw, psycopg.Connection):
        yield
        return
    # An error the pipeline's end fetches comes from psycopg, not from Django's cursor:
    # raised as Django's own (IntegrityError, ...), as errors from execute() are.
    with connection.wrap_database_errors, raw.pipeline():
        yield
