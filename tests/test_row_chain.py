"""A transactional row unit whose child holds the next unit already: its completion's query
also begins the next unit's transaction with that unit's source-row read
(``<completion>; COMMIT; BEGIN; SELECT ...``, ``rows/chain.py``), one round trip between two
units instead of two. It must behave exactly as the longer way does (outcomes, fencing,
on_commit, deferred constraints, failures), and never leave the connection in a transaction
once the next unit does not run. SQLite and MariaDB/MySQL begin nothing with a completion:
the behaviour tests run there too (the longer way)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker import ExecutionStatus, signals, workers
from django_dbworker.db.engine import Begin
from django_dbworker.models import Execution, State
from django_dbworker.rows import chain, planner, store
from django_dbworker.supervisor import units
from django_dbworker.units.claimant import Claimant
from tests.conftest import queries_sent, round_trips
from tests.testapp.models import Effect, Solo

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("PostgreSQL begins the next transaction with a completion")


def _claims(*rows):
    """One claim of all ``rows`` (``solo`` units), in the rows' order."""
    claimed = {c.source_key: c for c in planner.claim(workers["solo"], 10, Claimant(), 30)}
    return [claimed[str(row.pk)] for row in rows]


def _two(first="ok", second="ok"):
    a, b = Solo.objects.create(action=first), Solo.objects.create(action=second)
    return (a, b), _claims(a, b)


def _status(row):
    return workers["solo"].state(row.pk)["execution_status"]


def _out_of_transaction():
    """Django and psycopg both out of any transaction, autocommit on (as between units)."""
    from psycopg.pq import TransactionStatus

    assert connection.get_autocommit() and not connection.in_atomic_block
    raw = connection.connection
    if raw is not None and connection.vendor == "postgresql":
        assert raw.pgconn.transaction_status == TransactionStatus.IDLE
        assert raw.autocommit


# ----- the queries sent --------------------------------------------------------------------


def test_the_completion_begins_the_next_units_transaction_with_its_read(postgres, tmp_path):
    (a, b), (ca, cb) = _two()

    def both():
        return units.run(ca, then=cb), units.run(cb)

    (first, second), sent = queries_sent(both, tmp_path)
    assert (first.outcome, second.outcome) == ("finished", "finished")
    # a's read, a's INSERT, a's completion with b's BEGIN and read, b's INSERT, b's completion
    assert len(sent) == 5, sent
    assert sent[0].startswith("BEGIN; SELECT ") and "testapp_solo" in sent[0]
    chained = sent[2]
    assert 'UPDATE "django_dbworker_execution"' in chained, chained
    _head, tail = chained.split("; COMMIT; ", 1)
    assert tail.startswith("BEGIN") and "testapp_solo" in tail, tail
    assert "transaction_timestamp()" in tail, "b's transaction marker is read with b's row"
    assert sent[3].startswith('INSERT INTO "testapp_effect"'), sent[3]
    assert sent[4].endswith("; COMMIT") and "BEGIN" not in sent[4], sent[4]
    assert not [q for q in sent if q.strip() in ("BEGIN", "COMMIT", "ROLLBACK")], sent
    assert _status(a) == _status(b) == ExecutionStatus.FINISHED
    assert Effect.objects.filter(worker="solo").count() == 2
    _out_of_transaction()


def test_two_units_cost_three_round_trips_of_ours(postgres, tmp_path):
    """Two units in a row: 2 + 1 round trips of ours, not 2 + 2 (each handler's INSERT on
    top)."""
    (_a, _b), (ca, cb) = _two()
    (first, second), trips = round_trips(lambda: (units.run(ca, then=cb), units.run(cb)),
                                         tmp_path)
    assert (first.outcome, second.outcome) == ("finished", "finished")
    assert trips == 3 + 2, trips
    (_c, _d), (cc, cd) = _two()
    _, unchained = round_trips(lambda: (units.run(cc), units.run(cd)), tmp_path)
    assert unchained == 4 + 2, unchained


def test_each_unit_has_its_own_transaction(postgres):
    """b's transaction began after a's commit: another transaction, and b's handler sees
    a's writes."""
    (_a, _b), (ca, cb) = _two(first="isolation", second="isolation")
    assert units.run(ca, then=cb).outcome == "finished"
    assert units.run(cb).outcome == "finished"
    assert set(Effect.objects.values_list("note", flat=True)) == {"read committed"}
    done = Execution.objects.filter(worker="solo").values_list("state", flat=True)
    assert set(done) == {State.FINISHED}


# ----- where nothing begins with the completion ---------------------------------------------


def test_on_commit_callbacks_keep_the_next_transaction_out(postgres, tmp_path):
    """a's on_commit callback runs after a's COMMIT in autocommit, not in b's transaction:
    b's transaction begins on its own."""
    (a, _b), (ca, cb) = _two(first="on_commit")
    (first, second), sent = queries_sent(lambda: (units.run(ca, then=cb), units.run(cb)),
                                         tmp_path)
    assert (first.outcome, second.outcome) == ("finished", "finished")
    assert not any("; COMMIT; BEGIN" in q for q in sent), sent
    assert Effect.objects.filter(item_id=a.pk, worker="solo:on_commit").count() == 1
    _out_of_transaction()


@pytest.mark.parametrize("signal", ["execution_finished", "execution_started"])
def test_a_signal_receiver_keeps_the_next_transaction_out(postgres, tmp_path, signal):
    seen = []

    def receiver(sender, **kwargs):
        seen.append((connection.get_autocommit(), connection.in_atomic_block))

    getattr(signals, signal).connect(receiver)
    try:
        (_a, _b), (ca, cb) = _two()
        (first, second), sent = queries_sent(
            lambda: (units.run(ca, then=cb), units.run(cb)), tmp_path)
    finally:
        getattr(signals, signal).disconnect(receiver)
    assert (first.outcome, second.outcome) == ("finished", "finished")
    assert not any("; COMMIT; BEGIN" in q for q in sent), sent
    assert seen == [(True, False), (True, False)], "receivers run outside any transaction"


# ----- the guarantees, whatever begins with the completion ----------------------------------


def test_a_lost_claim_commits_nothing_and_begins_nothing():
    (a, b), (ca, cb) = _two()
    Execution.objects.filter(pk=ca.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert store.reap(max_crashes=3) == 1
    assert units.run(ca, then=cb).outcome == "lease_lost"
    assert not Effect.objects.filter(item_id=a.pk).exists()
    _out_of_transaction()
    assert units.run(cb).outcome == "finished"
    assert Effect.objects.filter(item_id=b.pk).count() == 1


def test_a_deferred_constraint_failing_at_commit_fails_only_its_unit(postgres):
    (a, b), (ca, cb) = _two(first="deferred_violation")
    result = units.run(ca, then=cb)
    assert result.outcome == "failed" and "IntegrityError" in result.error, result
    assert not Effect.objects.filter(item_id=a.pk).exists(), "rolled back with the COMMIT"
    _out_of_transaction()
    assert units.run(cb).outcome == "finished"
    assert _status(a) == ExecutionStatus.FAILED and _status(b) == ExecutionStatus.FINISHED


@pytest.mark.parametrize("action", ["raise", "raw_commit", "commit"])
def test_a_failing_handler_fails_its_unit_and_the_next_runs(action):
    (_a, b), (ca, cb) = _two(first=action)
    assert units.run(ca, then=cb).outcome == "failed"
    _out_of_transaction()
    assert units.run(cb).outcome == "finished"
    assert _status(b) == ExecutionStatus.FINISHED


def test_unfinished_begins_the_next_too(postgres, tmp_path):
    (_a, _b), (ca, cb) = _two(first="wait")
    (first, second), sent = queries_sent(lambda: (units.run(ca, then=cb), units.run(cb)),
                                         tmp_path)
    assert (first.outcome, second.outcome) == ("unfinished", "finished")
    assert any("; COMMIT; BEGIN" in q for q in sent), sent


def test_a_failing_next_read_leaves_this_unit_committed(postgres, monkeypatch):
    """The query fails after a's COMMIT (in b's read): which statement failed is read
    back from a's execution; a is finished, b begins on its own later."""
    (a, b), (ca, cb) = _two()
    real = chain.begin_next

    def broken(worker, using):
        plan = real(worker, using)
        assert plan is not None
        return Begin("SELECT 1 / (0 * %s)", [1]), plan[1]

    monkeypatch.setattr(chain, "begin_next", broken)
    assert units.run(ca, then=cb).outcome == "finished"
    _out_of_transaction()
    monkeypatch.setattr(chain, "begin_next", real)
    assert units.run(cb).outcome == "finished"
    assert _status(a) == _status(b) == ExecutionStatus.FINISHED
    assert Effect.objects.count() == 2


def test_a_failure_before_commit_is_still_this_units(postgres, monkeypatch):
    """A failure the markers do not name, before COMMIT (the completion itself): the
    execution says nothing committed, so it is the unit's error, as without a next unit."""
    (a, _b), (ca, cb) = _two()
    real = store._completion

    def failing(c, outcome, conn):
        sql, params, now = real(c, outcome, conn)
        return sql.replace("WHERE id = %s", "WHERE id = 1 / (0 * %s)", 1), params, now

    monkeypatch.setattr(store, "_completion", failing)
    result = units.run(ca, then=cb)
    monkeypatch.setattr(store, "_completion", real)
    assert result.outcome == "failed" and "division by zero" in result.error, result
    assert not Effect.objects.filter(item_id=a.pk).exists()
    _out_of_transaction()
    assert units.run(cb).outcome == "finished"


# ----- the transaction begun for a unit that does not run next ------------------------------


def test_let_go_rolls_the_begun_transaction_back(postgres):
    (_a, b), (ca, cb) = _two()
    assert units.run(ca, then=cb).outcome == "finished"
    assert not connection.get_autocommit(), "b's transaction is open"
    units.let_go()
    _out_of_transaction()
    units.let_go()  # nothing begun: nothing to do
    assert units.run(cb).outcome == "finished"
    assert _status(b) == ExecutionStatus.FINISHED


def test_another_unit_run_first_ends_the_begun_transaction(postgres, tmp_path):
    a, b, c = (Solo.objects.create() for _ in range(3))
    ca, cb, cc = _claims(a, b, c)
    assert units.run(ca, then=cb).outcome == "finished"
    result, sent = queries_sent(lambda: units.run(cc), tmp_path)
    assert result.outcome == "finished"
    assert sent[0] == "ROLLBACK" and sent[1].startswith("BEGIN; SELECT "), sent
    assert units.run(cb).outcome == "finished"
    assert {_status(r) for r in (a, b, c)} == {ExecutionStatus.FINISHED}
    _out_of_transaction()


def test_a_next_unit_whose_row_is_gone_is_forgotten(postgres):
    (_a, b), (ca, cb) = _two()
    with connection.cursor() as cursor:  # gone before a's completion reads it
        cursor.execute("DELETE FROM testapp_solo WHERE id = %s", [b.pk])
    assert units.run(ca, then=cb).outcome == "finished"
    assert units.run(cb).outcome == "gone"
    _out_of_transaction()


# ----- in a runworkers child ------------------------------------------------------------------


def test_a_child_begins_each_next_units_transaction_with_the_last_completion(
        postgres, runworkers, tmp_path):
    """A real child, with its units claimed ahead: most units' transactions begin in the
    query of the completion before them (the trace marks every statement the child
    sends), and every unit is run and recorded exactly once."""
    rows = Solo.objects.bulk_create([Solo() for _ in range(60)])
    trace = tmp_path / "trace.txt"
    rw = runworkers("--worker", "solo", "--concurrency", "1", "--burst",
                    extra_env={"DBWORKER_TRACE": str(trace)})
    assert rw.wait(60) == 0, rw.output()
    assert {_status(r) for r in rows} == {ExecutionStatus.FINISHED}
    assert all(Effect.objects.filter(item_id=r.pk, worker="solo").count() == 1 for r in rows)
    sent = [line for line in trace.read_text().splitlines()
            if " sql " in line and " sql PREPARE " not in line]
    chained = [line for line in sent if "; COMMIT; BEGIN" in line]
    completions = [line for line in sent  # prepared (EXECUTE ...; COMMIT) or not yet
                   if "; COMMIT" in line or "WITH done AS (UPDATE" in line]
    assert len(completions) == 60, "\n".join(sent)
    assert len(chained) >= 30, f"{len(chained)} of 60 completions began the next unit"
