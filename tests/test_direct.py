"""SQLite: a unit's BEGIN, source-row read and completion run on the driver's connection
(``direct.py``) where nothing could tell, and through Django's cursor where something
could: execute wrappers, logged queries, a transaction marked for rollback."""

from __future__ import annotations

import os

import pytest
from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.db.transaction import TransactionManagementError
from django.test.utils import CaptureQueriesContext

from django_dbworker.db import connections as db
from django_dbworker.db import direct, sources
from django_dbworker.models import Execution, State
from django_dbworker.rows import planner, runner, store
from django_dbworker.rows.registry import workers
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def sqlite_only(vendor: str) -> None:
    if vendor != "sqlite":
        pytest.skip("SQLite's statements only; PostgreSQL prepares them (test_prepared.py)")
    db.own_process(connection.alias)


def claimed() -> store.Claim:
    item = Item.objects.create()
    (c,) = planner.claim(workers["touch"], 1, Claimant(pid=os.getpid()), 60)
    assert c.source_key == str(item.pk)
    return c


def ours(sql: str) -> bool:
    """BEGIN, the read of the source row, the completion: what runs in the write lock."""
    return (sql.startswith("BEGIN") or sql.startswith('SELECT "testapp_item"')
            or sql.startswith('UPDATE "django_dbworker_execution" SET "state" = \'FINISHED\''))


def test_a_units_own_statements_skip_djangos_cursor(monkeypatch):
    c = claimed()
    seen: list[str] = []
    execute = CursorWrapper.execute

    def spy(self, sql, params=None):
        seen.append(sql)
        return execute(self, sql, params)

    monkeypatch.setattr(CursorWrapper, "execute", spy)
    result = runner.run(c)
    monkeypatch.undo()
    assert result.outcome == runner.FINISHED, result
    assert Execution.objects.get(pk=c.execution_id).state == State.FINISHED
    assert Effect.objects.filter(worker="touch").count() == 1, "the handler's own write"
    assert not [sql for sql in seen if ours(sql)], seen
    assert any(sql.startswith('INSERT INTO "testapp_effect"') for sql in seen), seen


def test_execute_wrappers_and_logged_queries_still_see_every_statement():
    c = claimed()
    wrapped: list[str] = []

    def record(execute, sql, params, many, context):
        wrapped.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert runner.run(c).outcome == runner.FINISHED
    seen = [sql.split()[0] for sql in wrapped if ours(sql)]
    assert seen == ["BEGIN", "SELECT", "UPDATE"], wrapped

    second = claimed()
    with CaptureQueriesContext(connection) as queries:
        assert runner.run(second).outcome == runner.FINISHED
    logged = [q["sql"] for q in queries.captured_queries]
    assert [sql.split()[0] for sql in logged if ours(sql)] == ["BEGIN", "SELECT", "UPDATE"]


def test_placeholders_are_converted_as_djangos_cursor_does():
    connection.ensure_connection()
    raw = direct.connection_for(connection)
    sql = "SELECT '%%s', %s, '100%%'"
    assert direct.execute(connection, raw, sql, [7]).fetchall() == [("%s", 7, "100%")]
    with connection.cursor() as cursor:
        cursor.execute(sql, [7])
        assert cursor.fetchall() == [("%s", 7, "100%")]


def test_errors_are_djangos_own():
    connection.ensure_connection()
    raw = direct.connection_for(connection)
    with pytest.raises(OperationalError, match="no such table: nowhere"):
        direct.execute(connection, raw, "SELECT * FROM nowhere WHERE id = %s", [1])


def test_a_transaction_marked_for_rollback_refuses_as_django_does():
    item = Item.objects.create()
    with transaction.atomic():
        transaction.set_rollback(True)
        assert direct.connection_for(connection) is None
        with pytest.raises(TransactionManagementError):
            sources.get(Item, item.pk, connection.alias)
