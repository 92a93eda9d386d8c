"""SQLite (a file in WAL mode): the embedded engine.

One writer at a time: our processes take the write lock when a transaction begins (BEGIN
IMMEDIATE) and wait for it in short steps; a unit's own statements run on the ``sqlite3``
connection directly where nothing could tell (``direct``); idle supervisors watch
``PRAGMA data_version`` instead of being notified.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable, Sequence
from contextlib import closing
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, cast

from django.core.checks import CheckMessage, Warning
from django.db import OperationalError
from django.db.backends.base.base import BaseDatabaseWrapper

from .. import conf
from . import direct
from .engine import (
    Begin,
    Claim,
    Engine,
    RowTriggers,
    TransactionEnded,
    Trigger,
    row_trigger_statements,
)

if TYPE_CHECKING:
    from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteWrapper

#: Seconds between the tries of a SQLite write lock that was busy, before waiting for it
#: the way SQLite does (about 20 ms in all).
_PAUSES = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, *(0.001,) * 19)


#: ``PRAGMA auto_vacuum``'s values.
AUTO_VACUUM = {0: "none", 1: "full", 2: "incremental"}


def _pragma(cursor: Any, name: str) -> int:
    cursor.execute(f"PRAGMA {name}")
    return int(cursor.fetchone()[0])


class _Beginning(Protocol):
    """What ``own_process`` uses of Django's SQLite wrapper that django-stubs does not
    declare (Django internals: its transaction mode and how it begins a transaction), and
    our mark that it was done."""

    transaction_mode: str | None
    _start_transaction_under_autocommit: Callable[[], None]
    _dbworker_short_waits: bool


class SQLite(Engine):
    vendor = "sqlite"
    # A running transactional handler holds the only write lock from BEGIN to COMMIT, so
    # renewals wait behind it and a lease may lapse while its supervisor is well; nobody
    # can take a unit over meanwhile either (a reap needs the same lock and changes the
    # token, which the record checks).
    checks_lease_on_record: ClassVar[bool] = False
    concurrent_writers: ClassVar[bool] = False
    read_transactions_lock: ClassVar[bool] = True
    watches_commits: ClassVar[bool] = True
    progress_in_handler_transaction: ClassVar[bool] = True

    # ----- connections ------------------------------------------------------------------

    def on_connection_created(self, connection: BaseDatabaseWrapper) -> None:
        """WAL and a busy timeout for every connection to our database file."""
        if cast("SQLiteWrapper", connection).is_in_memory_db():
            return
        timeout_ms = busy_timeout_ms(connection)
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA busy_timeout = {timeout_ms}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")

    def know_features(self, connection: BaseDatabaseWrapper) -> None:
        """Tell Django whether SQLite has JSON support before it asks the database.

        Django probes inside ``transaction.atomic()``; under ``transaction_mode='IMMEDIATE'``
        that BEGIN waits for the write lock, which a running transactional handler holds for
        its whole run. The system checks of every management command (a second
        ``runworkers`` too) would wait out the busy timeout, then call JSONField unsupported
        (fields.E180) and refuse to start while any handler runs. The answer depends only
        on the SQLite library, so an in-memory database gives it without touching the file.
        """
        if "supports_json_field" in vars(connection.features):
            return
        try:
            with closing(sqlite3.connect(":memory:")) as probe:
                probe.execute("""SELECT JSON('{"a": "b"}')""")
        except sqlite3.OperationalError:
            supported = False
        else:
            supported = True
        connection.features.supports_json_field = supported

    def own_process(self, connection: BaseDatabaseWrapper, *, runs_units: bool = False) -> None:
        """Transactions take the write lock when they begin, and wait for it in short steps
        first (``with_short_waits``).

        A deferred transaction that reads and then writes fails at once with "database is
        locked" when another process wrote meanwhile; an immediate one waits its turn.
        """
        connection.settings_dict.setdefault("OPTIONS", {})["transaction_mode"] = "IMMEDIATE"
        wrapper = cast(_Beginning, connection)
        wrapper.transaction_mode = "IMMEDIATE"
        if getattr(connection, "_dbworker_short_waits", False):
            return
        begin = wrapper._start_transaction_under_autocommit

        def begin_now() -> None:
            raw = direct.connection_for(connection)
            if raw is None:
                return begin()
            mode = wrapper.transaction_mode
            direct.execute(connection, raw, "BEGIN" if mode is None else f"BEGIN {mode}", ())

        wrapper._start_transaction_under_autocommit = (
            lambda: with_short_waits(connection, begin_now))
        wrapper._dbworker_short_waits = True

    def in_memory(self, connection: BaseDatabaseWrapper) -> bool:
        return cast("SQLiteWrapper", connection).is_in_memory_db()

    def setting_checks(self, alias: str, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
        mode = connection.settings_dict.get("OPTIONS", {}).get("transaction_mode")
        if (mode or "").upper() == "IMMEDIATE":
            return []
        return [Warning(
            f"DATABASES[{alias!r}] is SQLite without transaction_mode "
            "'IMMEDIATE': your web processes may see 'database is locked' when they write "
            "while runworkers does (runworkers itself always uses IMMEDIATE).",
            hint="Add 'OPTIONS': {'transaction_mode': 'IMMEDIATE'} to the database.",
            id="django_dbworker.W001",
        )]

    # ----- statements -------------------------------------------------------------------

    def execute_status(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        self._execute(cursor, sql, params)

    def execute_completion(self, cursor: Any, sql: str, params: Sequence[Any],
                           then: str = "") -> None:
        self._execute(cursor, sql + (f"; {then}" if then else ""), params)

    def _execute(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """In autocommit, in our own processes: with short waits for the write lock."""
        if cursor.db.get_autocommit() and getattr(cursor.db, "_dbworker_short_waits", False):
            with_short_waits(cursor.db, lambda: cursor.execute(sql, params))
        else:
            cursor.execute(sql, params)

    def read(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
             first: bool = False) -> list[tuple[Any, ...]]:
        raw = direct.connection_for(connection)
        if raw is not None:
            return direct.execute(connection, raw, sql, params).fetchall()
        return super().read(connection, sql, params, first=first)

    # ----- the transaction of a transactional handler ----------------------------------

    def begin_write_transaction(self, connection: BaseDatabaseWrapper) -> None:
        """SQLite runs each statement in its own transaction until BEGIN: take the write
        lock again as the handler's transaction began (BEGIN IMMEDIATE, short waits)."""
        cast(_Beginning, connection)._start_transaction_under_autocommit()

    def transaction_marker(self, connection: BaseDatabaseWrapper) -> Any:
        """Whether a transaction is open: after a COMMIT through a cursor, the completion
        UPDATE would run and commit on its own. It costs nothing."""
        raw = connection.connection
        return None if raw is None or not raw.in_transaction else "in-transaction"

    def complete(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
                 check: Any = None, final: bool = False, then: Begin | None = None) -> int:
        """In the handler's transaction (which holds the write lock), on the ``sqlite3``
        connection directly (``direct``)."""
        if check is not None and not check.unchanged():
            raise TransactionEnded
        raw = direct.connection_for(connection) if connection.in_atomic_block else None
        if raw is not None:
            return direct.execute(connection, raw, sql, params).rowcount
        return super().complete(connection, sql, params)

    # ----- SQL fragments ----------------------------------------------------------------

    def claim_statement(self, claim: Claim) -> tuple[str, list[Any]]:
        sql = claim.candidates
        if claim.index is not None:
            # Statistics (ANALYZE, PRAGMA optimize) of a table whose units are all waiting
            # make SQLite scan and sort the whole table for LIMIT 1 or 2: name the index.
            table = claim.table
            sql = sql.replace(f"FROM {table} ", f"FROM {table} INDEXED BY {claim.index} ", 1)
        return sql, list(claim.candidate_params)

    def json_append(self, column: str) -> str:
        return f"json_insert({column}, '$[#]', %s)"

    def json_drop_last(self) -> str:
        return "json_remove(%(expressions)s, '$[#-1]')"

    def json_last(self, key: str) -> str:
        return f"json_extract(%(expressions)s, '$[#-1].{key}')"

    def seconds_between(self) -> tuple[str, bool]:
        return "((julianday({second}) - julianday({first})) * 86400.0)", True

    def limit_statements(self, connection: BaseDatabaseWrapper,
                         seconds: float) -> Callable[[], None]:
        # A progress handler that interrupts the statement running past the deadline.
        raw = connection.connection
        deadline = time.monotonic() + seconds
        raw.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
        return lambda: raw.set_progress_handler(None, 0)

    def stopped_by_limit(self, exc: BaseException) -> bool:
        return "interrupted" in str(exc).lower()

    # ----- wake-ups ---------------------------------------------------------------------

    # ----- space -----------------------------------------------------------------------

    def space(self, connection: BaseDatabaseWrapper, tables: Sequence[str]) -> dict[str, Any]:
        """The whole file (SQLite frees pages per database, not per table): pages on the
        free list are space a VACUUM, or an incremental one, gives back; ``wal_bytes``,
        the write-ahead log beside it (``-wal``), which a checkpoint only reuses and
        ``dbworker vacuum`` truncates."""
        with connection.cursor() as cursor:
            page_size = _pragma(cursor, "page_size")
            pages = _pragma(cursor, "page_count")
            free = _pragma(cursor, "freelist_count")
            mode = _pragma(cursor, "auto_vacuum")
        wal = f"{connection.settings_dict['NAME']}-wal"
        return {"scope": "database file", "total_bytes": pages * page_size,
                "free_bytes": free * page_size, "dead_rows": None,
                "auto_vacuum": AUTO_VACUUM.get(mode, str(mode)),
                "wal_bytes": os.path.getsize(wal) if os.path.exists(wal) else 0}

    def vacuum_statements(self, connection: BaseDatabaseWrapper, tables: Sequence[str], *,
                          full: bool) -> list[str]:
        """VACUUM rewrites the file without its free pages, and turns incremental
        auto-vacuum on first (it takes effect only through a VACUUM), so that retention
        gives the pages back batch by batch afterwards (``after_prune``). A VACUUM writes
        the whole database through the write-ahead log, which keeps its size after a
        checkpoint: the last statement copies it back and truncates it to nothing (as
        far as no reader still needs it)."""
        return ["PRAGMA auto_vacuum = INCREMENTAL", "VACUUM", "PRAGMA wal_checkpoint(TRUNCATE)"]

    def after_prune(self, connection: BaseDatabaseWrapper) -> int:
        """In incremental auto-vacuum mode, give the free pages back (``PRAGMA
        incremental_vacuum``: about as many as the batch freed, so its cost follows the
        batch); otherwise nothing: the pages wait on the free list for new rows, or for
        ``dbworker vacuum``."""
        with connection.cursor() as cursor:
            if _pragma(cursor, "auto_vacuum") != 2:
                return 0
            free = _pragma(cursor, "freelist_count")
            if free:
                cursor.execute("PRAGMA incremental_vacuum")
                cursor.fetchall()
            return free

    def commit_counter(self, connection: BaseDatabaseWrapper) -> int | None:
        """``PRAGMA data_version``: from shared memory, for a few microseconds, on the
        sqlite3 connection itself (Django's cursor costs ten times the PRAGMA)."""
        connection.ensure_connection()
        return connection.connection.execute("PRAGMA data_version").fetchone()[0]

    # ----- triggers (rows/triggers.py) ---------------------------------------------------

    def create_row_triggers(self, connection: BaseDatabaseWrapper,
                            triggers: RowTriggers) -> list[str]:
        """Row triggers (SQLite has no others). The insert checks the unique index first
        instead of ``INSERT OR IGNORE``: a trigger's statements take the conflict clause
        of the statement that fired them, so an ``INSERT OR REPLACE`` of a source row
        would replace the row's execution (its status and history) with a new one.

        Timestamps as Django writes them here: text, UTC with ``USE_TZ`` (local time
        without), to the microsecond (SQLite's ``%f`` gives milliseconds)."""
        q = connection.ops.quote_name
        t = triggers
        new_key = f"CAST(NEW.{q(t.pk)} AS TEXT)"
        now = ("strftime('%Y-%m-%d %H:%M:%f000', 'now'"
               + (", 'localtime')" if t.local_time else ")"))
        values = ", ".join(v.format(key=new_key, now=now,
                                    sort_key=f"NEW.{q(t.pk)}" if t.integer_pk else "NULL")
                           for v in t.values)
        ex, key_column = q(t.executions), q(t.key_column)
        insert = (
            f"INSERT INTO {ex} ({', '.join(q(c) for c in t.columns)})\n"
            f"  SELECT {values}\n"
            f"  WHERE NOT EXISTS (SELECT 1 FROM {ex} WHERE {t.mine} "
            f"AND {key_column} = {new_key});")
        doomed = (f"{key_column} = CAST(OLD.{q(t.pk)} AS TEXT) AND {t.mine} "
                  f"AND {t.deletable}")
        delete = "\n  ".join(
            [f"DELETE FROM {q(table)} WHERE {q(column)} IN (SELECT id FROM {ex} WHERE "
             f"{doomed});" for table, column in t.dependents]
            + [f"DELETE FROM {ex} WHERE {doomed};"])
        return row_trigger_statements(q, t, insert, delete)

    def drop_row_trigger(self, connection: BaseDatabaseWrapper, trigger: Trigger) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {connection.ops.quote_name(trigger.name)}"]

    def row_triggers(self, connection: BaseDatabaseWrapper, prefix: str) -> list[Trigger]:
        with connection.cursor() as cursor:
            cursor.execute("SELECT name, tbl_name, sql FROM sqlite_master WHERE type = "
                           "'trigger' AND substr(name, 1, %s) = %s ORDER BY name",
                           [len(prefix), prefix])
            return [Trigger(name, table, text) for name, table, text in cursor.fetchall()]


def with_short_waits(connection: Any, attempt: Callable[[], Any]) -> Any:
    """Run ``attempt`` (a BEGIN IMMEDIATE, or a write in autocommit); while the write lock
    is busy, try again after tens of microseconds, then after a millisecond.

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
        raw.execute(f"PRAGMA busy_timeout = {busy_timeout_ms(connection)}")
    return attempt()


def busy_timeout_ms(connection: Any) -> int:
    """``SQLITE_BUSY_TIMEOUT``, or the shorter wait ``Engine.bound_lock_waits`` set."""
    seconds = getattr(connection, "_dbworker_lock_wait", None)
    return int((conf.get().SQLITE_BUSY_TIMEOUT if seconds is None else seconds) * 1000)
