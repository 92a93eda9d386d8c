"""What the stores ask of a database: the engine interface, one implementation per database.

Everything that differs between databases (a statement's SQL, how it is sent, what a
connection needs first, how idle supervisors are woken) is a method or a capability flag
here. ``rows/``, ``tasks/``, ``supervisor/`` and the rest call ``db.engine(using)`` and never
ask which database they talk to. ``db/postgresql.py`` and ``db/sqlite.py`` implement it; a
new database is one more module registered in ``db/__init__.py`` (Oban's engines are the
model). The defaults here are portable SQL and Django's own cursor; an engine overrides
what its database does better or differently.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from django.core.checks import CheckMessage
from django.db import NotSupportedError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper


class TransactionEnded(Exception):
    """A completion ran in another transaction than the one its handler began."""


class CompletionUncertain(Exception):
    """The query that held a row's completion, its COMMIT and the next unit's first
    statement (``Begin``) failed, and which of them failed is not known: whether the
    completion committed is for the caller to find out. ``error``: what the query raised;
    the connection is out of any transaction."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(slots=True)
class Begin:
    """The next unit's transaction, to begin in the query that commits a row's completion
    (``Engine.begins_with_completion``): its first statement (the next unit's source row
    read) and its parameters. ``rows``: what that statement returned, set once the
    transaction began (None: it did not; the connection is then as after any completion)."""

    sql: str
    params: Sequence[Any]
    rows: list[tuple[Any, ...]] | None = None


@dataclass(frozen=True, slots=True)
class Claim:
    """A claim as the stores describe it to the engine: which rows, in what order, and what
    to write to them. The engine decides how many statements that takes."""

    #: The table, quoted.
    table: str
    #: ``SET`` of the UPDATE (``state = %s, ...``), and its parameters.
    sets: str
    set_params: Sequence[Any]
    #: ``SELECT id FROM ... ORDER BY ... LIMIT n`` (``FOR UPDATE SKIP LOCKED`` where the
    #: database has it): the units to claim, in the order they must be claimed.
    candidates: str
    candidate_params: Sequence[Any]
    #: Columns the claim returns of each claimed row; the first is its id.
    returning: str
    #: The partial index ``candidates`` must read (an engine whose planner may stray names
    #: it), or None.
    index: str | None = None
    #: The candidates' ids (database values, in claim order) when the caller's transaction
    #: holds them already: an engine that reads the candidates in a statement of their own
    #: (SQLite, MySQL) skips that statement; PostgreSQL's one statement still reads
    #: ``candidates``. The rows then come back in no particular order.
    ids: Sequence[Any] | None = None


@dataclass(frozen=True, slots=True)
class RowTriggers:
    """A worker's two triggers as ``rows/triggers.py`` describes them to the engine, which
    writes them in its database's SQL. Names are unquoted; the SQL fragments are ours."""

    #: The source table, its primary key column, and whether that key is an integer (then
    #: it is also the execution's ``sort_key``).
    table: str
    pk: str
    integer_pk: bool
    #: The executions table and the columns of a new execution, with the SQL of each value:
    #: a constant, or ``{key}`` (the row's key as text), ``{sort_key}``, ``{now}``.
    executions: str
    columns: tuple[str, ...]
    values: tuple[str, ...]
    #: SQL conditions on the executions table: this worker's executions, and those of them
    #: the delete trigger may remove (with ``key_column`` the deleted row's key).
    key_column: str
    mine: str
    deletable: str
    #: ``(table, column)`` of the rows that refer to an execution by its ``id``: the delete
    #: trigger deletes them first (their foreign key is checked at commit, and the ORM's
    #: cascade would find no execution left to cascade from).
    dependents: tuple[tuple[str, str], ...]
    #: The triggers' names (PostgreSQL: their functions' too) and the text each carries in
    #: a comment, which the catalog gives back (``Trigger.text``).
    insert_name: str
    delete_name: str
    insert_mark: str
    delete_mark: str
    #: ``(channel, payload)`` to announce new rows on (NOTIFY), or None.
    notify: tuple[str, str] | None = None
    #: Timestamps in local time (SQLite with ``USE_TZ = False``), else UTC.
    local_time: bool = False


@dataclass(frozen=True, slots=True)
class Trigger:
    """A trigger as the database's catalog has it."""

    name: str
    table: str
    #: Its SQL text (PostgreSQL: its function's body), comments included.
    text: str


class Engine:
    """One database's way of doing what the stores need. Stateless: one instance per
    database vendor, methods take the Django connection (or a cursor on it)."""

    vendor: ClassVar[str] = ""

    # ----- capability flags -------------------------------------------------------------

    #: A child's record of a unit also needs its lease unexpired, not only its token (not
    #: where a handler's transaction holds the only write lock, so renewals wait behind it).
    checks_lease_on_record: ClassVar[bool] = True
    #: Writers do not all queue for one lock: a supervisor's own writes (reaping, sweeps)
    #: do not wait for a running handler's transaction (not SQLite: one write lock).
    concurrent_writers: ClassVar[bool] = True
    #: Supervisors can be woken by the writer's transaction (LISTEN/NOTIFY).
    notifies: ClassVar[bool] = False
    #: A transaction that only reads may still take the one write lock (SQLite's BEGIN
    #: IMMEDIATE, the transaction mode runworkers needs): operator reads run outside one,
    #: so a health probe never waits for a handler's transaction.
    read_transactions_lock: ClassVar[bool] = False
    #: ``prefer_index_scans`` does something, inside a transaction of its own
    #: (``db.connections.index_first``); where it does nothing, no transaction is opened
    #: for it (on SQLite it would take the write lock for a read).
    steers_planner: ClassVar[bool] = False
    #: A row's completion may COMMIT in the same query when it ends its transaction
    #: (``complete(..., final=True)``); the runner only works out ``final`` where it can.
    commits_with_completion: ClassVar[bool] = False
    #: A completion that COMMITs in its query may also begin the next unit's transaction
    #: there, with that transaction's first statement (``complete(..., then=Begin(...))``):
    #: one round trip between two units of a child instead of two (``rows/chain.py``).
    begins_with_completion: ClassVar[bool] = False
    #: An idle supervisor can learn cheaply that another connection committed.
    watches_commits: ClassVar[bool] = False
    #: ``set_progress()`` inside a transactional handler writes in the handler's own
    #: transaction (a side connection would wait for the write lock the handler holds).
    progress_in_handler_transaction: ClassVar[bool] = False
    #: Another connection's UPDATE of a row a transaction inserted and has not committed
    #: waits for that transaction (InnoDB) instead of not finding the row.
    writes_wait_for_uncommitted_rows: ClassVar[bool] = False
    #: A locking read (``FOR UPDATE``) locks each row its index walk meets before its WHERE
    #: filters the row out (InnoDB; PostgreSQL filters first): a walk that filters many
    #: rows reads them without locks, and locks only the rows it picked.
    locks_rows_it_filters: ClassVar[bool] = False

    # ----- connections ------------------------------------------------------------------

    def on_connection_created(self, connection: BaseDatabaseWrapper) -> None:
        """Set up a new connection to our database (every process)."""

    def know_features(self, connection: BaseDatabaseWrapper) -> None:
        """Answer Django's feature probes that would otherwise touch the database."""

    def own_process(self, connection: BaseDatabaseWrapper, *, runs_units: bool = False) -> None:
        """Set up ``connection`` in one of our own processes (a supervisor, a child, a
        completion thread); ``runs_units``: it runs units over and over (a child)."""

    def bound_lock_waits(self, connection: BaseDatabaseWrapper, seconds: float) -> None:
        """Make statements on ``connection`` (this thread's) wait at most ``seconds`` for a
        lock another connection holds, then fail, from now and after every reconnect: the
        renewer's, so a fork never waits long for it (``supervisor/renewer.py``)."""
        connection._dbworker_lock_wait = seconds  # type: ignore[attr-defined]
        if connection.connection is not None:
            self.on_connection_created(connection)

    def transaction_pooled(self, connection: BaseDatabaseWrapper) -> bool | None:
        """Whether ``connection``'s settings reach the database through a
        transaction-pooling pooler (None: cannot tell); ``db/pooler.py``."""
        return False

    def lock_wait_scope(self, connection: BaseDatabaseWrapper) -> Any:
        """What statements bounded by ``bound_lock_waits`` run inside (a context manager):
        nothing where the bound is a setting of the session (``on_connection_created``)."""
        return contextlib.nullcontext()

    def problem(self, connection: BaseDatabaseWrapper) -> str | None:
        """Why this database cannot run our queue at all (None: it can). Enqueueing
        refuses such a database, so no task is stored that could never run."""
        return None

    def in_memory(self, connection: BaseDatabaseWrapper) -> bool:
        """Whether the database lives in one process's memory (other processes cannot see
        it)."""
        return False

    def setting_checks(self, alias: str, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
        """System-check messages about the database's settings."""
        return []

    def connection_gone(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the connection or the server went away (a restart, a
        failover, a terminated session, a network failure): an outage for every unit
        recorded through that connection, whichever call saw it (``db.errors``)."""
        return False

    def session_lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the session lost something of ours (not the unit's fault:
        the unit goes back and the process opens a new session)."""
        return False

    def server_trouble(self, exc: BaseException) -> bool:
        """Whether ``exc`` is the server's own state, not a value it was sent: out of
        resources (disk, memory, connections), read-only, a statement cancelled or timed
        out (``db.errors``)."""
        return False

    def transient(self, exc: BaseException) -> bool:
        """Whether ``exc`` is an error of this database that the same statements may simply
        meet no more if run again (a deadlock, a lock wait timeout), beyond those every
        engine shares (``supervisor.units.transient``)."""
        return False

    def set_table_storage(self, schema_editor: Any, tables: Sequence[str],
                          parameters: dict[str, Any]) -> None:
        """Storage parameters for the tables whose rows churn all day (migration 0004):
        applied where the database has these parameters, else nothing."""

    def reset_table_storage(self, schema_editor: Any, tables: Sequence[str],
                            parameters: dict[str, Any]) -> None:
        """Undo ``set_table_storage``."""

    # ----- statements -------------------------------------------------------------------

    def one_statement(self, connection: BaseDatabaseWrapper) -> Any:
        """The transaction a single claim statement runs in."""
        return transaction.atomic(using=connection.alias)

    def execute_status(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """Execute one of our status statements (a claim, a task's completion): its loss
        in a database crash costs a re-run, never a unit. The cursor is left at its
        result."""
        cursor.execute(sql, params)

    def execute_completion(self, cursor: Any, sql: str, params: Sequence[Any],
                           then: str = "") -> None:
        """Execute a row's completion (its WHERE ending with ``completion_tail()``);
        ``then``: a statement to run after it in the same query, where the engine can."""
        cursor.execute(sql + (f"; {then}" if then else ""), params)

    def completion_tail(self, connection: BaseDatabaseWrapper) -> str:
        """What a row completion's WHERE ends with (always true)."""
        return ""

    def read(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
             first: bool = False) -> list[tuple[Any, ...]]:
        """The rows of a unit's read (its source row); ``first``: the first statement of
        the transaction ``transaction.atomic()`` just opened."""
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()

    @contextlib.contextmanager
    def pipelined(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """Statements of the block sent without waiting for each other's results, where
        the engine can; only for statements whose results nobody reads."""
        yield

    def begun_with_first_statement(self, connection: BaseDatabaseWrapper) -> Any:
        """Inside ``transaction.atomic()``, before its first statement: the transaction's
        BEGIN goes with that statement, where the engine can (a round trip less)."""
        return contextlib.nullcontext()

    def committed_with_statement(self, connection: BaseDatabaseWrapper) -> Any:
        """Around the last statement of the outermost ``transaction.atomic()`` block (one
        statement, whose results are read after it ran): COMMIT goes with it where the
        engine can, and the block's end then has nothing left to commit."""
        return contextlib.nullcontext()

    def one_transaction(self, connection: BaseDatabaseWrapper) -> Any:
        """Statements of the block, whose results nobody reads, run in one transaction: the
        caller's (a savepoint of it), or one of their own; an exception rolls all of them
        back. Here ``transaction.atomic()``; an engine may send them together and spare the
        round trips of BEGIN and COMMIT."""
        return transaction.atomic(using=connection.alias)

    # ----- the transaction of a transactional handler ----------------------------------

    #: SQL of a value that changes when the transaction ends and another begins, read by
    #: the unit's own statements (selected with the source row, returned by the
    #: completion); None: ``transaction_marker`` reads it without a statement.
    marker_sql: ClassVar[str | None] = None

    def transaction_marker(self, connection: BaseDatabaseWrapper) -> Any:
        """A value that changes if the current transaction ends and another begins."""
        return None

    def end_read_transaction(self, connection: BaseDatabaseWrapper) -> None:
        """Roll back the transaction a transactional handler is in (``Context.released``),
        under Django's feet: its atomic block stays open and a new transaction begins with
        ``begin_write_transaction``."""
        raw = connection.connection
        if raw is not None:
            raw.rollback()

    def begin_write_transaction(self, connection: BaseDatabaseWrapper) -> None:
        """Begin the transaction after ``end_read_transaction`` (where the driver begins one
        by itself at the next statement, nothing)."""

    def mark_transaction(self, connection: BaseDatabaseWrapper) -> Any:
        """``transaction_marker`` at the start of a transactional handler's transaction
        (where ``marker_sql`` is None): an engine may set a mark up here."""
        return self.transaction_marker(connection)

    def complete(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
                 check: Any = None, final: bool = False, then: Begin | None = None) -> int:
        """Run a row's fenced completion ``sql``; the rows it changed (0: the claim is not
        current). ``check``: the ``TransactionCheck`` of a transactional handler, verified
        here (``TransactionEnded`` if the handler ended its transaction). ``final``: the
        completion is the last statement of the outermost transaction, so an engine may
        COMMIT with it; returns 1 only once committed then. ``then``: where the engine
        ``begins_with_completion`` and COMMITs with this one, the next transaction to begin
        in the same query (``then.rows`` tells whether it did); elsewhere ignored."""
        if check is not None and not check.unchanged():
            raise TransactionEnded
        with connection.cursor() as cursor:
            self.execute_completion(cursor, sql, params)
            return cursor.rowcount

    # ----- claims -----------------------------------------------------------------------

    def candidate_ids(self, cursor: Any, claim: Claim) -> list[Any]:
        """The ids ``claim`` takes: those the caller holds already (``claim.ids``), else
        what its candidates' statement selects."""
        if claim.ids is not None:
            return list(claim.ids)
        sql, params = self.claim_statement(claim)
        cursor.execute(sql, params)
        return [row[0] for row in cursor.fetchall()]

    def claim(self, cursor: Any, claim: Claim) -> list[tuple[Any, ...]]:
        """Claim the candidates of ``claim``; the rows it returns, in the candidates' order
        (a batch keeps eligible's order and the tasks' priority order). Run in the
        transaction of ``one_statement()``.

        Here: the candidates' ids first, then one UPDATE of those ids, the rows sorted by
        the ids' positions; the caller's transaction holds them meanwhile (locked by ``FOR
        UPDATE``, or by the database's only write lock); no SELECT when it holds them
        already (``claim.ids``)."""
        ids = self.candidate_ids(cursor, claim)
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        self.execute_status(cursor, f"UPDATE {claim.table} SET {claim.sets} "
                                    f"WHERE id IN ({marks}) RETURNING {claim.returning}",
                            [*claim.set_params, *ids])
        position = {value: i for i, value in enumerate(ids)}
        return sorted(cursor.fetchall(), key=lambda row: position[row[0]])

    def claim_statement(self, claim: Claim) -> tuple[str, list[Any]]:
        """The first statement ``claim()`` sends, with its parameters (``EXPLAIN`` it to see
        how the candidates are found)."""
        return claim.candidates, list(claim.candidate_params)

    # ----- SQL fragments ----------------------------------------------------------------

    def probe_template(self) -> str | None:
        """The template of the EXISTS that tests one waiting unit's source row (None:
        Django's own)."""
        return None

    def json_append(self, column: str) -> str:
        """SQL of JSON list ``column`` with one more text element, the parameter ``%s``."""
        raise self.unsupported("appending to a JSON list")

    def json_drop_last(self) -> str:
        """A ``Func`` template: its JSON list expression without the last element."""
        raise self.unsupported("removing from a JSON list")

    def json_last(self, key: str) -> str:
        """A ``Func`` template: ``key`` of the last element of a JSON list expression."""
        raise self.unsupported("reading a JSON list")

    def seconds_between(self) -> tuple[str, bool]:
        """SQL of the seconds from ``{first}`` to ``{second}`` (two datetime expressions) as
        a float, computed by the database (never a Python function per row), and whether
        ``{second}`` comes first in it (the order of the parameters)."""
        raise self.unsupported("subtracting times")

    # ----- the operator's reads -----------------------------------------------------------

    def limit_statements(self, connection: BaseDatabaseWrapper,
                         seconds: float) -> Callable[[], None]:
        """Stop each statement of the current transaction that runs past ``seconds`` (the
        database raises its own error); returns what puts the connection back after."""
        return lambda: None

    def stopped_by_limit(self, exc: BaseException) -> bool:
        """``exc`` is the error of a statement ``limit_statements`` stopped."""
        return False

    def prefer_index_scans(self, cursor: Any, prefer: bool = True,
                           ordered: bool = False) -> None:
        """Inside a transaction: have its planner read by index where one serves, not by
        sequential scans its guesses favour on tables without statistics (then ``prefer``
        False puts it back, before the transaction goes on with other work); ``ordered``:
        in the index's order too (a newest-first read with a LIMIT), not a bitmap of it."""

    def values_source(self, connection: BaseDatabaseWrapper, columns: Sequence[Any],
                      rows: Sequence[Sequence[Any]]) -> tuple[tuple[str, list[Any]],
                                                                tuple[str, list[Any]]]:
        """Rows ``v(columns...)`` to ``UPDATE ... FROM``: a WITH clause and what to select
        them FROM, each with its parameters; ``columns``: model fields, ``rows``: Python
        values in their order."""
        params: list[Any] = []
        for row in rows:
            params += [f.get_db_prep_save(value, connection) for f, value in zip(columns, row,
                                                                                 strict=True)]
        names = ", ".join(f.column for f in columns)
        marks = ", ".join(["(" + ", ".join(["%s"] * len(columns)) + ")"] * len(rows))
        return (f"WITH v ({names}) AS (VALUES {marks}) ", params), ("v", [])

    def update_from_values(self, cursor: Any, table: str, sets: str, set_params: Sequence[Any],
                           columns: Sequence[Any], rows: Sequence[Sequence[Any]], where: str,
                           where_params: Sequence[Any], *, returning: str,
                           announce: str | None = None) -> list[tuple[Any, ...]]:
        """``UPDATE table SET sets FROM v WHERE where RETURNING returning``: ``v`` has the
        ``rows`` (Python values) in ``columns`` (model fields), ``sets`` and ``where`` may
        name ``v.<column>``. One status statement (``execute_status``); the rows updated.
        ``announce``: a channel to notify of the (one) returned column's values, in the
        same statement, where the engine notifies (``announcing``)."""
        connection = cursor.db
        (with_values, before), (values, within) = self.values_source(connection, columns, rows)
        sql = (f"{with_values}UPDATE {table} SET {sets} FROM {values} WHERE {where} "
               f"RETURNING {returning}")
        params = [*before, *set_params, *within, *where_params]
        if announce is not None and self.notifies:
            sql, params = self.announcing(sql, params, announce)
        self.execute_status(cursor, sql, params)
        return cursor.fetchall()

    def announcing(self, sql: str, params: list[Any], channel: str,
                   ) -> tuple[str, list[Any]]:
        """``sql`` (a statement returning one column) that also notifies ``channel`` of
        the values it returns, comma-separated (``db/notify.py``'s ``ended_payload``).
        Only where the engine ``notifies``."""
        raise NotImplementedError

    def key_text(self, sql: str) -> str:
        """SQL of a primary key expression ``sql`` as the text ``source_id`` holds
        (``db.keys.key_expression`` in SQL text)."""
        return f"CAST({sql} AS TEXT)"

    def insert_select_ignoring(self, head: str, select: str) -> str:
        """``head`` (``INSERT INTO t (columns)``) then ``select``, skipping the rows that
        would break a unique constraint. (The ``WHERE`` keeps SQLite from reading the
        upsert's ``ON`` as a join's.)"""
        return f"{head} {select} WHERE true ON CONFLICT DO NOTHING"

    def json_rows_insert(self, head: str, columns: Sequence[Any], per_row: dict[str, int],
                         connection: BaseDatabaseWrapper) -> str | None:
        """An INSERT (``head`` names ``columns``, model fields) that takes the values every
        row shares as parameters, then the per-row values as one JSON list of lists
        (``per_row``: field name -> its place in a row's list); None: rows go as one
        parameter list each."""
        return None

    # ----- wake-ups ---------------------------------------------------------------------

    def notify(self, connection: BaseDatabaseWrapper, channel: str, what: str) -> None:
        """Announce ``what`` on ``channel`` when the current transaction commits."""

    def notify_statement(self, channel: str, what: str) -> tuple[str, list[Any]] | None:
        """``notify`` as a statement to run with others (``one_query``); None: none."""
        return None

    def one_query(self, connection: BaseDatabaseWrapper,
                  statements: Sequence[tuple[str, Sequence[Any]]], *,
                  durable: bool = True) -> bool:
        """Run ``statements`` (SQL and parameters, results unread) in one query, one round
        trip, where the engine can: outside a transaction as one transaction of their own
        (no BEGIN and COMMIT round trips), inside one as part of it. ``durable`` False:
        what they write is ours and found again if lost (a pending execution: discovery),
        so their own transaction may commit without waiting for the WAL flush
        (``DBWORKER["ASYNC_COMMIT"]``). False: nothing was run; the caller runs them its
        own way."""
        return False

    def listen(self, connection: BaseDatabaseWrapper, channel: str) -> Any:
        """A connection of its own (``connection``'s parameters, autocommit) listening on
        ``channel``: it has ``closed``, ``fileno()`` (the socket to wait on),
        ``received()`` (the payloads announced since the last call; raises once the
        connection is lost) and ``close()``. Only where the engine ``notifies``."""
        raise self.unsupported("listening for announcements")

    def commit_counter(self, connection: BaseDatabaseWrapper) -> int | None:
        """A number that changes when another connection commits (None: unknown)."""
        return None

    # ----- triggers (rows/triggers.py) ---------------------------------------------------

    def create_row_triggers(self, connection: BaseDatabaseWrapper,
                            triggers: RowTriggers) -> list[str]:
        """The statements that create a worker's AFTER INSERT trigger (a PENDING execution
        for each new row unless it has one, in the writer's transaction; announced on
        ``triggers.notify``) and its AFTER DELETE trigger (the row's deletable executions
        removed, after the rows of ``triggers.dependents`` that refer to them); any
        triggers of the same names are replaced."""
        raise self.unsupported("database triggers")

    def drop_row_trigger(self, connection: BaseDatabaseWrapper, trigger: Trigger) -> list[str]:
        """The statements that drop ``trigger`` (and what only it uses)."""
        raise self.unsupported("database triggers")

    def row_triggers(self, connection: BaseDatabaseWrapper, prefix: str) -> list[Trigger]:
        """The triggers whose names start with ``prefix``, on the tables this connection
        sees."""
        raise self.unsupported("database triggers")

    # ----- errors -----------------------------------------------------------------------

    # ----- space given back after pruning (retention.py, ``dbworker vacuum``) -----------

    def horizon(self, connection: BaseDatabaseWrapper,
                tables: Sequence[str]) -> dict[str, Any]:
        """What keeps deleted rows from being cleaned up (``insight.horizon``'s keys): the
        oldest open transaction of another connection (``oldest_transaction``: seconds,
        holder, pid, state; None when there is none or the database does not say),
        PostgreSQL's dead row versions per table (``dead_rows``), InnoDB's history list
        length (``history_length``). Reads only the server's own views, never our tables."""
        return {"oldest_transaction": None, "dead_rows": None, "history_length": None}

    def space(self, connection: BaseDatabaseWrapper, tables: Sequence[str]) -> dict[str, Any]:
        """What ``tables`` take and how much of it is free or dead (``Space`` keys)."""
        raise self.unsupported("reporting table space")

    def vacuum_statements(self, connection: BaseDatabaseWrapper, tables: Sequence[str], *,
                          full: bool) -> list[str]:
        """What ``dbworker vacuum`` runs, outside any transaction."""
        raise self.unsupported("vacuum")

    def after_prune(self, connection: BaseDatabaseWrapper) -> int:
        """The cheap step retention takes after each batch it deleted: pages given back to
        the file system, where the database can do that a little at a time (0: nothing)."""
        return 0

    def unsupported(self, what: str) -> NotSupportedError:
        """The error for what this engine cannot do (``what``, e.g. "listening for
        announcements")."""
        return NotSupportedError(
            f"django-dbworker's {self.vendor} engine cannot do this: {what} (see "
            "docs/architecture.md for what each database's engine does).")


def row_trigger_statements(q: Any, t: RowTriggers, insert: str, delete: str) -> list[str]:
    """Drop, then create, a worker's two row triggers (``FOR EACH ROW``, the mark in a
    comment of the body): the form SQLite and MariaDB/MySQL share."""
    statements = []
    for name, mark, body, event in ((t.insert_name, t.insert_mark, insert, "INSERT"),
                                    (t.delete_name, t.delete_mark, delete, "DELETE")):
        statements += [
            f"DROP TRIGGER IF EXISTS {q(name)}",
            f"CREATE TRIGGER {q(name)} AFTER {event} ON {q(t.table)} FOR EACH ROW "
            f"BEGIN\n  /* {mark} */\n  {body}\nEND",
        ]
    return statements


class Unsupported(Engine):
    """A database we have no engine for: refused by a system check (E012), and by every
    statement that would need it."""

    def __init__(self, vendor: str) -> None:
        self.vendor = vendor  # type: ignore[misc]

    def problem(self, connection: BaseDatabaseWrapper) -> str | None:
        return (f"django-dbworker has no engine for the database vendor {self.vendor!r}; "
                f"it runs on {', '.join(sorted(supported()))} (check E012).")

    def unsupported(self, what: str) -> NotSupportedError:
        return NotSupportedError(
            f"django-dbworker has no engine for the database vendor {self.vendor!r} "
            f"({what}); it runs on {', '.join(sorted(supported()))}.")


#: Django's ``connection.vendor`` -> our engine's ``module:Class`` (relative to ``db``),
#: imported when first asked for: the entries of ``db.ENGINES`` (which fills them in).
VENDORS: dict[str, Engine | str] = {
    "mysql": ".mysql:MySQL", "postgresql": ".postgresql:PostgreSQL", "sqlite": ".sqlite:SQLite"}


def supported() -> list[str]:
    """The vendors we have an engine for."""
    return list(VENDORS)
