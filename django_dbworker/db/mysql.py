"""MariaDB (>= 10.6) and MySQL (>= 8.0): Django's ``mysql`` backend, ``mysqlclient``.

Neither has partial indexes nor ``UPDATE ... RETURNING``: the claim indexes lead with a
generated column that says whether the row is in the index's state set
(``partial.PartialIndex``), the queries name that column, and a claim is three short
statements in one transaction (the candidates' ids ``FOR UPDATE SKIP LOCKED``, an UPDATE of
those ids, a SELECT of what the claim returns). There is no LISTEN/NOTIFY: an idle
supervisor runs a cheap indexed probe every 50 ms (``commit_counter``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from django.core.checks import CheckMessage, Error, Warning
from django.db import DatabaseError, InterfaceError, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from .engine import Claim, Engine, RowTriggers, Trigger, row_trigger_statements

#: Error codes that mean the connection or the server went away: can't connect (2002,
#: 2003), server gone away (2006), lost connection (2013, 2055), connection killed (1927),
#: disconnected for inactivity (4031), server shutdown in progress (1053).
GONE = frozenset({2002, 2003, 2006, 2013, 2055, 1927, 4031, 1053})
#: Error codes of the server's state, not of a value: too many connections (1040, 1203),
#: disk or table full (1021, 1114), out of memory (1037, 1041), read-only (1290, 1792,
#: 1836), a statement interrupted or past its time limit (1317, 1969, 3024).
TROUBLE = frozenset({1040, 1203, 1021, 1114, 1037, 1041, 1290, 1792, 1836, 1317, 1969, 3024})
#: Error codes that mean the session is gone (``session_lost``): as ``GONE``.
LOST_SESSION = GONE
#: Error codes a transaction may be retried after (deadlock, lock wait timeout).
RETRYABLE = {1213, 1205}

#: ``v.<column>`` in ``update_from_values``' SQL.
_V_COLUMN = re.compile(r"\bv\.(\w+)")

#: The savepoint that marks a transactional handler's transaction.
_MARK = "dbworker_transaction_mark"

#: Oldest servers we run on: both have ``FOR UPDATE SKIP LOCKED``.
MIN_MARIADB = (10, 6)
MIN_MYSQL = (8, 0)


class MySQL(Engine):
    vendor = "mysql"
    watches_commits: ClassVar[bool] = True
    writes_wait_for_uncommitted_rows: ClassVar[bool] = True
    locks_rows_it_filters: ClassVar[bool] = True

    # ----- connections ------------------------------------------------------------------

    def on_connection_created(self, connection: BaseDatabaseWrapper) -> None:
        """``innodb_lock_wait_timeout`` where ``bound_lock_waits`` asked for one."""
        seconds = getattr(connection, "_dbworker_lock_wait", None)
        if seconds is not None:
            with connection.cursor() as cursor:
                cursor.execute(f"SET SESSION innodb_lock_wait_timeout = {max(1, round(seconds))}")

    def problem(self, connection: BaseDatabaseWrapper) -> str | None:
        """A server too old for ``SKIP LOCKED`` (check E013)."""
        found = version_problem(connection.mysql_is_mariadb,  # type: ignore[attr-defined]
                                connection.mysql_version)  # type: ignore[attr-defined]
        return None if found is None else f"The database is {found} (check E013)"

    def connection_gone(self, exc: BaseException) -> bool:
        """``GONE``, or mysqlclient's ``InterfaceError`` of a closed connection (code 0)."""
        code = _code(exc)
        return code in GONE or (isinstance(exc, InterfaceError) and code in (0, None))

    def session_lost(self, exc: BaseException) -> bool:
        return _code(exc) in LOST_SESSION

    def server_trouble(self, exc: BaseException) -> bool:
        return _code(exc) in TROUBLE

    def transient(self, exc: BaseException) -> bool:
        """A deadlock (the server rolled the transaction back) or a lock wait timeout (the
        statement): nothing the unit's values cause; the transaction may run again
        (``supervisor.units.transient``)."""
        return _code(exc) in RETRYABLE

    def setting_checks(self, alias: str, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
        return server_checks(alias, connection)

    # ----- the transaction of a transactional handler ----------------------------------

    def mark_transaction(self, connection: BaseDatabaseWrapper) -> Any:
        """A savepoint of our own: a COMMIT or ROLLBACK the handler sends through a cursor
        ends the transaction, and its savepoints with it. One statement."""
        with connection.cursor() as cursor:
            cursor.execute(f"SAVEPOINT {_MARK}")
        mark = object()
        connection._dbworker_mark = mark  # type: ignore[attr-defined]
        return mark

    def transaction_marker(self, connection: BaseDatabaseWrapper) -> Any:
        """The mark ``mark_transaction`` returned while its savepoint lives (released here:
        one statement), else a new value."""
        try:
            with connection.cursor() as cursor:
                cursor.execute(f"RELEASE SAVEPOINT {_MARK}")
        except DatabaseError as exc:
            if _code(exc) != 1305:  # "SAVEPOINT ... does not exist"
                raise
            return object()
        return getattr(connection, "_dbworker_mark", None)

    # ----- claims -----------------------------------------------------------------------

    def claim(self, cursor: Any, claim: Claim) -> list[tuple[Any, ...]]:
        """The candidates' ids (``FOR UPDATE SKIP LOCKED``: ours until the commit), one
        UPDATE of those ids, then what the claim returns of them, in the candidates' order;
        no SELECT when the caller holds the candidates already (``claim.ids``)."""
        ids = self.candidate_ids(cursor, claim)
        if not ids:
            return []
        marks = ", ".join(["%s"] * len(ids))
        cursor.execute(f"UPDATE {claim.table} SET {claim.sets} WHERE id IN ({marks})",
                       [*claim.set_params, *ids])
        cursor.execute(f"SELECT {claim.returning} FROM {claim.table} WHERE id IN ({marks})",
                       ids)
        rows = cursor.fetchall()
        if claim.ids is not None:
            # In no particular order (the caller has its own); a native UUID column gives
            # its values back in another form than the caller's.
            return list(rows)
        position = {value: i for i, value in enumerate(ids)}
        return sorted(rows, key=lambda row: position[row[0]])

    # ----- SQL fragments ----------------------------------------------------------------

    def json_append(self, column: str) -> str:
        return f"JSON_ARRAY_APPEND(COALESCE({column}, '[]'), '$', %s)"

    def json_drop_last(self) -> str:
        return ("JSON_REMOVE(%(expressions)s, "
                "CONCAT('$[', JSON_LENGTH(%(expressions)s) - 1, ']'))")

    def seconds_between(self) -> tuple[str, bool]:
        return "(TIMESTAMPDIFF(MICROSECOND, {first}, {second}) / 1000000.0)", False

    def limit_statements(self, connection: BaseDatabaseWrapper,
                         seconds: float) -> Callable[[], None]:
        # A session setting (MariaDB: seconds; MySQL: milliseconds), put back after.
        mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
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

    def stopped_by_limit(self, exc: BaseException) -> bool:
        text = str(exc).lower()
        return "max_statement_time" in text or "query execution was" in text

    def json_last(self, key: str) -> str:
        return ("JSON_UNQUOTE(JSON_EXTRACT(%(expressions)s, "
                f"CONCAT('$[', JSON_LENGTH(%(expressions)s) - 1, '].{key}')))")

    def update_from_values(self, cursor: Any, table: str, sets: str, set_params: Sequence[Any],
                           columns: Sequence[Any], rows: Sequence[Sequence[Any]], where: str,
                           where_params: Sequence[Any], *, returning: str,
                           announce: str | None = None) -> list[tuple[Any, ...]]:
        """No ``RETURNING`` on an UPDATE (nor NOTIFY: ``announce`` is not used): in one
        transaction, what ``where`` selects of the rows is read ``FOR UPDATE`` (returned),
        then updated through a join with the same rows. ``v`` is a derived table of
        ``SELECT ... UNION ALL`` rows whose columns are prefixed (``v.x`` is ``v.v_x``), so
        an unqualified SET target is never ambiguous."""
        connection = cursor.db
        values, params = _derived(connection, columns, rows)
        sets, where = (_V_COLUMN.sub(r"v.v_\1", text) for text in (sets, where))
        with transaction.atomic(using=connection.alias):
            cursor.execute(f"SELECT {returning} FROM {table} JOIN {values} ON {where} "
                           "FOR UPDATE", [*params, *where_params])
            found = cursor.fetchall()
            if found:
                cursor.execute(f"UPDATE {table} JOIN {values} ON {where} SET {sets}",
                               [*params, *where_params, *set_params])
        return list(found)

    def insert_select_ignoring(self, head: str, select: str) -> str:
        """``INSERT IGNORE``: its row count is the rows inserted (``ON DUPLICATE KEY
        UPDATE`` counts a skipped row as one found). It would also turn a value too long
        into a warning: ours are keys no longer than ``source_id`` (E006) and constants."""
        return head.replace("INSERT INTO", "INSERT IGNORE INTO", 1) + f" {select}"

    def key_text(self, sql: str) -> str:
        return f"CAST({sql} AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin"

    # ----- wake-ups ---------------------------------------------------------------------

    # ----- space -----------------------------------------------------------------------

    def horizon(self, connection: BaseDatabaseWrapper,
                tables: Sequence[str]) -> dict[str, Any]:
        """InnoDB's oldest open transaction of another connection (``INNODB_TRX``: its
        read view keeps purge from removing older row versions) and the history list
        length, the row versions waiting for purge. Both need the PROCESS privilege;
        without it they are None. The server refreshes what ``INNODB_TRX`` shows only when
        it was not read in the last 100 ms: read more often, it keeps its last picture."""
        oldest, history = None, None
        with connection.cursor() as cursor:
            try:
                cursor.execute(
                    "SELECT t.trx_mysql_thread_id, "
                    "coalesce(concat(p.USER, '@', p.HOST), ''), "
                    "coalesce(p.COMMAND, t.trx_state), "
                    "TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) / 1000000.0 "
                    "FROM information_schema.INNODB_TRX t "
                    "LEFT JOIN information_schema.PROCESSLIST p "
                    "ON p.ID = t.trx_mysql_thread_id "
                    "WHERE t.trx_mysql_thread_id <> CONNECTION_ID() "
                    "ORDER BY t.trx_started LIMIT 1")
                row = cursor.fetchone()
                if row is not None:
                    oldest = {"seconds": round(float(row[3]), 3),
                              "holder": f"{row[1]} (connection {row[0]})".strip(),
                              "pid": int(row[0]), "state": str(row[2]).lower()}
                cursor.execute("SELECT `COUNT` FROM information_schema.INNODB_METRICS "
                               "WHERE NAME = 'trx_rseg_history_len'")
                found = cursor.fetchone()
                history = None if found is None else int(found[0])
            except DatabaseError as exc:
                if not _denied(exc):
                    raise
        return {"oldest_transaction": oldest, "dead_rows": None, "history_length": history}

    def space(self, connection: BaseDatabaseWrapper, tables: Sequence[str]) -> dict[str, Any]:
        """Our tables' size and their free space as InnoDB reports it (estimates kept by
        the server; ``ANALYZE TABLE`` refreshes them). InnoDB's purge makes deleted rows'
        space reusable by itself; only a rebuild gives it back to the file system."""
        with connection.cursor() as cursor:
            marks = ", ".join(["%s"] * len(tables))
            cursor.execute(
                "SELECT coalesce(sum(data_length + index_length), 0), "
                "coalesce(sum(data_free), 0) FROM information_schema.TABLES "
                f"WHERE table_schema = DATABASE() AND table_name IN ({marks})", list(tables))
            total, free = cursor.fetchone()
        return {"scope": "tables", "total_bytes": int(total), "free_bytes": int(free),
                "dead_rows": None}

    def vacuum_statements(self, connection: BaseDatabaseWrapper, tables: Sequence[str], *,
                          full: bool) -> list[str]:
        """``ANALYZE TABLE`` (fresh statistics); with ``full``, ``OPTIMIZE TABLE``: InnoDB
        rebuilds each table (online: reads and writes go on, briefly locked at the start
        and end) and gives its free space back where each table has its own file."""
        q = connection.ops.quote_name
        names = ", ".join(q(t) for t in tables)
        return [f"OPTIMIZE TABLE {names}" if full else f"ANALYZE TABLE {names}"]

    def commit_counter(self, connection: BaseDatabaseWrapper) -> int | None:
        """No LISTEN/NOTIFY here: a probe of what a claim would find new, through indexes
        only (the executions' primary key, the claim indexes' flags): the newest
        execution, and how many units and tasks wait (up to ``PROBE_CAP`` each). An
        enqueue, a new or released unit, or a retry changes it; renewals, heartbeats and
        other supervisors' empty claims do not, so idle supervisors do not wake each
        other. Twenty times a second: on the driver's connection directly (Django's cursor
        wrapper would cost more than the probe), its SQL built once."""
        connection.ensure_connection()
        sql = getattr(connection, "_dbworker_probe", None)
        if sql is None:
            sql = connection._dbworker_probe = _probe_sql(connection)  # type: ignore[attr-defined]
        cursor = connection.connection.cursor()
        try:
            cursor.execute(sql)
            row = cursor.fetchone()
        finally:
            cursor.close()
        return hash(tuple(row)) if row else None

    # ----- triggers (rows/triggers.py) ---------------------------------------------------

    def create_row_triggers(self, connection: BaseDatabaseWrapper,
                            triggers: RowTriggers) -> list[str]:
        return _row_trigger_sql(connection, triggers)

    def drop_row_trigger(self, connection: BaseDatabaseWrapper, trigger: Trigger) -> list[str]:
        return [f"DROP TRIGGER IF EXISTS {connection.ops.quote_name(trigger.name)}"]

    def row_triggers(self, connection: BaseDatabaseWrapper, prefix: str) -> list[Trigger]:
        return _row_triggers_found(connection, prefix)


#: Waiting units and tasks the wake-up probe counts at most (each: an index range).
PROBE_CAP = 1000


def _probe_sql(connection: BaseDatabaseWrapper) -> str:
    from ..models import Execution, TaskRecord

    q = connection.ops.quote_name
    executions, tasks = q(Execution._meta.db_table), q(TaskRecord._meta.db_table)
    flag = q("dbworker_claimable")
    return (f"SELECT (SELECT MAX(id) FROM {executions}), "
            f"(SELECT COUNT(*) FROM (SELECT 1 FROM {executions} WHERE {flag} = 1 "
            f"LIMIT {PROBE_CAP}) AS e), "
            f"(SELECT COUNT(*) FROM (SELECT 1 FROM {tasks} WHERE {flag} = 1 "
            f"LIMIT {PROBE_CAP}) AS t)")


def _derived(connection: BaseDatabaseWrapper, columns: Sequence[Any],
             rows: Sequence[Sequence[Any]]) -> tuple[str, list[Any]]:
    """``(SELECT %s AS a, %s AS b UNION ALL SELECT %s, %s ...) AS v`` and its parameters."""
    params: list[Any] = []
    selects = []
    for i, row in enumerate(rows):
        params += [f.get_db_prep_save(value, connection)
                   for f, value in zip(columns, row, strict=True)]
        if i == 0:
            selects.append("SELECT " + ", ".join(f"%s AS v_{f.column}" for f in columns))
        else:
            selects.append("SELECT " + ", ".join(["%s"] * len(columns)))
    return f"({' UNION ALL '.join(selects)}) AS v", params


def _code(exc: BaseException) -> int | None:
    """The MySQL error code of ``exc`` (or of the driver error it wraps)."""
    for error in (exc, exc.__cause__):
        args = getattr(error, "args", ())
        if args and isinstance(args[0], int):
            return args[0]
    return None


def server_checks(alias: str, connection: BaseDatabaseWrapper) -> list[CheckMessage]:
    """The server's version and the session's isolation level (E013, E014, W004)."""
    errors: list[CheckMessage] = []
    try:
        connection.ensure_connection()
        mariadb = connection.mysql_is_mariadb  # type: ignore[attr-defined]
        version = connection.mysql_version  # type: ignore[attr-defined]
    except Exception:  # the database is down: other checks and commands will say so
        return []
    problem = version_problem(mariadb, version)
    if problem is not None:
        errors.append(Error(
            f"DATABASES[{alias!r}] is {problem}", hint="Upgrade the server.",
            id="django_dbworker.E013"))
    level = isolation_level(connection)
    if level in ("READ-UNCOMMITTED", "SERIALIZABLE"):
        errors.append(Error(
            f"DATABASES[{alias!r}] runs its transactions at {level}: claims and fenced "
            "completions need READ COMMITTED (Django's default on MySQL and MariaDB).",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['isolation_level'] = 'read committed'.",
            id="django_dbworker.E014",
        ))
    elif level == "REPEATABLE-READ":
        errors.append(Warning(
            f"DATABASES[{alias!r}] runs its transactions at REPEATABLE READ: claims take "
            "gap locks there, so enqueues and claims wait for each other and deadlock more "
            "often (retried, but slower); django-dbworker is tested at READ COMMITTED.",
            hint=f"Set DATABASES[{alias!r}]['OPTIONS']['isolation_level'] = 'read committed'.",
            id="django_dbworker.W004",
        ))
    return errors


def version_problem(mariadb: bool, version: Sequence[int]) -> str | None:
    """What is wrong with a server of ``version`` (None: nothing)."""
    oldest = MIN_MARIADB if mariadb else MIN_MYSQL
    name = "MariaDB" if mariadb else "MySQL"
    if tuple(version[:2]) >= oldest:
        return None
    return (f"{name} {'.'.join(map(str, version))}; django-dbworker needs {name} "
            f"{'.'.join(map(str, oldest))} or later (FOR UPDATE SKIP LOCKED).")


def isolation_level(connection: BaseDatabaseWrapper) -> str | None:
    """The session's transaction isolation level, e.g. ``READ-COMMITTED``."""
    variable = ("@@SESSION.tx_isolation" if connection.mysql_is_mariadb  # type: ignore[attr-defined]
                and connection.mysql_version < (11, 1) else "@@SESSION.transaction_isolation")  # type: ignore[attr-defined]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {variable}")
        row = cursor.fetchone()
    return str(row[0]).upper() if row else None


# ----- triggers ---------------------------------------------------------------------------
#
# Row triggers (MySQL has no others): one INSERT IGNORE per new row, one pair of DELETEs per
# deleted row. No NOTIFY here (``RowTriggers.notify`` is ignored): idle supervisors see the
# new units through the wake-up probe (``commit_counter``). The mark is a comment in the
# body, which both servers keep: ``information_schema.TRIGGERS.ACTION_STATEMENT`` gives the
# body back as it was sent (checked on MariaDB 10.11). ``CREATE TRIGGER`` and ``DROP
# TRIGGER`` commit the transaction they run in (``features.can_rollback_ddl`` is False):
# ``rows/triggers.py`` runs them outside one.


def _row_trigger_sql(connection: BaseDatabaseWrapper, triggers: RowTriggers) -> list[str]:
    """``DROP TRIGGER IF EXISTS`` and ``CREATE TRIGGER ... FOR EACH ROW BEGIN ... END`` for
    each event (a cursor sends a compound body as one statement: no DELIMITER).

    The insert is ``INSERT IGNORE``: a row that has its execution already (``post_save``
    adds one after the trigger, the sweep may race it) is skipped, never an error in the
    writer's statement; the firing statement's own IGNORE or REPLACE does not reach it.
    Keys are cast as ``Engine.key_text`` casts them; timestamps as Django writes them here
    (``DATETIME(6)``, UTC with ``USE_TZ``; the session's time without)."""
    q = connection.ops.quote_name
    t = triggers
    engine_key = MySQL().key_text
    new_key, old_key = engine_key(f"NEW.{q(t.pk)}"), engine_key(f"OLD.{q(t.pk)}")
    now = "NOW(6)" if t.local_time else "UTC_TIMESTAMP(6)"
    values = ", ".join(v.format(key=new_key, now=now,
                                sort_key=f"NEW.{q(t.pk)}" if t.integer_pk else "NULL")
                       for v in t.values)
    ex = q(t.executions)
    insert = (f"INSERT IGNORE INTO {ex} ({', '.join(q(c) for c in t.columns)})\n"
              f"  VALUES ({values});")
    doomed = f"{q(t.key_column)} = {old_key} AND {t.mine} AND {t.deletable}"
    # The dependents first: InnoDB checks their foreign key at once, not at commit. Joined
    # with the doomed executions as a derived table, not ``IN (SELECT ...)``: a one-table
    # DELETE gets no semi-join (MariaDB < 11.1), so the subquery would run for every row of
    # the dependent table, a scan of its whole history per deleted source row.
    delete = "\n  ".join(
        [f"DELETE d FROM {q(table)} AS d JOIN (SELECT id FROM {ex} WHERE {doomed}) AS e "
         f"ON d.{q(column)} = e.id;" for table, column in t.dependents]
        + [f"DELETE FROM {ex} WHERE {doomed};"])
    return row_trigger_statements(q, t, insert, delete)


def _row_triggers_found(connection: BaseDatabaseWrapper, prefix: str) -> list[Trigger]:
    """Our triggers in the connection's database (schema), from ``information_schema``."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT TRIGGER_NAME, EVENT_OBJECT_TABLE, ACTION_STATEMENT "
            "FROM information_schema.TRIGGERS WHERE TRIGGER_SCHEMA = DATABASE() "
            "AND LEFT(TRIGGER_NAME, %s) = %s ORDER BY TRIGGER_NAME", [len(prefix), prefix])
        return [Trigger(str(name), str(table), str(text))
                for name, table, text in cursor.fetchall()]


def _denied(exc: BaseException) -> bool:
    """A missing privilege (1227: PROCESS needed; 1142/1143: no access to the view)."""
    code = exc.args[0] if exc.args else None
    return code in (1142, 1143, 1227)
