"""PostgreSQL (psycopg 3): the production engine.

Round trips are what a unit costs here, so statements travel together where psycopg's
client-side binding lets several go in one query (BEGIN with the first read, COMMIT with
the completion, ``SET LOCAL synchronous_commit`` with a status statement), a runworkers
child prepares its per-unit statements (``prepared``), enqueue_many pipelines its inserts,
and idle supervisors are woken by NOTIFY.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any, ClassVar

from django.db import DatabaseError, DataError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import JSONField

from .. import conf
from . import prepared
from .engine import (
    Begin,
    Claim,
    CompletionUncertain,
    Engine,
    RowTriggers,
    TransactionEnded,
    Trigger,
)
from .prepared import binds_on_client

#: The end of a row completion's WHERE: no WAL flush at COMMIT for a transaction that wrote
#: nothing before it (``pg_current_xact_id_if_assigned()`` is NULL until a transaction
#: writes; ``set_config(..., true)`` is ``SET LOCAL``). An uncorrelated subquery, so the
#: server evaluates it once, before the UPDATE changes its row (which assigns the
#: transaction an id); always true.
STATUS_ONLY = (" AND (SELECT count(*) FROM (SELECT set_config('synchronous_commit', 'off', "
               "true) WHERE pg_current_xact_id_if_assigned() IS NULL) AS status_only) >= 0")
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"

#: What the committing completion fails with when it must not commit (the server's log
#: shows them as "invalid input syntax for type integer"). SQL string literals: no quotes.
_NOT_CURRENT = "dbworker: the claim is no longer current, nothing committed"
_ENDED = "dbworker: the transaction of the handler ended before its completion"


class PostgreSQL(Engine):
    vendor = "postgresql"
    notifies: ClassVar[bool] = True
    steers_planner: ClassVar[bool] = True
    commits_with_completion: ClassVar[bool] = True
    begins_with_completion: ClassVar[bool] = True
    marker_sql: ClassVar[str | None] = "transaction_timestamp()"

    # ----- connections ------------------------------------------------------------------

    @contextlib.contextmanager
    def lock_wait_scope(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """One transaction with ``SET LOCAL lock_timeout`` where ``bound_lock_waits`` asked
        for one (the renewer's round). Not a session's ``SET``: behind a transaction-pooling
        PgBouncer it would stay on the server connection that ran it, for the next client of
        the pool, and the statements after it might run on another one without it."""
        seconds = getattr(connection, "_dbworker_lock_wait", None)
        if seconds is None:
            yield
            return
        with transaction.atomic(using=connection.alias):
            with self.begun_with_first_statement(connection), connection.cursor() as cursor:
                # BEGIN goes with it: a round trip less per renewal round
                cursor.execute(f"SET LOCAL lock_timeout = {max(1, int(seconds * 1000))}")
            yield

    def own_process(self, connection: BaseDatabaseWrapper, *, runs_units: bool = False) -> None:
        if runs_units:
            prepared.activate()

    def connection_gone(self, exc: BaseException) -> bool:
        """SQLSTATE class 08 (connection exception), 57P01-57P03 and 57P05 (administrator
        command, crash shutdown, cannot connect now, idle-session timeout), or psycopg's
        own ``OperationalError`` without a SQLSTATE ("the connection is closed", "server
        closed the connection unexpectedly", "consuming input failed"), except a pipeline
        aborted by an earlier statement's error."""
        import psycopg

        cause = _cause(exc)
        if not isinstance(cause, psycopg.Error):
            return False
        state = cause.sqlstate
        if state is None:
            return (isinstance(cause, psycopg.OperationalError)
                    and not isinstance(cause, psycopg.errors.PipelineAborted))
        return state.startswith("08") or state in GONE_STATES

    def session_lost(self, exc: BaseException) -> bool:
        return prepared.lost(exc) or protocol_confused(exc)

    def server_trouble(self, exc: BaseException) -> bool:
        """Classes 53 (insufficient resources), 57 (a cancelled or timed-out statement),
        58 (system error), and a read-only transaction or a lock not available (25006,
        55P03, 55006)."""
        state = getattr(_cause(exc), "sqlstate", None) or ""
        return state[:2] in ("53", "57", "58") or state in TROUBLE_STATES

    def set_table_storage(self, schema_editor: Any, tables: Sequence[str],
                          parameters: dict[str, Any]) -> None:
        settings = ", ".join(f"{name} = {value}" for name, value in parameters.items())
        for table in tables:
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} "
                                  f"SET ({settings})")

    def reset_table_storage(self, schema_editor: Any, tables: Sequence[str],
                            parameters: dict[str, Any]) -> None:
        for table in tables:
            schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(table)} "
                                  f"RESET ({', '.join(parameters)})")

    # ----- statements -------------------------------------------------------------------

    def one_statement(self, connection: BaseDatabaseWrapper) -> Any:
        """None of its own outside a transaction: autocommit commits it, and saves BEGIN
        and COMMIT round trips."""
        if connection.get_autocommit():
            return contextlib.nullcontext()
        return super().one_statement(connection)

    def execute_status(self, cursor: Any, sql: str, params: Sequence[Any]) -> None:
        """With ``DBWORKER["ASYNC_COMMIT"]`` its transaction does not wait for the WAL flush
        (an fsync, the most part of a one-row transaction's time): ``SET LOCAL
        synchronous_commit = off`` goes in the same query (one round trip; client-side
        binding sends it with the simple protocol, which runs both in one transaction,
        the caller's or an implicit one). Later synchronous commits flush it anyway: WAL
        is written in order. With server-side binding the statement runs as it is."""
        with prepared.recovering(cursor.db):
            if conf.get().ASYNC_COMMIT and binds_on_client(cursor.db):
                cursor.execute(f"{ASYNC_COMMIT}; {sql}", params)
                cursor.nextset()
            else:
                cursor.execute(sql, params)

    def execute_completion(self, cursor: Any, sql: str, params: Sequence[Any],
                           then: str = "") -> None:
        """Prepared where ``prepared`` may; ``then`` (COMMIT) in the same query."""
        sql = prepared.query(cursor, sql)
        with prepared.recovering(cursor.db):
            cursor.execute(sql + (f"; {then}" if then else ""), params)

    def completion_tail(self, connection: BaseDatabaseWrapper) -> str:
        """``STATUS_ONLY`` with ``DBWORKER["ASYNC_COMMIT"]`` and client-side binding: a
        transaction in which nothing was written before the completion (the handler wrote
        nothing, or ran before it: ``transactional=False``) commits without waiting for
        the WAL flush, as a task's completion does: a database crash may lose the status
        and the unit runs again; it never loses a write of the handler's."""
        return STATUS_ONLY if conf.get().ASYNC_COMMIT and binds_on_client(connection) else ""

    def read(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
             first: bool = False) -> list[tuple[Any, ...]]:
        """Prepared where ``prepared`` may; ``first``: with the transaction's BEGIN in the
        same query (``execute_first``)."""
        with connection.cursor() as cursor:
            if first:
                execute_first(cursor, sql, params, prepare=True)
            else:
                with prepared.recovering(cursor.db):
                    cursor.execute(prepared.query(cursor, sql), params)
            return cursor.fetchall()

    @contextlib.contextmanager
    def pipelined(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """psycopg 3's pipeline mode, with a libpq that has it. ``execute()`` then returns
        once the statement is sent: the server runs it while Python builds the next. An
        error is raised by a later ``execute()`` or when the block ends, and the statements
        after the failing one are not run; the caller's ``transaction.atomic()`` around the
        block then rolls all of them back."""
        connection.ensure_connection()
        raw = connection.connection
        if not _pipelines(raw):
            yield
            return
        # An error the pipeline's end fetches comes from psycopg, not from Django's cursor:
        # raised as Django's own (IntegrityError, ...), as errors from execute() are.
        with connection.wrap_database_errors, raw.pipeline():
            yield

    @contextlib.contextmanager
    def begun_with_first_statement(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """The block's first statement goes as ``execute_first`` sends it: with BEGIN, in
        one query, where client-side binding allows (else as ever). Only that statement:
        an ``execute_wrapper`` that steps aside once it has run (what Django records of
        the query, ``connection.queries``, is the statement as it was asked for)."""

        def with_begin(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            cursor = context["cursor"]
            raw = _beginning(cursor)
            if raw is None or not _client_side(cursor):  # not a named (server-side) cursor
                return execute(sql, params, many, context)
            begin = raw._get_tx_start_command().decode()
            raw._autocommit = True  # for this query only, as in execute_first
            try:
                result = execute(f"{begin}; {sql}", params, many, context)
            finally:
                raw._autocommit = False
            cursor.nextset()
            return result

        with _first_statement(connection, with_begin):
            yield

    @contextlib.contextmanager
    def committed_with_statement(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """``; COMMIT`` after the block's statement, in the same query, with client-side
        binding, in the outermost atomic block that nothing marked for rollback (else the
        statement runs as it is). The cursor is left at the statement's own result; a
        statement that fails stops the query before COMMIT, and the block rolls back as
        ever. Django's commit at the block's end then finds no transaction (psycopg sends
        nothing)."""
        if not (binds_on_client(connection) and len(connection.atomic_blocks) == 1
                and connection.commit_on_exit and not connection.needs_rollback
                and not connection.savepoint_ids):
            yield
            return

        def then_commit(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
            return execute(f"{sql}; COMMIT", params, many, context)

        with _first_statement(connection, then_commit):
            yield

    @contextlib.contextmanager
    def one_transaction(self, connection: BaseDatabaseWrapper) -> Iterator[None]:
        """Outside a transaction (autocommit), with psycopg 3's pipeline: no BEGIN and no
        COMMIT, the statements go without waiting and the server runs those sent before
        the pipeline's Sync as one implicit transaction, committed at the Sync: one round
        trip in all, where ``atomic()`` and a pipeline take three (psycopg waits for its
        BEGIN; COMMIT waits). An exception in the block queues a ROLLBACK before the Sync
        (the server warns that no transaction is in progress, and rolls the implicit one
        back). Inside a transaction: a savepoint (``atomic()``) and the pipeline."""
        connection.ensure_connection()
        raw = connection.connection
        if not connection.get_autocommit() or not _pipelines(raw):
            with transaction.atomic(using=connection.alias), self.pipelined(connection):
                yield
            return
        with connection.wrap_database_errors, raw.pipeline():
            try:
                yield
            except BaseException:
                # An error of the server's has aborted the pipeline: it rolls back anyway.
                with contextlib.suppress(Exception):
                    raw.execute("ROLLBACK")
                raise

    # ----- the transaction of a transactional handler ----------------------------------

    def transaction_marker(self, connection: BaseDatabaseWrapper) -> Any:
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT {self.marker_sql}")
            return cursor.fetchone()[0]

    def complete(self, connection: BaseDatabaseWrapper, sql: str, params: Sequence[Any], *,
                 check: Any = None, final: bool = False, then: Begin | None = None) -> int:
        """The marker is read by the completion itself (``RETURNING``), so an UPDATE run in
        whatever transaction the handler left is rolled back with it; with ``final`` and
        client-side binding, the completion COMMITs in the same query, and ``then`` begins
        there too."""
        if check is None or check.begun is None:
            return super().complete(connection, sql, params,
                                    check=check if check is not None else None)
        if final and binds_on_client(connection):
            return self._complete_and_commit(connection, sql, params, check.begun, then)
        with connection.cursor() as cursor:
            self.execute_completion(cursor, f"{sql} RETURNING {self.marker_sql}", params)
            rows = cursor.fetchall()
        if rows and not check.unchanged(rows[0][0]):
            raise TransactionEnded
        return len(rows)

    def _complete_and_commit(self, connection: BaseDatabaseWrapper, sql: str,
                             params: Sequence[Any], begun: datetime,
                             then: Begin | None = None) -> int:
        """The completion, then COMMIT, in one query: the last statement of a transactional
        handler's transaction, a round trip less per unit. COMMIT runs only if the UPDATE
        changed the unit and the transaction is still the one begun (``begun``); otherwise
        the query fails before COMMIT and the transaction is left aborted for the caller to
        roll back: 0 when the claim is not current, ``TransactionEnded`` when the handler
        ended the transaction. A failed COMMIT (a deferred constraint) raises as
        ``commit()`` would.

        ``then``: after COMMIT, the same query begins the next transaction (BEGIN as
        psycopg words it) with ``then.sql`` as its first statement, whose rows go to
        ``then.rows``; the connection is then in that transaction. The server runs a
        query's statements in order and stops at the first that fails, so nothing of
        ``then`` runs unless this transaction committed. A failure the markers do not
        name may have come before COMMIT or after it: the connection is rolled back and
        ``CompletionUncertain`` raised, for the caller to read whether the completion
        committed."""
        start = _next_begin(connection) if then is not None else None
        guarded = (
            f"WITH done AS ({sql} RETURNING 1) SELECT CASE "
            # Not constants (STABLE functions, an aggregate), so not evaluated at plan time.
            f"WHEN transaction_timestamp() <> %s THEN CAST('{_ENDED} ' || "
            "transaction_timestamp() AS integer) "
            f"WHEN count(*) = 0 THEN CAST('{_NOT_CURRENT} ' || count(*) AS integer) END "
            "FROM done"
        )
        with connection.cursor() as cursor:
            try:
                if then is None or start is None:
                    self.execute_completion(cursor, guarded, [*params, begun], then="COMMIT")
                else:
                    read = prepared.query(cursor, then.sql)
                    self.execute_completion(cursor, guarded, [*params, begun, *then.params],
                                            then=f"COMMIT; {start}; {read}")
                    for _ in range(3):  # COMMIT, BEGIN, then the read's rows
                        cursor.nextset()
                    then.rows = cursor.fetchall()
            except DataError as exc:
                if _NOT_CURRENT in str(exc):
                    return 0
                if _ENDED in str(exc):
                    raise TransactionEnded from None
                if start is None or not _uncertain(connection):
                    raise
                raise CompletionUncertain(exc) from exc
            except DatabaseError as exc:
                if start is None or not _uncertain(connection):
                    raise
                raise CompletionUncertain(exc) from exc
        return 1

    # ----- SQL fragments ----------------------------------------------------------------

    def claim(self, cursor: Any, claim: Claim) -> list[tuple[Any, ...]]:
        """One statement: the candidates' ids become one array, the UPDATE finds its rows
        by primary key in it and returns each row's position in it."""
        sql, params = self.claim_statement(claim)
        self.execute_status(cursor, sql, params)
        return [row[:-1] for row in sorted(cursor.fetchall(), key=lambda row: row[-1])]

    def claim_statement(self, claim: Claim) -> tuple[str, list[Any]]:
        # The candidates are picked once, into an array (an InitPlan in a materialized CTE),
        # then updated by primary key: ``id = ANY(...)`` through the primary key index, one
        # row's CTE on the outer side of the join whatever the statistics say. With
        # ``id IN (subquery)`` the planner may join instead: a sequential scan of the whole
        # table for a small one, and a join may run a LIMIT ... SKIP LOCKED subquery again.
        # RETURNING has no order: each row says its place in the array.
        table = claim.table
        sql = (f"WITH picked AS MATERIALIZED (SELECT ARRAY({claim.candidates}) AS ids) "
               f"UPDATE {table} SET {claim.sets} FROM picked "
               f"WHERE {table}.id = ANY(picked.ids) "
               f"RETURNING {claim.returning}, array_position(picked.ids, {table}.id)")
        return sql, [*claim.candidate_params, *claim.set_params]

    def probe_template(self) -> str | None:
        # A plain EXISTS becomes a semi-join; when the claim must look at every waiting unit
        # the planner may then hash the whole source table instead of probing it once per
        # unit. ``OFFSET 0`` is PostgreSQL's traditional optimisation fence.
        return "EXISTS(%(subquery)s OFFSET 0)"

    def json_append(self, column: str) -> str:
        return f"{column} || jsonb_build_array(%s::text)"

    def json_drop_last(self) -> str:
        return "(%(expressions)s - (-1))"

    def json_last(self, key: str) -> str:
        return f"((%(expressions)s) -> -1 ->> '{key}')"

    def seconds_between(self) -> tuple[str, bool]:
        return "EXTRACT(EPOCH FROM ({second} - {first}))", True

    def limit_statements(self, connection: BaseDatabaseWrapper,
                         seconds: float) -> Callable[[], None]:
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL statement_timeout = %s", [f"{int(seconds * 1000)}ms"])
        return lambda: None

    def stopped_by_limit(self, exc: BaseException) -> bool:
        return "statement timeout" in str(exc).lower()

    def prefer_index_scans(self, cursor: Any, prefer: bool = True,
                           ordered: bool = False) -> None:
        value = "off" if prefer else "on"
        if not ordered:
            cursor.execute(f"SET LOCAL enable_seqscan = {value}")
            return
        # Bitmap scans too where the index's order is the point: they lose it, so a
        # newest-first read with a LIMIT sorted every row of a partial index (500,000
        # finished tasks: 0.2 s) where an index scan reads the newest few thousand. (Not
        # for every read: an OR of two indexes is a BitmapOr, or else a sequential scan.)
        cursor.execute("SELECT set_config('enable_seqscan', %s, true), "
                       "set_config('enable_bitmapscan', %s, true)", [value, value])

    def values_source(self, connection: BaseDatabaseWrapper, columns: Sequence[Any],
                      rows: Sequence[Sequence[Any]]) -> tuple[tuple[str, list[Any]],
                                                                tuple[str, list[Any]]]:
        """One JSON parameter read by ``jsonb_to_recordset``, so the statement's text is
        the same for any number of rows (psycopg's client-side binding parses a statement
        with hundreds of placeholders anew every time: about a millisecond for 17 tasks).
        A JSON null is SQL NULL there, as ``JSONField`` stores None."""
        records = [{f.column: _jsonable(value) for f, value in zip(columns, row, strict=True)}
                   for row in rows]
        types = ", ".join(f"{f.column} {f.cast_db_type(connection)}" for f in columns)
        return ("", []), (f"jsonb_to_recordset(%s::jsonb) AS v ({types})",
                          [json.dumps(records, allow_nan=False)])

    def json_rows_insert(self, head: str, columns: Sequence[Any], per_row: dict[str, int],
                         connection: BaseDatabaseWrapper) -> str | None:
        """``INSERT ... SELECT ... FROM jsonb_array_elements(payload) e``: the per-row values
        travel as one JSON parameter (cheap to send); every value is typed, as the SELECT
        list gives the INSERT no column types to infer."""
        def value(f: Any) -> str:
            if f.name not in per_row:
                return f"%s::{f.db_type(connection)}"
            if isinstance(f, JSONField):
                return f"e->{per_row[f.name]}"
            return f"(e->>{per_row[f.name]})::{f.db_type(connection)}"

        select = ", ".join(value(f) for f in columns)
        return f"{head} SELECT {select} FROM jsonb_array_elements(%s::jsonb) e"

    # ----- wake-ups ---------------------------------------------------------------------

    def announcing(self, sql: str, params: list[Any], channel: str,
                   ) -> tuple[str, list[Any]]:
        """The statement in a WITH, and one ``pg_notify`` of what it returned beside it:
        still one statement and one round trip; no notification when it returned
        nothing; ``*`` for a payload too long to send."""
        from .notify import LONGEST_PAYLOAD

        ended = "dbworker_ended_id::text"
        wrapped = (
            f"WITH dbworker_ended AS ({sql} AS dbworker_ended_id) "
            "SELECT e.dbworker_ended_id FROM dbworker_ended AS e CROSS JOIN ("
            f"SELECT pg_notify(%s, CASE WHEN sum(length({ended}) + 1) <= {LONGEST_PAYLOAD} "
            f"THEN string_agg({ended}, ',') ELSE '*' END) FROM dbworker_ended "
            "HAVING count(*) > 0) AS n")
        return wrapped, [*params, channel]

    def listen(self, connection: BaseDatabaseWrapper, channel: str) -> Listening:
        raw = _connect_alone(connection)
        try:
            raw.execute(f"LISTEN {channel}")
        except BaseException:
            raw.close()
            raise
        return Listening(raw)

    # ----- space -----------------------------------------------------------------------

    def horizon(self, connection: BaseDatabaseWrapper,
                tables: Sequence[str]) -> dict[str, Any]:
        """The transaction of this database whose snapshot is the oldest (``backend_xmin``:
        VACUUM keeps every row version it might still see, in every table of the
        database), or an older prepared transaction; dead row versions from the statistics
        collector (kept whether or not autovacuum runs). Other roles' sessions show only
        to a role with ``pg_read_all_stats`` (``pg_monitor``)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid, coalesce(nullif(application_name, ''), usename::text, ''), "
                "coalesce(state, ''), EXTRACT(EPOCH FROM (now() - xact_start)) "
                "FROM pg_stat_activity WHERE datname = current_database() "
                "AND backend_xmin IS NOT NULL "
                "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
                "ORDER BY age(backend_xmin) DESC LIMIT 1")
            row = cursor.fetchone()
            oldest = None if row is None else {
                "seconds": round(float(row[3]), 3), "holder": row[1], "pid": row[0],
                "state": row[2]}
            cursor.execute(
                "SELECT gid, EXTRACT(EPOCH FROM (now() - prepared)) FROM pg_prepared_xacts "
                "WHERE database = current_database() ORDER BY prepared LIMIT 1")
            prepared = cursor.fetchone()
            if prepared is not None and (oldest is None
                                         or float(prepared[1]) > oldest["seconds"]):
                oldest = {"seconds": round(float(prepared[1]), 3),
                          "holder": f"prepared transaction {prepared[0]}", "pid": None,
                          "state": "prepared"}
            cursor.execute(
                "SELECT relname, n_dead_tup FROM pg_stat_user_tables "
                "WHERE relid = ANY(%s::regclass[]) ORDER BY relname", [list(tables)])
            dead = {name: int(n) for name, n in cursor.fetchall()}
        return {"oldest_transaction": oldest, "dead_rows": dead, "history_length": None}

    def space(self, connection: BaseDatabaseWrapper, tables: Sequence[str]) -> dict[str, Any]:
        """Our tables' size on disk (with indexes and TOAST) and their dead row versions,
        which only a VACUUM makes reusable (autovacuum, when it runs)."""
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0), "
                "coalesce(sum(s.n_dead_tup), 0), coalesce(sum(s.n_live_tup), 0) "
                "FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid "
                "WHERE c.oid = ANY(%s::regclass[])", [list(tables)])
            total, dead, live = cursor.fetchone()
            cursor.execute("SHOW autovacuum")
            autovacuum = cursor.fetchone()[0]
        return {"scope": "tables", "total_bytes": int(total), "free_bytes": None,
                "dead_rows": int(dead), "live_rows": int(live), "autovacuum": autovacuum}

    def vacuum_statements(self, connection: BaseDatabaseWrapper, tables: Sequence[str], *,
                          full: bool) -> list[str]:
        """VACUUM makes dead rows' space reusable (and gives trailing empty pages back);
        VACUUM FULL rewrites each table and gives all free space back, holding an
        ACCESS EXCLUSIVE lock on it meanwhile (no claim, no enqueue)."""
        q = connection.ops.quote_name
        options = "FULL, ANALYZE" if full else "ANALYZE"
        return [f"VACUUM ({options}) {', '.join(q(t) for t in tables)}"]

    def transaction_pooled(self, connection: BaseDatabaseWrapper) -> bool | None:
        """Two connections of their own, asked for their server backends (``db/pooler.py``
        says how and why): False when psycopg's key carries the backend's pid, True when
        backends are shared or change between transactions, else None."""
        first = _connect_alone(connection, probe=True)
        try:
            backend = _backend(first)
            if first.info.backend_pid == backend:
                return False
            second = _connect_alone(connection, probe=True)
            try:
                for _ in range(3):
                    if _backend(second) == backend or _backend(first) != backend:
                        return True
            finally:
                second.close()
        finally:
            first.close()
        return None

    def notify(self, connection: BaseDatabaseWrapper, channel: str, what: str) -> None:
        """Delivered when (and only if) the writer's transaction commits."""
        sql, params = self.notify_statement(channel, what)
        with connection.cursor() as cursor:
            cursor.execute(sql, params)

    def notify_statement(self, channel: str, what: str) -> tuple[str, list[Any]]:
        return "SELECT pg_notify(%s, %s)", [channel, what]

    def one_query(self, connection: BaseDatabaseWrapper,
                  statements: Sequence[tuple[str, Sequence[Any]]], *,
                  durable: bool = True) -> bool:
        """With client-side binding (Django's default) the statements go as one query of
        the simple protocol, which the server runs in one transaction: the caller's, or,
        in autocommit, an implicit one that commits with the query's end. An enqueue()
        or a save() outside a transaction then takes one round trip instead of four
        (BEGIN, the INSERT, the NOTIFY, COMMIT). Not durable and outside a transaction,
        with ``ASYNC_COMMIT``: ``SET LOCAL synchronous_commit = off`` first."""
        connection.ensure_connection()
        if not binds_on_client(connection):
            return False
        sql = [s for s, _ in statements]
        if not durable and conf.get().ASYNC_COMMIT and connection.get_autocommit():
            sql.insert(0, ASYNC_COMMIT)
        params = [p for _, statement_params in statements for p in statement_params]
        with connection.cursor() as cursor:
            cursor.execute("; ".join(sql), params)
        return True

    # ----- triggers (rows/triggers.py) ---------------------------------------------------

    def create_row_triggers(self, connection: BaseDatabaseWrapper,
                            triggers: RowTriggers) -> list[str]:
        """Statement-level triggers over transition tables: one INSERT (and one NOTIFY) per
        statement, however many rows it wrote (a ``bulk_create``, a ``COPY``)."""
        q = connection.ops.quote_name
        t = triggers
        key = f"n.{q(t.pk)}::text"
        values = ", ".join(v.format(key=key, now="now()",
                                    sort_key=f"n.{q(t.pk)}" if t.integer_pk else "NULL")
                           for v in t.values)
        announce = ""
        if t.notify is not None:
            channel, payload = t.notify
            announce = (f"\n  IF FOUND THEN PERFORM pg_notify('{channel}', '{payload}'); "
                        "END IF;")
        insert = (
            f"INSERT INTO {q(t.executions)} ({', '.join(q(c) for c in t.columns)})\n"
            f"  SELECT {values} FROM dbworker_new AS n\n  ON CONFLICT DO NOTHING;{announce}")
        doomed = (f"{q(t.key_column)} IN (SELECT o.{q(t.pk)}::text FROM dbworker_old AS o)\n"
                  f"    AND {t.mine} AND {t.deletable}")
        delete = "\n  ".join(
            [f"DELETE FROM {q(table)} WHERE {q(column)} IN "
             f"(SELECT id FROM {q(t.executions)} WHERE {doomed});"
             for table, column in t.dependents]
            + [f"DELETE FROM {q(t.executions)} WHERE {doomed};"])
        statements = []
        for name, mark, body, event, transition in (
                (t.insert_name, t.insert_mark, insert, "INSERT", "NEW TABLE AS dbworker_new"),
                (t.delete_name, t.delete_mark, delete, "DELETE", "OLD TABLE AS dbworker_old")):
            statements += [
                f"CREATE OR REPLACE FUNCTION {q(name)}() RETURNS trigger LANGUAGE plpgsql "
                f"AS $dbworker$\n-- {mark}\nBEGIN\n  {body}\n  RETURN NULL;\nEND\n$dbworker$",
                f"DROP TRIGGER IF EXISTS {q(name)} ON {q(t.table)}",
                f"CREATE TRIGGER {q(name)} AFTER {event} ON {q(t.table)} REFERENCING "
                f"{transition} FOR EACH STATEMENT EXECUTE FUNCTION {q(name)}()",
            ]
        return statements

    def drop_row_trigger(self, connection: BaseDatabaseWrapper, trigger: Trigger) -> list[str]:
        q = connection.ops.quote_name
        return [f"DROP TRIGGER IF EXISTS {q(trigger.name)} ON {q(trigger.table)}",
                f"DROP FUNCTION IF EXISTS {q(trigger.name)}()"]

    def row_triggers(self, connection: BaseDatabaseWrapper, prefix: str) -> list[Trigger]:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT t.tgname, c.relname, p.prosrc FROM pg_trigger t "
                "JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_proc p ON p.oid = t.tgfoid "
                "WHERE NOT t.tgisinternal AND starts_with(t.tgname, %s) "
                "AND pg_table_is_visible(c.oid) ORDER BY t.tgname", [prefix])
            return [Trigger(name, table, text) for name, table, text in cursor.fetchall()]


class Listening:
    """A psycopg connection of its own, in autocommit mode, LISTENing (``PostgreSQL.listen``)."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    @property
    def closed(self) -> bool:
        return bool(self.raw.closed)

    def fileno(self) -> int:
        return int(self.raw.fileno())

    def received(self) -> set[str]:
        return {n.payload for n in self.raw.notifies(timeout=0)}

    def close(self) -> None:
        self.raw.close()


#: Seconds the pooler probe waits for a connection (unless the database's OPTIONS set
#: ``connect_timeout``): a system check must not hang on an unreachable host.
PROBE_CONNECT_TIMEOUT = 5


#: SQLSTATEs beyond class 08 that end the session: admin shutdown, crash shutdown, cannot
#: connect now, idle-session timeout.
GONE_STATES = frozenset({"57P01", "57P02", "57P03", "57P05"})
#: SQLSTATEs of the server's state outside classes 53, 57 and 58: a read-only transaction
#: (a standby after a failover), a lock not available, an object in use.
TROUBLE_STATES = frozenset({"25006", "55P03", "55006"})


def _cause(exc: BaseException) -> BaseException | None:
    """psycopg's error behind Django's (or ``exc`` itself)."""
    return exc.__cause__ if isinstance(exc, DatabaseError) else exc


def protocol_confused(exc: BaseException) -> bool:
    """Whether psycopg could not make sense of the server's answer: an ``InternalError``
    it raised itself, without a SQLSTATE ("received 2 results from command 'COMMIT'", seen
    behind PgBouncer when the server connection was ended mid-transaction). Whether the
    transaction committed is unknown and the session's state with it: the unit goes back
    (fenced by its token: nothing changes if it did commit) and the process opens a new
    session, rather than record the unit FAILED for the connection's fault."""
    import psycopg

    cause = exc.__cause__ if isinstance(exc, DatabaseError) else exc
    return (isinstance(cause, psycopg.InternalError)
            and getattr(cause, "sqlstate", None) is None)


def _connect_alone(connection: BaseDatabaseWrapper, *, probe: bool = False) -> Any:
    """A psycopg connection of its own with ``connection``'s settings, in autocommit mode."""
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    if probe:
        params.setdefault("connect_timeout", PROBE_CONNECT_TIMEOUT)
    return psycopg.connect(**params, autocommit=True)


def _backend(raw: Any) -> int:
    """The process id of the server backend running this statement."""
    return int(raw.execute("SELECT pg_backend_pid()").fetchone()[0])


def _jsonable(value: Any) -> Any:
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value


@contextlib.contextmanager
def _first_statement(connection: BaseDatabaseWrapper, send: Any) -> Iterator[None]:
    """An ``execute_wrapper`` that lets ``send`` (an execute wrapper's signature) send the
    block's first single statement, then steps aside: the statements after it, and an
    ``executemany``, go as they are."""
    sent = False

    def first(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        nonlocal sent
        if sent or many:
            return execute(sql, params, many, context)
        sent = True
        return send(execute, sql, params, many, context)

    with connection.execute_wrapper(first):
        yield


def _pipelines(raw: Any) -> bool:
    """Whether ``raw`` is a psycopg 3 connection whose libpq has pipeline mode."""
    try:
        import psycopg
        from psycopg import Pipeline
    except ImportError:  # psycopg2
        return False
    return bool(Pipeline.is_supported()) and isinstance(raw, psycopg.Connection)


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
        run = prepared.query(cursor, sql) if prepare else sql
        with prepared.recovering(cursor.db):
            cursor.execute(run, params)
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


def _next_begin(connection: BaseDatabaseWrapper) -> str | None:
    """The BEGIN psycopg would send for the next transaction of ``connection`` (its
    isolation level and access mode), when it is in one now and in no pipeline; None
    where that cannot be told (psycopg's private ``_get_tx_start_command`` is looked for,
    not assumed)."""
    from psycopg.pq import TransactionStatus

    raw = connection.connection
    if (raw is None or raw.autocommit or getattr(raw, "_pipeline", None) is not None
            or raw.pgconn.transaction_status != TransactionStatus.INTRANS
            or not callable(getattr(raw, "_get_tx_start_command", None))):
        return None
    return str(raw._get_tx_start_command().decode())


def _uncertain(connection: BaseDatabaseWrapper) -> bool:
    """After a failed query that held a completion, COMMIT and the next transaction's
    first statement: roll back whatever transaction the connection is in; False where the
    connection is lost (its error goes as it is: the caller's outage path)."""
    raw = connection.connection
    if raw is None or raw.closed or getattr(raw, "broken", False):
        return False
    try:
        raw.rollback()
    except Exception:
        return False
    return True


def _client_side(cursor: Any) -> bool:
    """Whether Django's ``cursor`` wraps a psycopg client-side-binding cursor (not a named
    cursor of ``iterator()``, whose query psycopg wraps in DECLARE)."""
    import psycopg

    return isinstance(getattr(cursor, "cursor", None), psycopg.ClientCursor)


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
