"""A unit whose database session the server ends while its handler runs goes back to be
run again: one lost session is not the unit's fault, so it is not recorded as its failure
(the chaos soak caught a row that was, on PostgreSQL: a child whose connection had been
closed after an earlier lost session started the next unit with none, and leaving the
handler's ``atomic()`` made Django open a new one at once, which answered, so the child
took the error for the unit's own). Where the database answered a new connection right
after, the loss counts a crash, so a unit that ends its session every time is ended by
``MAX_CRASHES``; an outage counts nothing."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator

import pytest
from django.db import connection

from django_dbworker import workers
from django_dbworker.models import Execution, State
from django_dbworker.rows import planner, store
from django_dbworker.supervisor import child
from django_dbworker.supervisor.supervisor import SESSION_ENDED
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from django_dbworker.units.failures import FailureInfo
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _server_sessions():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server session to lose")


@pytest.mark.parametrize("opened", [True, False], ids=["connection-open", "none-open"])
def test_a_session_ended_mid_handler_gives_the_unit_back(opened):
    item = Item.objects.create(kind="touch", action="drop_session_first")
    (c,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    if not opened:  # as after a previous unit's lost session: the child closed it
        connection.close()
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == ["session_ended"], report
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.WORKING, (execution.state, execution.failures.all())
    assert not Effect.objects.filter(item_id=item.pk).exists()  # rolled back with it

    # Given back as a crash (as the supervisor does on a session_ended report: the
    # database answered right after), it runs again and finishes.
    store.release(c, crashed=FailureInfo(SESSION_ENDED, report[0][3]), max_crashes=3)
    run_until_idle(["touch"])
    execution.refresh_from_db()
    assert (execution.state, execution.crashes) == (State.FINISHED, 1)
    assert Effect.objects.filter(item_id=item.pk, worker="touch").count() == 1


@pytest.mark.parametrize("opened", [True, False], ids=["connection-open", "none-open"])
def test_a_task_whose_session_ends_in_its_own_atomic_goes_back_unfailed(opened):
    from tests.testapp import tasks

    _task_goes_back_unfailed(tasks.drop_session_in_atomic, "drop_session_in_atomic",
                             opened=opened)


def _task_goes_back_unfailed(declared, effect_worker: str, *, opened: bool = True,
                             reported: str = "session_ended") -> None:
    """Run one task of ``declared`` as a child does: reported as a session that ended
    (the database answered right after), still RUNNING with no error recorded (the
    supervisor gives it back, a crash counted), its writes rolled back."""
    from django_dbworker.models import TaskRecord, TaskStatus
    from django_dbworker.tasks import planner as taskplanner

    result = declared.enqueue()
    (c,) = taskplanner.claim(None, 1, Claimant(), 30)
    if not opened:
        connection.close()
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == [reported], report
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.errors) == (TaskStatus.RUNNING, []), (row.status, row.errors)
    assert not Effect.objects.filter(worker=effect_worker).exists()


def test_a_commit_psycopg_could_not_read_gives_the_unit_back_unfailed():
    """Behind PgBouncer, a server connection ended mid-transaction made psycopg raise
    ``InternalError: received 2 results from command 'COMMIT'`` (CI, test_pgbouncer): not
    the unit's fault, and whether it committed is unknown. The unit goes back (fenced by its
    token), never FAILED."""
    if connection.vendor != "postgresql":
        pytest.skip("psycopg's own protocol error")
    item = Item.objects.create(kind="touch", action="protocol_confused_first")
    (c,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == ["db_error"], report
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.WORKING, (execution.state, execution.failures.all())
    assert not Effect.objects.filter(item_id=item.pk).exists()
    store.release(c, crashed=None, max_crashes=3)  # its session was still there
    run_until_idle(["touch"])
    execution.refresh_from_db()
    assert execution.state == State.FINISHED


@pytest.mark.parametrize("transactional", [True, False])
def test_a_task_whose_commit_psycopg_could_not_read_goes_back_unfailed(transactional):
    from tests.testapp import tasks

    if connection.vendor != "postgresql":
        pytest.skip("psycopg's own protocol error")
    declared = (tasks.protocol_confused_transactional if transactional
                else tasks.protocol_confused_in_atomic)
    _task_goes_back_unfailed(declared, "protocol_confused_in_atomic", reported="db_error")


@contextlib.contextmanager
def _refused() -> Iterator[None]:
    """The default connection's settings pointed at a port nobody listens on, meanwhile."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    settings = connection.settings_dict
    saved = (settings["HOST"], settings["PORT"])
    settings["HOST"], settings["PORT"] = "127.0.0.1", str(port)
    try:
        yield
    finally:
        connection.close()
        settings["HOST"], settings["PORT"] = saved


def test_a_session_lost_while_the_database_does_not_answer_counts_no_crash():
    """An outage (the server restarting, failing over): the unit goes back, nothing
    counted; only a session that ended while the database answered counts a crash."""
    from django.db import OperationalError

    item = Item.objects.create(kind="touch")
    (c,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    report: list[tuple] = []
    lost = OperationalError("terminating connection due to administrator command")
    began_on = object()  # not the connection open now: the unit's session is gone
    with _refused():
        child.contain(0, c, lost, began_on, 0.0, "default", report)
    assert [kind for _, kind, *_ in report] == ["db_error"], report
    report.clear()
    child.contain(0, c, lost, began_on, 0.0, "default", report)  # it answers again
    assert [kind for _, kind, *_ in report] == ["session_ended"], report
    assert Execution.objects.get(worker="touch", source_id=str(item.pk)).state == State.WORKING


@pytest.mark.processes
@pytest.mark.parametrize("kind", ["row", "task"])
def test_a_unit_that_ends_its_session_every_time_ends_failed_after_max_crashes(
        runworkers, kind):
    """A handler that ends its own session each time it runs (it kills its own
    connection) ran again without end: each loss was taken for the database's, and
    nothing was counted. Now each counts a crash (the supervisor's session lived through
    it), and ``MAX_CRASHES`` (3) ends it FAILED, naming the session; a unit beside it runs
    once."""
    from django_dbworker.models import TaskRecord, TaskStatus
    from tests.conftest import wait_for
    from tests.testapp import tasks

    if kind == "row":
        poison = Item.objects.create(kind="touch", action="drop_session_always")
        other = Item.objects.create(kind="touch")
        rw = runworkers("--worker", "touch", "--concurrency", "1")

        def ended() -> bool:
            return Execution.objects.filter(worker="touch", source_id=str(poison.pk),
                                            state=State.FAILED).exists()
    else:
        result = tasks.drop_session_always.enqueue()
        other = Item.objects.create(kind="touch")
        rw = runworkers("--queue", "default", "--worker", "touch", "--concurrency", "1")

        def ended() -> bool:
            return TaskRecord.objects.filter(pk=result.id, status=TaskStatus.FAILED).exists()
    wait_for(ended, timeout=60, what="the unit that ends its session to end FAILED")
    wait_for(lambda: Execution.objects.filter(worker="touch", source_id=str(other.pk),
                                              state=State.FINISHED).exists(),
             what="the unit beside it")
    out = rw.output()
    rw.stop()
    assert out.count("unit_session_ended") == 3, out[-3000:]
    # A loss counts only where the supervisor's own session lived through the child's
    # whole session: a child's first session may have begun before the supervisor's
    # (which it reopens after forking its children), so its loss may go uncounted once
    # (an outage as far as the supervisor can tell), never more.
    uncounted = out.count("every session ended")
    assert uncounted <= 1, out[-3000:]
    if kind == "row":
        execution = Execution.objects.get(worker="touch", source_id=str(poison.pk))
        assert (execution.attempts, execution.crashes) == (3 + uncounted, 3)
        (failure,) = execution.failures.all()
        message, exception_class = failure.message, failure.exception_class
    else:
        row = TaskRecord.objects.get(pk=result.id)
        # Each crash is in its errors, the third with the MAX_CRASHES verdict.
        assert (row.attempts, row.crashes, len(row.errors)) == (3 + uncounted, 3, 3), \
            row.errors
        message = row.errors[-1]["message"]
        exception_class = row.errors[-1]["exception_class_path"]
    assert exception_class.endswith("SessionEnded"), exception_class
    assert "database session" in message and "MAX_CRASHES" in message, message
    assert Effect.objects.filter(item_id=other.pk, worker="touch").count() == 1


@pytest.mark.processes
def test_a_handler_idle_past_the_session_timeout_fails_as_its_own_error(runworkers):
    """PostgreSQL ends a session idle in its transaction past
    ``idle_in_transaction_session_timeout`` with an error of its own (SQLSTATE 25P03,
    ``InternalError``) that the handler's next statement raises: the handler's failure,
    recorded as such (retries apply), not a lost session, nothing counted as a crash."""
    from tests.conftest import wait_for

    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's idle_in_transaction_session_timeout")
    item = Item.objects.create(kind="touch", action="idle_past_timeout")
    rw = runworkers("--worker", "touch", "--concurrency", "1")
    wait_for(lambda: Execution.objects.filter(worker="touch", source_id=str(item.pk),
                                              state=State.FAILED).exists(),
             what="the unit idle past the timeout to fail")
    rw.stop()
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert (execution.attempts, execution.crashes) == (1, 0)
    (failure,) = execution.failures.all()
    assert "idle-in-transaction timeout" in failure.message, failure.message
