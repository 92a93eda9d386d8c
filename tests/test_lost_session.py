"""A unit whose database session the server ends while its handler runs goes back to be
run again: the lost session is not the unit's fault, so it is never recorded FAILED (the
chaos soak caught a row that was, on PostgreSQL: a child whose connection had been closed
after an earlier lost session started the next unit with none, and leaving the handler's
``atomic()`` made Django open a new one at once, which answered, so the child took the
error for the unit's own)."""

from __future__ import annotations

import pytest
from django.db import connection

from django_dbworker import workers
from django_dbworker.models import Execution, State
from django_dbworker.rows import store
from django_dbworker.rows.store import Claimant
from django_dbworker.supervisor import child
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _server_sessions():
    if connection.vendor == "sqlite":
        pytest.skip("SQLite has no server session to lose")


@pytest.mark.parametrize("opened", [True, False], ids=["connection-open", "none-open"])
def test_a_session_ended_mid_handler_gives_the_unit_back(opened):
    item = Item.objects.create(kind="touch", action="drop_session_first")
    (c,) = store.claim(workers["touch"], 1, Claimant(), 30)
    if not opened:  # as after a previous unit's lost session: the child closed it
        connection.close()
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == ["db_error"], report
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.WORKING, (execution.state, execution.failures.all())
    assert not Effect.objects.filter(item_id=item.pk).exists()  # rolled back with it

    # Given back (as the supervisor does on a db_error report), it runs again and finishes.
    store.release(c, crashed=None, max_crashes=3)
    run_until_idle(["touch"])
    execution.refresh_from_db()
    assert execution.state == State.FINISHED
    assert Effect.objects.filter(item_id=item.pk, worker="touch").count() == 1


@pytest.mark.parametrize("opened", [True, False], ids=["connection-open", "none-open"])
def test_a_task_whose_session_ends_in_its_own_atomic_goes_back_unfailed(opened):
    from tests.testapp import tasks

    _task_goes_back_unfailed(tasks.drop_session_in_atomic, "drop_session_in_atomic",
                             opened=opened)


def _task_goes_back_unfailed(declared, effect_worker: str, *, opened: bool = True) -> None:
    """Run one task of ``declared`` as a child does: reported as a database error, still
    RUNNING with no error recorded (the supervisor gives it back), its writes rolled back."""
    from django_dbworker.models import TaskRecord, TaskStatus
    from django_dbworker.tasks import store as taskstore

    result = declared.enqueue()
    (c,) = taskstore.claim(None, 1, Claimant(), 30)
    if not opened:
        connection.close()
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == ["db_error"], report
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
    (c,) = store.claim(workers["touch"], 1, Claimant(), 30)
    report: list[tuple] = []
    child.run_one(0, c, "default", report)

    assert [kind for _, kind, *_ in report] == ["db_error"], report
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.WORKING, (execution.state, execution.failures.all())
    assert not Effect.objects.filter(item_id=item.pk).exists()
    store.release(c, crashed=None, max_crashes=3)
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
    _task_goes_back_unfailed(declared, "protocol_confused_in_atomic")
