"""The statements of a row unit, prepared once per connection on PostgreSQL (``prepared``):
what is sent once they are, how they come to be (a PREPARE only outside a transaction), the
setting that turns them off, and a session that loses them or whose table changes under
them: the unit still runs once, and nothing is half written."""

from __future__ import annotations

import logging
import re

import pytest
from django.db import DatabaseError, connection

from django_dbworker import ExecutionStatus, workers
from django_dbworker.db import prepared
from django_dbworker.models import Execution, State
from django_dbworker.rows import planner, store
from django_dbworker.rows.runner import run
from django_dbworker.units.claimant import Claimant
from tests.conftest import queries_sent
from tests.testapp.models import Effect, Solo

pytestmark = pytest.mark.django_db(transaction=True)

EXECUTE = re.compile(r"EXECUTE dbworker_[0-9a-f]{24}\b")


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    connection.close()  # a new session: nothing prepared yet
    prepared.activate()  # as a runworkers child does
    yield
    prepared._active = prepared._off = False  # a test may have turned preparing off
    connection.close()


def _unit(action="ok"):
    row = Solo.objects.create(action=action)
    (c,) = [c for c in planner.claim(workers["solo"], 10, Claimant(), 30)
            if c.source_key == str(row.pk)]
    return row, c


def _run_traced(c, tmp_path):
    """Run ``c``; its result and the text of each Query message sent meanwhile."""
    return queries_sent(lambda: run(c), tmp_path)


def _finished(row):
    return workers["solo"].state(row.pk)["execution_status"] == ExecutionStatus.FINISHED


def _server_statements():
    with connection.cursor() as cursor:
        cursor.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'dbworker_%%'")
        return {name for (name,) in cursor.fetchall()}


def test_once_prepared_a_unit_sends_executes_in_its_three_queries(postgres, tmp_path):
    run(_unit()[1])  # prepares the read
    run(_unit()[1])  # prepares the completion before its BEGIN
    row, c = _unit()
    result, sent = _run_traced(c, tmp_path)
    assert result.outcome == "finished", result
    assert len(sent) == 3, sent  # the read, the handler's INSERT, the completion
    assert re.fullmatch(rf"BEGIN; {EXECUTE.pattern}\(\d+\)", sent[0]), sent[0]
    assert sent[1].startswith('INSERT INTO "testapp_effect"'), sent[1]
    assert re.fullmatch(rf"{EXECUTE.pattern}\(.+\); COMMIT", sent[2]), sent[2]
    assert _finished(row) and Effect.objects.filter(item_id=row.pk).count() == 1
    statements = prepared.prepared(connection)
    assert any("testapp_solo" in sql for sql in statements), statements
    assert any('UPDATE "django_dbworker_execution"' in sql for sql in statements)
    assert {EXECUTE.match(q)[0].split()[1] for q in statements.values()} \
        == _server_statements()


def test_a_prepare_never_runs_inside_a_transaction(postgres, tmp_path):
    """The first unit on a connection prepares its read before BEGIN and runs its
    completion unprepared; the next prepares the completion before its own BEGIN."""
    first, c1 = _unit()
    second, c2 = _unit()
    _, sent = _run_traced(c1, tmp_path)
    assert sent[0].startswith("PREPARE dbworker_") and "testapp_solo" in sent[0], sent
    assert re.match(rf"BEGIN; {EXECUTE.pattern}", sent[1]), sent
    assert "WITH done AS (UPDATE" in sent[-1] and sent[-1].endswith("; COMMIT"), sent
    assert len(sent) == 4 and not any(q.startswith("PREPARE") for q in sent[1:]), sent
    _, sent = _run_traced(c2, tmp_path)
    assert [q.split()[0] for q in sent] == ["PREPARE", "BEGIN;", "INSERT", "EXECUTE"], sent
    assert "WITH done AS (UPDATE" in sent[0] and "set_config" in sent[0], sent
    assert _finished(first) and _finished(second)


def test_only_runworkers_children_prepare(vendor, tmp_path):
    """Elsewhere (a web process, whose connection may last one request; a test's
    ``run_until_idle``) the same reads and completions run unprepared."""
    if vendor != "postgresql":
        pytest.skip("prepared statements are PostgreSQL's")
    row, c = _unit()
    result, sent = _run_traced(c, tmp_path)
    assert result.outcome == "finished" and _finished(row)
    assert not any("PREPARE" in q or "EXECUTE" in q for q in sent), sent
    assert not prepared.prepared(connection)


def test_placeholders_become_numbered_parameters():
    assert prepared._numbered("SELECT %s, '100%%' WHERE a = %s") == (
        "SELECT $1, '100%' WHERE a = $2", 2)
    assert prepared._numbered("SELECT 1") == ("SELECT 1", 0)


def test_the_setting_off_prepares_nothing(postgres, settings, tmp_path):
    settings.DBWORKER = {**settings.DBWORKER, "PREPARED_STATEMENTS": False}
    run(_unit()[1])
    row, c = _unit()
    result, sent = _run_traced(c, tmp_path)
    assert result.outcome == "finished" and _finished(row)
    assert sent[0].startswith("BEGIN; SELECT "), sent
    assert not any("PREPARE" in q or "EXECUTE" in q for q in sent), sent
    assert not _server_statements() and not prepared.prepared(connection)


def test_a_session_that_lost_its_statements_reads_again_and_prepares_no_more(
        postgres, tmp_path, caplog):
    run(_unit()[1])
    run(_unit()[1])  # both statements prepared
    with connection.cursor() as cursor:
        cursor.execute("DEALLOCATE ALL")  # as a pooler's other server connection would be
    row, c = _unit()
    with caplog.at_level(logging.WARNING, logger="django_dbworker"):
        result, sent = _run_traced(c, tmp_path)
    assert result.outcome == "finished", result
    assert re.match(rf"BEGIN; {EXECUTE.pattern}", sent[0]), sent
    assert sent[1] == "ROLLBACK" and sent[2].startswith("BEGIN; SELECT "), sent
    assert "PREPARED_STATEMENTS" in caplog.text and "is gone" in caplog.text
    assert _finished(row) and Effect.objects.filter(item_id=row.pk).count() == 1
    _, sent = _run_traced(_unit()[1], tmp_path)  # and from now on, unprepared
    assert sent[0].startswith("BEGIN; SELECT ") and "EXECUTE" not in sent[-1], sent


def test_a_statement_lost_in_the_handlers_transaction_rolls_it_back(postgres):
    """The completion cannot run: nothing of the attempt is kept, the unit is still the
    caller's to give back (runworkers: ``child_database_error``, then released)."""
    run(_unit()[1])
    run(_unit()[1])
    row, c = _unit("deallocate_first")
    with pytest.raises(DatabaseError, match="dbworker_"):
        run(c)
    assert prepared.lost(DatabaseError()) is False
    assert not Effect.objects.filter(item_id=row.pk).exists()
    unit = Execution.objects.get(worker="solo", source_id=str(row.pk))
    assert unit.state == State.WORKING and unit.token == c.token
    assert store.release(c, crashed=None, max_crashes=3) == 1
    other = Solo.objects.create()
    claims = planner.claim(workers["solo"], 10, Claimant(), 30)
    assert {x.source_key for x in claims} == {str(row.pk), str(other.pk)}
    assert [run(x).outcome for x in claims] == ["finished", "finished"]
    assert _finished(row) and _finished(other) and not prepared.prepared(connection)
    assert Effect.objects.filter(item_id=row.pk).count() == 1


def test_runworkers_gives_a_unit_whose_statement_was_lost_back_and_runs_it_once(
        postgres, runworkers):
    rows = [Solo.objects.create() for _ in range(5)]
    lost = Solo.objects.create(action="deallocate_first")
    rows += [Solo.objects.create() for _ in range(5)]
    rw = runworkers("--worker", "solo", "--concurrency", "1", "--burst")
    assert rw.wait(60) == 0, rw.output()
    assert "child_database_error" in rw.output() and "PREPARED_STATEMENTS" in rw.output()
    assert all(_finished(r) for r in [*rows, lost])
    unit = Execution.objects.get(worker="solo", source_id=str(lost.pk))
    assert (unit.attempts, unit.crashes) == (2, 0)
    assert Effect.objects.filter(item_id=lost.pk).count() == 1  # the first was rolled back
    assert all(Effect.objects.filter(item_id=r.pk).count() == 1 for r in rows)


def test_a_column_type_changed_under_a_statement_has_it_prepared_again(postgres, tmp_path):
    run(_unit()[1])
    run(_unit()[1])
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE testapp_solo ALTER COLUMN action TYPE varchar(101)")
    try:
        row, c = _unit()
        result, sent = _run_traced(c, tmp_path)
        assert result.outcome == "finished" and _finished(row), result
        assert sent[1] == "ROLLBACK" and sent[2].startswith("BEGIN; SELECT "), sent
        row, c = _unit()
        result, sent = _run_traced(c, tmp_path)
        assert result.outcome == "finished" and _finished(row), result
        assert sent[0] == "DEALLOCATE ALL" and sent[1].startswith("PREPARE "), sent
        assert re.match(rf"BEGIN; {EXECUTE.pattern}", sent[-3]), sent
        assert re.match(EXECUTE.pattern, sent[-1]), sent
        assert not prepared._off
    finally:
        connection.close()
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE testapp_solo ALTER COLUMN action TYPE varchar(100)")


def test_the_prepared_completion_finds_its_unit_by_primary_key(postgres):
    """A prepared statement gets one plan for every unit after its fifth run: it must not
    read the partial index of WORKING units by lease (all of them) instead."""
    from django.db import transaction
    from django.utils import timezone

    for _ in range(8):
        run(_unit()[1])
    _, c = _unit()
    (sql,) = [sql for sql in prepared.prepared(connection) if "WITH done AS (UPDATE" in sql]
    now = timezone.now()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT transaction_timestamp()")
        (begun,) = cursor.fetchone()
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN " + prepared.prepared(connection)[sql],
                       [now, c.execution_id, c.token, State.WORKING, now, begun])
        plan = "\n".join(line for (line,) in cursor.fetchall())
        transaction.set_rollback(True)
    assert "Index Scan using django_dbworker_execution_pkey" in plan, plan
    assert "dbworker_execution_working" not in plan, plan


def test_a_statement_is_named_without_openssl(monkeypatch):
    """The name is a BLAKE2b hash (Python's own), not an OpenSSL digest: a child's first
    OpenSSL digest maps ~0.8 MB of libcrypto into its RSS, and naming statements was the
    only OpenSSL call of an idle child (issue #24, memory)."""
    import hashlib

    for digest in ("sha1", "sha256", "md5", "new"):
        monkeypatch.setattr(hashlib, digest, None)

    class Cursor:
        sent: list[str] = []

        def execute(self, sql):
            self.sent.append(sql)

    query = prepared._prepare(Cursor(), "SELECT %s FROM t WHERE a = %s")
    assert EXECUTE.match(query) and query.endswith("(%s, %s)")
    name = query.split()[1].split("(")[0]
    assert Cursor.sent == [f"PREPARE {name} AS SELECT $1 FROM t WHERE a = $2"]
