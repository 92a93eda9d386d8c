"""A transactional unit on PostgreSQL in two queries of ours: BEGIN goes with the source
row's read (``db.execute_first``) and COMMIT with the completion
(``PostgreSQL.complete`` with ``final``). It must behave exactly as the longer way does: outcomes,
failures, fencing, on_commit, deferred constraints, and never a COMMIT of a transaction it
did not open. The behaviour tests run on SQLite too (the longer way there)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker import ExecutionStatus, workers
from django_dbworker.db import sources
from django_dbworker.models import Execution, State, TaskRecord
from django_dbworker.rows import planner, store
from django_dbworker.rows.runner import run
from django_dbworker.units.claimant import Claimant
from tests.conftest import queries_sent, round_trips
from tests.testapp import tasks
from tests.testapp.models import Effect, Item, Solo, Tag

pytestmark = pytest.mark.django_db(transaction=True)


def _claim(worker, pk):
    (c,) = [c for c in planner.claim(workers[worker], 10, Claimant(), 30)
            if c.source_key == str(pk)]
    return c


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("psycopg's BEGIN and COMMIT")


# ----- the queries sent --------------------------------------------------------------------


def test_a_unit_sends_begin_with_its_read_and_commit_with_its_completion(postgres, tmp_path):
    # Unprepared outside runworkers' children (tests/test_prepared.py: the same, prepared).
    row = Solo.objects.create()
    c = _claim("solo", row.pk)
    result, sent = queries_sent(lambda: run(c), tmp_path)
    assert result.outcome == "finished", result
    assert len(sent) == 3, sent  # the read, the handler's INSERT, the completion
    assert sent[0].startswith("BEGIN; SELECT ") and "testapp_solo" in sent[0], sent[0]
    assert "transaction_timestamp()" in sent[0], "the transaction marker is read with it"
    assert sent[1].startswith('INSERT INTO "testapp_effect"'), sent[1]
    assert 'UPDATE "django_dbworker_execution"' in sent[2] and sent[2].endswith("; COMMIT")
    assert not [q for q in sent if q.strip() in ("BEGIN", "COMMIT")], sent
    assert Effect.objects.filter(item_id=row.pk, worker="solo").count() == 1
    assert workers["solo"].state(row.pk)["execution_status"] == ExecutionStatus.FINISHED


def test_a_unit_costs_two_round_trips_of_ours(postgres, tmp_path):
    """The steady state of a transactional row unit in a child: BEGIN and the read, then
    the completion and COMMIT; the handler's own statements come on top (here one)."""
    row = Solo.objects.create()
    c = _claim("solo", row.pk)
    result, trips = round_trips(lambda: run(c), tmp_path)
    assert result.outcome == "finished", result
    assert trips == 2 + 1, trips  # + the handler's INSERT
    assert workers["solo"].state(row.pk)["execution_status"] == ExecutionStatus.FINISHED


def test_with_sibling_workers_the_completion_leaves_commit_to_django(postgres, tmp_path):
    """``touch`` shares its model with other workers: after its completion the row is made
    pending for them in the same transaction, so COMMIT cannot go with the completion."""
    item = Item.objects.create()
    c = _claim("touch", item.pk)
    result, sent = queries_sent(lambda: run(c), tmp_path)
    assert result.outcome == "finished"
    assert sent[0].startswith("BEGIN; SELECT "), sent
    assert sent[-1] == "COMMIT" and not any(q.endswith("; COMMIT") for q in sent), sent


def test_a_read_after_the_transaction_began_sends_no_begin(postgres, tmp_path):
    item = Item.objects.create()

    def read_second():
        with transaction.atomic():
            Item.objects.filter(pk=item.pk).exists()
            return sources.get(Item, item.pk, "default", first=True)

    row, sent = queries_sent(read_second, tmp_path)
    assert row.pk == item.pk
    assert sent[0] == "BEGIN", sent  # psycopg's own, before the first statement
    assert not any(q.startswith("BEGIN;") for q in sent), sent


def test_with_server_side_binding_begin_and_commit_go_alone(postgres, tmp_path):
    """Django's ``"server_side_binding": True``: a query holds one statement, so BEGIN and
    COMMIT are sent as psycopg sends them, and the unit commits as ever."""
    from django.db.backends.postgresql.base import ServerBindingCursor

    row = Solo.objects.create()
    c = _claim("solo", row.pk)
    raw = connection.connection
    client_factory = raw.cursor_factory
    raw.cursor_factory = ServerBindingCursor
    try:
        result, sent = queries_sent(lambda: run(c), tmp_path)
    finally:
        raw.cursor_factory = client_factory
    assert result.outcome == "finished", result
    assert sent == ["BEGIN", "COMMIT"], sent  # the statements go as Parse/Bind, not Query
    assert Effect.objects.filter(item_id=row.pk).count() == 1
    assert workers["solo"].state(row.pk)["execution_status"] == ExecutionStatus.FINISHED


def test_the_merged_begin_keeps_the_connections_isolation_level(postgres):
    import psycopg

    row = Solo.objects.create(action="isolation")
    c = _claim("solo", row.pk)
    raw = connection.connection
    raw.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    try:
        assert run(c).outcome == "finished"
    finally:
        raw.isolation_level = None
    assert Effect.objects.get(item_id=row.pk).note == "repeatable read"


# ----- what the unit does, the short way on PostgreSQL -----------------------------------


@pytest.mark.parametrize(("action", "outcome", "error"), [
    ("raise", "failed", "builtins.ValueError"),
    ("raw_commit", "failed", "ended the transaction itself"),
    ("raw_rollback", "failed", "ended the transaction itself"),
    ("commit", "failed", "tried to manage the transaction itself"),
    ("close", "failed", "closed the database connection"),
])
def test_failures_roll_back_and_are_recorded(action, outcome, error):
    row = Solo.objects.create(action=action)
    result = run(_claim("solo", row.pk))
    assert result.outcome == outcome, result
    assert error in result.error
    state = workers["solo"].state(row.pk)
    assert state["execution_status"] == ExecutionStatus.FAILED
    assert error in state["error"]["exception_class"] + state["error"]["message"]
    if action not in ("raw_commit",):  # a COMMIT through a cursor keeps what came before
        assert not Effect.objects.filter(item_id=row.pk).exists()


def test_a_deferred_constraint_failing_at_commit_fails_the_unit(postgres):
    row = Solo.objects.create(action="deferred_violation")
    result = run(_claim("solo", row.pk))
    assert result.outcome == "failed", result
    assert "IntegrityError" in result.error and "deferred_check" in result.error
    assert not Effect.objects.filter(item_id=row.pk).exists(), "rolled back with the COMMIT"
    assert Execution.objects.get(worker="solo", source_id=str(row.pk)).state == State.FAILED


def test_on_commit_callbacks_run_after_the_commit_and_only_then():
    row = Solo.objects.create(action="on_commit")
    old = _claim("solo", row.pk)
    Execution.objects.filter(pk=old.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert store.reap(max_crashes=3) == 1
    new = _claim("solo", row.pk)
    assert run(old).outcome == "lease_lost"
    assert not Effect.objects.exists(), "no commit, no callback"
    assert run(new).outcome == "finished"
    assert Effect.objects.filter(item_id=row.pk, worker="solo:on_commit").count() == 1


def test_a_taken_over_claim_commits_nothing():
    row = Solo.objects.create()
    old = _claim("solo", row.pk)
    Execution.objects.filter(pk=old.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert store.reap(max_crashes=3) == 1
    new = _claim("solo", row.pk)
    result = run(old)
    assert result.outcome == "lease_lost", result
    assert "lost the claim" in result.error
    assert not Effect.objects.exists(), "the stale run's write was rolled back"
    assert Execution.objects.get(pk=new.execution_id).token == new.token
    assert run(new).outcome == "finished"
    assert Effect.objects.filter(item_id=row.pk).count() == 1


def test_an_expired_lease_commits_nothing(postgres):
    row = Solo.objects.create()
    c = _claim("solo", row.pk)
    Execution.objects.filter(pk=c.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert run(c).outcome == "lease_lost"
    assert not Effect.objects.exists()
    assert Execution.objects.get(pk=c.execution_id).state == State.WORKING  # for a reaper


def test_a_unit_run_inside_a_transaction_does_not_commit_it():
    """As under ``run_until_idle`` in a test's transaction: the unit is a savepoint, and
    what it wrote goes when the outer transaction rolls back."""
    row = Solo.objects.create()
    c = _claim("solo", row.pk)
    with transaction.atomic():
        assert run(c).outcome == "finished"
        assert Effect.objects.filter(item_id=row.pk).exists()
        transaction.set_rollback(True)
    assert not Effect.objects.exists()
    assert Execution.objects.get(pk=c.execution_id).state == State.WORKING


# ----- round trips around the unit: its arrival, its claim, a record alone ------------------


def test_an_enqueue_outside_a_transaction_is_one_round_trip(postgres, tmp_path):
    """The task's INSERT and the NOTIFY in one pipeline, no BEGIN or COMMIT: the server
    runs them as one implicit transaction up to the pipeline's Sync."""
    result, trips = round_trips(lambda: tasks.add.enqueue(1, 2), tmp_path)
    assert trips == 1, trips
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == "READY" and record.args == [1, 2]


def test_an_enqueue_inside_a_transaction_is_a_savepoint_around_one_pipeline(postgres,
                                                                            tmp_path):
    with transaction.atomic():
        Item.objects.create(action="before")
        result, trips = round_trips(lambda: tasks.add.enqueue(1, 2), tmp_path)
        # SAVEPOINT, the pipeline (the task and the NOTIFY), RELEASE SAVEPOINT
        assert trips == 3, trips
    assert TaskRecord.objects.filter(pk=result.id).exists()


def test_a_saved_row_gets_its_unit_and_announcement_in_one_round_trip(postgres, tmp_path):
    """``post_save``: the PENDING execution(s) and the NOTIFY are sent together, after the
    row's own INSERT (autocommit: one implicit transaction for both)."""
    row, trips = round_trips(lambda: Solo.objects.create(), tmp_path)
    assert trips == 2, trips  # Django's INSERT, then ours
    assert Execution.objects.filter(worker="solo", source_id=str(row.pk),
                                    state=State.PENDING).exists()


def test_a_saved_row_is_pending_for_every_worker_of_its_model():
    item = Item.objects.create(kind="touch")
    pending = set(Execution.objects.filter(source_id=str(item.pk)).values_list("worker",
                                                                              flat=True))
    assert {w.name for w in workers.for_model(Item)} == pending


def test_a_unit_managing_its_own_transactions_records_in_one_statement(
        postgres, tmp_path, monkeypatch):
    """``transactional=False`` and no sibling worker: the record is one UPDATE in
    autocommit (no BEGIN and COMMIT of its own): the read and the record, two round trips."""
    monkeypatch.setattr(workers["tag"], "transactional", False)
    row = Tag.objects.create(code="a")
    c = _claim("tag", row.pk)
    result, trips = round_trips(lambda: run(c), tmp_path)
    assert result.outcome == "finished", result
    assert trips == 2, trips
    assert workers["tag"].state(row.pk)["execution_status"] == ExecutionStatus.FINISHED


def test_a_unit_managing_its_own_transactions_is_fenced_alone_too(monkeypatch):
    monkeypatch.setattr(workers["tag"], "transactional", False)
    row = Tag.objects.create(code="b")
    old = _claim("tag", row.pk)
    Execution.objects.filter(pk=old.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert store.reap(max_crashes=3) == 1
    new = _claim("tag", row.pk)
    assert run(old).outcome == "lease_lost"
    assert Execution.objects.get(pk=new.execution_id).token == new.token
    assert run(new).outcome == "finished"


def test_a_keyed_claim_sends_begin_with_its_first_read_and_commit_with_its_update(
        postgres, tmp_path):
    from psycopg.pq import TransactionStatus

    from django_dbworker.tasks import concurrency
    from tests.testapp.concurrency_tasks import conc_account

    conc_account.enqueue("k", 0)
    claims, sent = queries_sent(
        lambda: concurrency.claim(None, 5, Claimant(), 30), tmp_path)
    assert len(claims) == 1, claims
    assert sent[0].startswith("BEGIN; SELECT "), sent
    assert sent[-1].endswith("; COMMIT") and "UPDATE" in sent[-1], sent
    assert not [q for q in sent if q.strip() in ("BEGIN", "COMMIT")], sent
    assert connection.connection.pgconn.transaction_status == TransactionStatus.IDLE
    assert TaskRecord.objects.get(pk=claims[0].task_id).status == "RUNNING"
    _, trips = round_trips(lambda: concurrency.claim(None, 5, Claimant(), 30), tmp_path)
    assert trips == 2, trips  # nothing left to claim: BEGIN with the read, then COMMIT


def test_a_keyed_claim_inside_a_transaction_leaves_commit_to_it(postgres, tmp_path):
    from django_dbworker.tasks import concurrency
    from tests.testapp.concurrency_tasks import conc_account

    conc_account.enqueue("k", 0)
    with transaction.atomic():
        Item.objects.create(action="before")
        claims, sent = queries_sent(
            lambda: concurrency.claim(None, 5, Claimant(), 30), tmp_path)
        assert len(claims) == 1
        assert not any("COMMIT" in q for q in sent), sent
        transaction.set_rollback(True)
    assert TaskRecord.objects.get().status == "READY", "rolled back with the caller's"


def test_a_keyed_claim_of_rows_commits_with_its_update(postgres, tmp_path, request):
    from django_dbworker import Finished
    from django_dbworker.rows import concurrency
    from django_dbworker.rows.registry import worker as declare

    def keyed_rows(item):
        return Finished()

    worker = declare(keyed_rows, source=Item, eligible=Item.objects.filter(kind="conc_rows"),
                     concurrency_limit=2, concurrency_key="action")
    request.addfinalizer(lambda: workers.remove("keyed_rows"))
    item = Item.objects.create(kind="conc_rows", action="a")
    claims, sent = queries_sent(
        lambda: concurrency.claim(worker, 5, Claimant(), 30), tmp_path)
    assert [c.source_key for c in claims] == [str(item.pk)]
    assert sent[0].startswith("BEGIN; SELECT "), sent
    assert sent[-1].endswith("; COMMIT"), sent
    assert Execution.objects.get(pk=claims[0].execution_id).state == State.WORKING


def test_a_named_cursor_first_in_the_block_gets_begin_as_psycopg_sends_it(postgres, tmp_path):
    """``iterator()`` reads through a named cursor (DECLARE ... CURSOR FOR its query): the
    BEGIN cannot go in that query, so it goes alone, and the block works as ever."""
    from django_dbworker.db import engine

    Item.objects.create(action="a")
    Item.objects.create(action="b")

    def read():
        with transaction.atomic(), engine().begun_with_first_statement(connection):
            first = [i.action for i in Item.objects.order_by("pk").iterator(chunk_size=1)]
            return [*first, Item.objects.count()]

    seen, sent = queries_sent(read, tmp_path)
    assert seen == ["a", "b", 2], seen
    assert not any(q.startswith("BEGIN;") for q in sent), sent


def test_a_renewal_round_sends_begin_with_its_lock_timeout(postgres, tmp_path):
    """The renewer's transaction (``lock_wait_scope``): ``SET LOCAL lock_timeout`` goes
    with BEGIN, and holds for the statements of the round."""
    from django_dbworker.db import engine

    engine().bound_lock_waits(connection, 2.0)

    def round_():
        with engine().lock_wait_scope(connection), connection.cursor() as cursor:
            renewed = store.renew(Claimant(), 30)
            cursor.execute("SHOW lock_timeout")
            return renewed, cursor.fetchone()[0]

    try:
        (renewed, timeout), sent = queries_sent(round_, tmp_path)
    finally:
        del connection._dbworker_lock_wait
    assert renewed == 0 and timeout == "2s", (renewed, timeout)
    assert sent[0].startswith("BEGIN") and sent[0].endswith("SET LOCAL lock_timeout = 2000"), sent
    assert "BEGIN" not in [q.strip() for q in sent], sent
    with connection.cursor() as cursor:
        cursor.execute("SHOW lock_timeout")
        assert cursor.fetchone()[0] == "0", "SET LOCAL: only for the round"
