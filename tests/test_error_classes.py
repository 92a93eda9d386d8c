"""What a database error says about the unit that met it (``db.errors``), on real errors of
each database: a session the server ended, a value it refused, its own trouble (a statement
past its time limit), a lock held past the busy timeout (docs/bad-input.md's table).

And the case a PostgreSQL restart showed (finished tasks recorded FAILED): every task of a
batch of completions gets the same error from one lost connection; the first one given
back reconnects, and each of the others must be given back too, never recorded FAILED as
a value the database refused."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.db import DatabaseError, connection, transaction

from django_dbworker.db import errors
from django_dbworker.db.connections import opened_at
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.supervisor import child, units
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks.completions import Completions, Kept
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def _raised(sql: str, params: tuple = ()) -> DatabaseError:
    """The error Django raises for ``sql`` on the default connection."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as exc:
        return exc
    raise AssertionError(f"{sql!r} raised nothing")


def _end_session() -> None:
    """End the default connection's session from another connection, as a restart, a
    failover or an administrator would; the default connection does not know yet."""
    connection.ensure_connection()
    params = connection.get_connection_params()
    if connection.vendor == "postgresql":
        import psycopg

        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            (pid,) = cursor.fetchone()
        with psycopg.connect(**{**params, "autocommit": True}) as other:
            other.execute("SELECT pg_terminate_backend(%s)", (pid,))
            while other.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s",
                                (pid,)).fetchone()[0]:
                time.sleep(0.01)  # until the backend is gone
    else:
        import MySQLdb

        with connection.cursor() as cursor:
            cursor.execute("SELECT CONNECTION_ID()")
            (thread,) = cursor.fetchone()
        other = MySQLdb.connect(**params)
        try:
            other.cursor().execute(f"KILL CONNECTION {int(thread)}")
        finally:
            other.close()


@contextlib.contextmanager
def _server_only() -> Iterator[None]:
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server session to lose")
    yield


def test_a_session_the_server_ended_is_gone(vendor):
    with _server_only():
        _end_session()
        exc = _raised("SELECT 1")
        assert errors.classify(exc) == errors.GONE, repr(exc.__cause__)
        # Also once the connection is open again: the error says it, not the connection.
        connection.close()
        connection.ensure_connection()
        assert errors.classify(exc, raw=None) == errors.GONE


def test_a_value_the_database_refuses_is_the_units(vendor):
    if vendor == "postgresql":
        exc = _raised("SELECT %s::text", ("a\x00b",))  # NUL in text: class 22
    elif vendor == "mysql":
        exc = _raised("SELECT CAST(%s AS UNSIGNED) + 18446744073709551615", ("1",))
    else:
        exc = _raised("SELECT json_extract('not json', '$')")
    assert errors.classify(exc, raw=None) == errors.VALUE, repr(exc)


def test_a_statement_past_its_time_limit_is_the_servers_trouble(vendor):
    with _server_only():
        if vendor == "postgresql":
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SET LOCAL statement_timeout = 50")
                try:
                    with transaction.atomic():
                        cursor.execute("SELECT pg_sleep(5)")
                except DatabaseError as caught:
                    exc = caught
        else:
            exc = _raised("SET STATEMENT max_statement_time=0.05 FOR "
                          "SELECT SLEEP(5) FROM (SELECT 1 UNION SELECT 2) AS t")
        assert errors.classify(exc, raw=None) == errors.SERVER, repr(exc.__cause__)


def test_sqlites_lock_past_its_busy_timeout_is_transient(vendor):
    if vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    from django.db import OperationalError

    path = connection.settings_dict["NAME"]
    holder, other = sqlite3.connect(path, timeout=0), sqlite3.connect(path, timeout=0.01)
    try:
        holder.execute("BEGIN IMMEDIATE")
        try:
            other.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as real:
            exc = OperationalError(*real.args)  # as Django raises it, from the driver's
            exc.__cause__ = real
        else:
            raise AssertionError("the write lock was not held")
    finally:
        holder.rollback()
        holder.close()
        other.close()
    assert "database is locked" in str(exc)
    assert errors.classify(exc) == errors.TRANSIENT


def test_a_batch_of_completions_lost_with_its_session_all_go_back_unfailed(vendor):
    """One lost connection under a batch of kept successes: each task gets the same error
    from the batch's record; the first one given back opens a new connection (the database
    answers), and the others must still be given back (this is how a restart recorded
    finished tasks FAILED), not recorded as values the database refused."""
    with _server_only():
        results = tasks.add.enqueue_many([((n, 1), {}) for n in range(5)])
        claims = taskplanner.claim(None, 5, Claimant(), 30)
        assert len(claims) == 5
        completions = Completions("default")
        report: list[tuple[Any, ...]] = []
        for seq, c in enumerate(claims):
            def add(kept: Kept, seq: int = seq) -> None:
                kept.tag = seq
                completions.add(kept)
            child.run_one(seq, c, "default", report, add)
        assert len(completions) == 5 and not report
        since = opened_at("default")  # when the session the records go through began
        _end_session()
        outcomes = completions.flush()
        assert [isinstance(outcome, Exception) for _, outcome in outcomes] == [True] * 5
        for kept, outcome in outcomes:  # as the child's ``deliver`` does
            child.contain(kept.tag, kept.claim, outcome, None, time.monotonic(), "default",
                          report, since)
        completions.close()

        assert [kind for _, kind, *_ in report] == ["session_ended"] * 5, report
        rows = TaskRecord.objects.filter(id__in=[r.id for r in results])
        assert {(row.status, len(row.errors)) for row in rows} == {(TaskStatus.RUNNING, 0)}
        # Given back as an outage (the supervisor's session ended too), each runs again.
        for c in claims:
            units.release(c, crashed=None, max_crashes=3)
        run_until_idle()
        assert sorted(row.return_value for row in rows.all()) == [1, 2, 3, 4, 5]
        assert {(row.status, row.crashes) for row in rows.all()} == {(TaskStatus.SUCCESSFUL, 0)}


def _deadlock(vendor: str) -> DatabaseError:
    """The error a deadlock raises on ``vendor``, as Django raises it from the driver's."""
    from django.db import OperationalError

    if vendor == "postgresql":
        import psycopg

        cause: Exception = psycopg.errors.DeadlockDetected("deadlock detected")
    elif vendor == "mysql":
        import MySQLdb

        cause = MySQLdb.OperationalError(1213, "Deadlock found when trying to get lock")
    else:
        cause = sqlite3.OperationalError("database is locked")
    exc = OperationalError(*cause.args)
    exc.__cause__ = cause
    return exc


def test_a_transactional_task_whose_record_deadlocks_goes_back_unfailed(vendor, monkeypatch):
    """MariaDB: a transactional task's SUCCESSFUL record deadlocked with its supervisor's
    lease renewal (the renewal locks the running index's entries, then rows; the record
    the row, then the entry), and the task was recorded FAILED with its writes rolled back.
    The deadlock rolled the whole transaction back: not the task's fault; it goes back, as
    a row unit's does, and runs again exactly once."""
    from tests.testapp.models import Effect

    result = tasks.effect_once.enqueue(7)
    (c,) = taskplanner.claim(None, 1, Claimant(), 30)
    real = taskstore.succeed

    def deadlocked(*args: Any, **kwargs: Any) -> int:
        raise _deadlock(vendor)

    monkeypatch.setattr(taskstore, "succeed", deadlocked)
    report: list[tuple[Any, ...]] = []
    child.run_one(0, c, "default", report)
    monkeypatch.setattr(taskstore, "succeed", real)

    assert [kind for _, kind, *_ in report] == ["db_error"], report
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.errors) == (TaskStatus.RUNNING, [])
    assert not Effect.objects.filter(item_id=7).exists()  # rolled back with it
    units.release(c, crashed=None, max_crashes=3)
    run_until_idle()
    row.refresh_from_db()
    assert (row.status, row.crashes) == (TaskStatus.SUCCESSFUL, 0)
    assert Effect.objects.filter(item_id=7).count() == 1
