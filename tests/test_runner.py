"""Handlers run in-process: outcomes, transactions, failures, fencing, deleted rows."""

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker import ExecutionStatus, execution_status, workers
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.rows import planner, store
from django_dbworker.rows.runner import run
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks.runner import run_task
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Effect, Item
from tests.testapp.tasks import add

pytestmark = pytest.mark.django_db(transaction=True)


def status(item, worker="touch"):
    return execution_status(worker=worker, source_id=item.pk)


def test_finished_commits_writes_with_status():
    item = Item.objects.create()
    assert run_until_idle(["touch"]) == {"finished": 1}
    assert status(item) == ExecutionStatus.FINISHED
    assert Effect.objects.filter(item_id=item.pk).count() == 1
    state = workers["touch"].state(item.pk)
    assert state["attempts"] == 1 and state["error"] is None
    assert state["claimed_host"] and state["claimed_pid"] is not None
    assert state["started_at"] <= state["finished_at"]


def test_finished_is_never_offered_again():
    item = Item.objects.create()
    run_until_idle(["touch"])
    item.save()  # saving again must not make it pending again
    assert run_until_idle(["touch"]) == {}
    assert Effect.objects.count() == 1


def test_exception_rolls_back_and_records_failure():
    item = Item.objects.create(action="raise")
    assert run_until_idle(["touch"]) == {"failed": 1}
    assert status(item) == ExecutionStatus.FAILED
    assert not Effect.objects.exists(), "the handler's write must be rolled back"
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "builtins.ValueError"
    assert error["message"] == f"item {item.pk} is broken"
    assert "Traceback" in error["traceback"] and "_act" in error["traceback"]
    assert error["attempt"] == 1
    assert run_until_idle(["touch"]) == {}, "FAILED is not offered again"


def test_reset_failed_runs_again_and_keeps_history():
    item = Item.objects.create(action="raise")
    run_until_idle(["touch"])
    assert workers["touch"].reset_failed(item.pk) is True
    assert status(item) == ExecutionStatus.UNFINISHED
    assert workers["touch"].reset_failed(item.pk) is False, "only FAILED executions reset"
    Item.objects.filter(pk=item.pk).update(action="ok")
    assert run_until_idle(["touch"]) == {"finished": 1}
    state = workers["touch"].state(item.pk)
    assert state["attempts"] == 2
    assert [e["attempt"] for e in state["errors"]] == [1]


def test_reset_failed_on_unknown_row_is_false():
    assert workers["touch"].reset_failed(999_999) is False


def test_wrong_return_type_fails_with_what_was_returned():
    item = Item.objects.create(action="return_str")
    run_until_idle(["touch"])
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "django_dbworker.exceptions.InvalidOutcome"
    assert "returned 'done' (str)" in error["message"]
    assert "Finished() or Unfinished()" in error["message"]
    assert not Effect.objects.exists()


def test_handler_that_commits_gets_a_clear_error():
    item = Item.objects.create(action="commit")
    run_until_idle(["touch"])
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "django_dbworker.exceptions.HandlerTransactionError"
    assert "transactional=False" in error["message"]
    assert not Effect.objects.exists()


def test_handler_that_closes_the_connection_gets_a_clear_error():
    item = Item.objects.create(action="close")
    run_until_idle(["touch"])
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "django_dbworker.exceptions.HandlerTransactionError"
    assert "closed the database connection" in error["message"]
    assert not Effect.objects.exists()


def test_handler_that_commits_through_a_cursor_is_detected():
    item = Item.objects.create(action="raw_commit")
    run_until_idle(["touch"])
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "django_dbworker.exceptions.HandlerTransactionError"
    assert "ended the transaction itself" in error["message"]


def test_base_exceptions_are_failures_too():
    item = Item.objects.create(action="exit")
    assert run_until_idle(["touch"]) == {"failed": 1}
    assert workers["touch"].state(item.pk)["error"]["exception_class"] == "builtins.SystemExit"


def test_unfinished_steps_until_finished():
    item = Item.objects.create(action="steps:3")
    assert run_until_idle(["touch"]) == {"unfinished": 2, "finished": 1}
    item.refresh_from_db()
    assert item.steps == 3
    assert workers["touch"].state(item.pk)["attempts"] == 3


def test_unfinished_delay_keeps_the_unit_back():
    item = Item.objects.create(action="wait")
    assert run_until_idle(["touch"]) == {"unfinished": 1}
    assert run_until_idle(["touch"]) == {}, "not claimable before its delay"
    state = workers["touch"].state(item.pk)
    assert state["execution_status"] == ExecutionStatus.UNFINISHED
    assert state["available_at"] > timezone.now() + timedelta(minutes=59)
    Execution.objects.filter(worker="touch").update(available_at=timezone.now())
    assert run_until_idle(["touch"]) == {"unfinished": 1}


def test_non_transactional_worker_keeps_its_own_writes_on_failure():
    item = Item.objects.create(kind="loose", action="raise")
    assert run_until_idle(["loose"]) == {"failed": 1}
    assert Effect.objects.filter(worker="loose").count() == 1
    assert status(item, "loose") == ExecutionStatus.FAILED


def test_context_carries_attempt_worker_and_lease():
    captured = {}
    w = workers["after_touch"]
    original = w.handler

    def spy(item, context):
        captured.update(worker=context.worker, attempt=context.attempt,
                        lease=context.lease_expires_at, source_id=context.source_id)
        return original(item, context)

    w.handler = spy
    try:
        item = Item.objects.create()
        run_until_idle(["touch", "after_touch"])
    finally:
        w.handler = original
    assert captured["worker"] == "after_touch"
    assert captured["attempt"] == 1
    assert captured["source_id"] == item.pk
    assert captured["lease"] > timezone.now()


def test_stale_claim_cannot_commit():
    """A process whose lease was reaped and taken over rolls back instead of committing."""
    item = Item.objects.create()
    old = planner.claim(workers["touch"], 1, Claimant(), lease=30)[0]
    Execution.objects.filter(pk=old.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    assert store.reap(max_crashes=3) == 1
    new = planner.claim(workers["touch"], 1, Claimant(), lease=30)[0]
    assert new.token != old.token
    result = run(old)
    assert result.outcome == "lease_lost"
    assert not Effect.objects.exists(), "the stale run's write was rolled back"
    assert run(new).outcome == "finished"
    assert Effect.objects.filter(item_id=item.pk).count() == 1


def test_expired_lease_cannot_commit_before_any_reap():
    """PostgreSQL: a lease that expired (its supervisor could not renew it) stops the commit
    though nobody took the unit over. SQLite checks the token only (``store.lease_live``)."""
    Item.objects.create()
    add.enqueue(1, 2)
    row = planner.claim(workers["touch"], 1, Claimant(), lease=30)[0]
    task = taskplanner.claim(None, 1, Claimant(), lease=30)[0]
    past = timezone.now() - timedelta(seconds=1)
    Execution.objects.filter(pk=row.execution_id).update(lease_expires_at=past)
    TaskRecord.objects.filter(pk=task.task_id).update(lease_expires_at=past)
    if connection.vendor == "sqlite":
        assert (run(row).outcome, run_task(task).outcome) == ("finished", "successful")
        return
    assert run(row).outcome == "lease_lost"
    assert run_task(task).outcome == "lease_lost"
    assert not Effect.objects.exists(), "the expired run's write was rolled back"
    assert Execution.objects.get(pk=row.execution_id).state == State.WORKING  # for a reaper
    assert TaskRecord.objects.get(pk=task.task_id).status == TaskStatus.RUNNING


def test_reaped_unit_counts_a_crash_and_fails_after_max():
    item = Item.objects.create()
    for crash in range(1, 4):
        planner.claim(workers["touch"], 1, Claimant(), lease=30)
        Execution.objects.filter(worker="touch").update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        assert store.reap(max_crashes=3) == 1
        assert Execution.objects.get(worker="touch").crashes == crash
    assert status(item) == ExecutionStatus.FAILED
    failure = Failure.objects.get()
    assert failure.exception_class == "django_dbworker.exceptions.LeaseLost"
    assert "MAX_CRASHES" in failure.message


def test_source_deleted_after_claim_removes_execution():
    item = Item.objects.create()
    c = planner.claim(workers["touch"], 1, Claimant(), lease=30)[0]
    Item.objects.filter(pk=item.pk).delete()  # queryset delete: signals still fire
    assert not Execution.objects.filter(worker="touch").exists()
    assert run(c).outcome == "gone"
    assert not Effect.objects.exists()


def test_handler_may_delete_its_own_source_row():
    item = Item.objects.create(action="delete_self")
    assert run_until_idle(["touch"]) == {"gone": 1}
    assert not Item.objects.filter(pk=item.pk).exists()
    assert not Execution.objects.filter(source_id=str(item.pk)).exists()
    assert Effect.objects.filter(item_id=item.pk).count() == 1, "its writes committed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("name", ["touch", "loose"])  # transactional, and not
def test_a_source_row_deleted_while_its_handler_runs_is_gone_not_a_lost_lease(
        name, vendor, caplog):
    """Another session deletes the row (through Django, so its execution goes with it)
    while the handler runs: the record changes nothing, which is no lost lease. Logged at
    INFO as ``gone``, counted apart; a transactional handler's writes are rolled back.
    SQLite: a transactional handler holds the write lock, so a delete waits for it; only
    the other kind can be deleted under it there."""
    if vendor == "sqlite" and name == "touch":
        pytest.skip("SQLite: a transactional handler's write lock holds the delete back")
    kind = "touch" if name == "touch" else "loose"
    item = Item.objects.create(kind=kind, action="deleted_meanwhile")
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        assert run_until_idle([name]) == {"gone": 1}
    lines = [r for r in caplog.records if r.getMessage().startswith(("gone", "lease_lost"))]
    assert [(r.levelno, r.getMessage().split()[0]) for r in lines] == [(logging.INFO, "gone")]
    assert "source row deleted while its handler ran" in lines[0].getMessage()
    assert not Item.objects.filter(pk=item.pk).exists()
    assert not Execution.objects.filter(source_id=str(item.pk)).exists()
    effects = Effect.objects.filter(item_id=item.pk, worker=name).count()
    assert effects == (0 if name == "touch" else 1)


def test_source_missing_at_claim_time_is_forgotten():
    item = Item.objects.create()
    c = planner.claim(workers["touch"], 1, Claimant(), lease=30)[0]
    with connection.cursor() as cursor:  # a delete that sends no signal
        cursor.execute("DELETE FROM testapp_item WHERE id = %s", [item.pk])
    assert run(c).outcome == "gone"
    assert not Execution.objects.filter(worker="touch").exists()


def test_pending_unit_has_no_status_and_is_invisible_to_filters():
    from django_dbworker import has_execution_status

    item = Item.objects.create()
    assert Execution.objects.get(worker="touch", source_id=str(item.pk)).state == State.PENDING
    assert status(item) is None
    assert workers["touch"].state(item.pk)["execution_status"] is None
    assert not Item.objects.filter(has_execution_status(worker="touch")).exists()
