"""The way from a caller's enqueue() or save() to an idle supervisor's claim (issue 24).

On PostgreSQL an enqueue() outside a transaction is one query, its INSERT and NOTIFY in an
implicit transaction of their own (not BEGIN, INSERT, NOTIFY, COMMIT); a saved source row's
pending execution and NOTIFY are one query after the row's own INSERT, committed without
waiting for the WAL flush (``ASYNC_COMMIT``: the row itself was flushed; discovery finds a
lost execution again). Inside the caller's transaction both are part of it: announced,
stored and durable only when it commits, and gone when it rolls back. Everywhere the unit
is stored exactly as before. The supervisor does not claim again at once after a round in
which every source gave fewer units than asked. ``supervisor/trace.py`` marks the steps.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
from types import SimpleNamespace

import pytest
from django.db import connection, transaction

from django_dbworker import conf
from django_dbworker.db import engine
from django_dbworker.db.notify import CHANNEL
from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from django_dbworker.rows.registry import workers
from django_dbworker.supervisor import trace
from django_dbworker.supervisor.handoff import Handoff
from django_dbworker.supervisor.pool import Child
from tests.conftest import queries_sent
from tests.testapp import tasks
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("PostgreSQL's simple protocol and NOTIFY")


@pytest.fixture
def listening(vendor):
    """A connection listening on our channel (PostgreSQL), closed afterwards."""
    if vendor != "postgresql":
        pytest.skip("LISTEN")
    heard = engine().listen(connection, CHANNEL)
    yield heard
    heard.close()


def hear(listening, seconds: float = 10.0) -> set[str]:
    deadline = time.monotonic() + seconds
    found: set[str] = set()
    while not found and time.monotonic() < deadline:
        found = listening.received()
        time.sleep(0.01)
    return found


def pending(item: Item) -> set[str]:
    """The workers for which ``item`` has a PENDING execution."""
    return set(Execution.objects.filter(source_id=str(item.pk), state=State.PENDING)
               .values_list("worker", flat=True))


def item_workers() -> set[str]:
    return {w.name for w in workers.for_model(Item)}


# ----- enqueue() ---------------------------------------------------------------------------


def test_an_enqueue_outside_a_transaction_is_one_query(postgres, listening, tmp_path):
    result, sent = queries_sent(lambda: tasks.add.enqueue(1, 2), tmp_path)
    assert len(sent) == 1, sent
    assert sent[0].startswith('INSERT INTO "django_dbworker_taskrecord"'), sent[0]
    assert sent[0].endswith(f"; SELECT pg_notify('{CHANNEL}', 'plain')"), sent[0][-200:]
    assert "synchronous_commit" not in sent[0], "a task is the caller's data: durable"
    record = TaskRecord.objects.get(pk=result.id)
    assert (record.status, record.args) == (TaskStatus.READY, [1, 2])
    assert hear(listening) == {"plain"}, "a task without a concurrency key"


def test_an_enqueue_inside_a_transaction_is_part_of_it(postgres, listening):
    with transaction.atomic():
        result = tasks.add.enqueue(3, 4)
        assert listening.received() == set(), "announced only at the commit"
    assert hear(listening) == {"plain"}
    assert TaskRecord.objects.filter(pk=result.id).exists()

    with transaction.atomic():
        gone = tasks.add.enqueue(5, 6)
        transaction.set_rollback(True)
    assert not TaskRecord.objects.filter(pk=gone.id).exists()
    assert hear(listening, 0.5) == set(), "a rolled-back enqueue announces nothing"


def test_enqueue_stores_the_same_everywhere(vendor):
    """Whatever the engine: one call, one READY row with its arguments; a batch of many
    takes the batched way (more than one statement's worth)."""
    result = tasks.add.enqueue(7, 8)
    record = TaskRecord.objects.get(pk=result.id)
    assert (record.status, record.args, record.kwargs) == (TaskStatus.READY, [7, 8], {})
    many = tasks.add.enqueue_many([((i, i), {}) for i in range(1001)])
    assert TaskRecord.objects.filter(pk__in=[r.id for r in many]).count() == 1001


# ----- save() of a source row --------------------------------------------------------------


def test_a_save_outside_a_transaction_adds_its_units_in_one_query(postgres, listening,
                                                                   tmp_path):
    item, sent = queries_sent(lambda: Item.objects.create(kind="touch"), tmp_path)
    assert len(sent) == 2, sent  # the row's own INSERT, then ours
    assert sent[0].startswith('INSERT INTO "testapp_item"'), sent[0]
    ours = sent[1]
    assert ours.startswith("SET LOCAL synchronous_commit = off; "), ours
    assert ours.count('INSERT INTO "django_dbworker_execution"') == len(item_workers())
    assert ours.endswith(f"; SELECT pg_notify('{CHANNEL}', 'rows')"), ours[-200:]
    assert pending(item) == item_workers()
    assert hear(listening) == {"rows"}


def test_a_save_inside_a_transaction_leaves_its_commit_alone(postgres, listening, tmp_path):
    with transaction.atomic():
        item, sent = queries_sent(lambda: Item.objects.create(kind="touch"), tmp_path)
        assert "synchronous_commit" not in " ".join(sent), "the caller's commit waits"
        assert listening.received() == set()
    assert hear(listening) == {"rows"}
    assert pending(item) == item_workers()

    with transaction.atomic():
        gone = Item.objects.create(kind="touch")
        transaction.set_rollback(True)
    assert not Execution.objects.filter(source_id=str(gone.pk)).exists()


def test_without_async_commit_the_save_waits_for_the_flush(postgres, settings, tmp_path):
    settings.DBWORKER = {**settings.DBWORKER, "ASYNC_COMMIT": False}
    assert not conf.get().ASYNC_COMMIT
    item, sent = queries_sent(lambda: Item.objects.create(kind="touch"), tmp_path)
    assert len(sent) == 2 and "synchronous_commit" not in sent[1], sent
    assert pending(item) == item_workers()


def test_without_notify_nothing_is_announced(postgres, settings, tmp_path):
    settings.DBWORKER = {**settings.DBWORKER, "NOTIFY": False}
    _, sent = queries_sent(lambda: tasks.add.enqueue(1, 1), tmp_path)
    item, saved = queries_sent(lambda: Item.objects.create(kind="touch"), tmp_path)
    assert len(sent) == 1 and len(saved) == 2, (sent, saved)
    assert not [q for q in sent + saved if "pg_notify" in q]
    assert pending(item) == item_workers()


def test_a_save_makes_the_row_pending_once_for_each_worker(vendor):
    """On every database: each worker over the model gets one PENDING execution; saving
    the row again adds none (a unit that exists is left as it is)."""
    item = Item.objects.create(kind="touch")
    assert pending(item) == item_workers() and len(item_workers()) > 1
    Execution.objects.filter(worker="touch", source_id=str(item.pk)).update(
        state=State.FINISHED)
    item.save()
    item.save()
    rows = Execution.objects.filter(source_id=str(item.pk))
    assert rows.count() == len(item_workers())
    assert rows.get(worker="touch").state == State.FINISHED


def test_one_query_refuses_where_the_engine_cannot(vendor):
    """SQLite and MariaDB run the statements their own way (False: nothing was run)."""
    ran = engine().one_query(connection, [("SELECT 1", [])])
    assert ran == (vendor == "postgresql")


# ----- the supervisor's rounds -------------------------------------------------------------


def _supervisor(children: int):
    from django_dbworker.supervisor.supervisor import Options, Supervisor

    supervisor = Supervisor(Options(workers=[workers["ahead"]], tasks=False,
                                    concurrency=children), conf.get(), None)
    fork = multiprocessing.get_context("fork")
    ends = []
    for slot in range(children):
        ours, theirs = fork.Pipe()
        ends.append(theirs)
        process = SimpleNamespace(exitcode=None, pid=None, sentinel=None)
        supervisor.children.append(Child(slot, process, ours, Handoff(fork)))  # type: ignore[arg-type]
    return supervisor, ends


def _settle(supervisor) -> None:
    """Run its duties as its loop does until none is due at once (discovery's first pass
    over a worker's rows goes step by step)."""
    for _ in range(50):
        supervisor.duties.run_due()
        if supervisor._idle_timeout() > 0.0:
            return
    raise AssertionError("the supervisor's duties stay due")


def _close(supervisor, ends) -> None:
    for ch in supervisor.children:
        ch.pipe.close()
    for end in ends:
        end.close()
    supervisor._wake_r.close()
    supervisor._wake_w.close()


def test_a_round_that_found_less_than_it_asked_for_waits_for_news(vendor):
    """Two children with room, one unit: it is claimed and handed to a child; every source
    gave less than asked, so the loop waits (NOTIFY, a commit, a report or the poll wakes
    it) rather than claiming again at once beside the unit it started."""
    Item.objects.create(kind="ahead")
    supervisor, ends = _supervisor(2)
    try:
        _settle(supervisor)
        assert supervisor._fill() == 1
        assert sum(len(ch.sent) for ch in supervisor.children) == 1
        assert supervisor._short
        assert supervisor._round_timeout(1, last_round=False) > 0.0
        assert supervisor._round_timeout(1, last_round=True) == 0.0, "--burst's last look"
    finally:
        _close(supervisor, ends)


def test_a_round_that_found_all_it_asked_for_claims_again_at_once(vendor):
    """Two units for two children: the round got all it asked for, so more may be
    waiting: the next round comes at once once a child has room (and, finding none,
    waits)."""
    for _ in range(2):
        Item.objects.create(kind="ahead")
    supervisor, ends = _supervisor(2)
    try:
        _settle(supervisor)
        assert supervisor._fill() == 2
        assert not supervisor._short
        supervisor.children[0].sent.clear()  # as if it had reported its unit
        assert supervisor._round_timeout(2, last_round=False) == 0.0
        assert supervisor._fill() == 0 and supervisor._short
        assert supervisor._round_timeout(0, last_round=False) > 0.0
    finally:
        _close(supervisor, ends)


# ----- the trace ---------------------------------------------------------------------------


def test_the_trace_is_off_without_its_variable(monkeypatch, tmp_path):
    monkeypatch.delenv("DBWORKER_TRACE", raising=False)
    off = importlib.reload(trace)
    assert not off.ON and off.FILE is None
    off.mark("woke")  # nothing to write to: nothing happens
    off.statements("default")
    assert off._marking not in connection.execute_wrappers

    path = tmp_path / "trace.log"
    monkeypatch.setenv("DBWORKER_TRACE", str(path))
    on = importlib.reload(trace)
    try:
        assert on.ON and str(path) == on.FILE
        on.mark("woke", "task")
        on.statements("default")
        on.statements("default")  # once per connection
        assert connection.execute_wrappers.count(on._marking) == 1
        Item.objects.count()
        lines = [line.split(" ", 3) for line in path.read_text().splitlines()]
        assert lines[0][2:] == ["woke", "task"] and float(lines[0][0]) > 0
        assert int(lines[0][1]) == os.getpid()
        marks = [line[2:] for line in lines[1:]]
        count = [d for event, d in marks if d.startswith("SELECT COUNT(*)")]
        assert len(count) == 2 and count[0] == count[1] and "testapp_item" in count[0], marks
        assert [event for event, _ in marks] == ["sql", "sql_done"] * (len(marks) // 2)
    finally:
        connection.execute_wrappers.remove(on._marking)
        if on._fd is not None:
            os.close(on._fd)
        monkeypatch.delenv("DBWORKER_TRACE")
        importlib.reload(trace)
