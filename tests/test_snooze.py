"""Snooze: a task says "not now, run me again in N seconds" without using an attempt, up to
``max_snoozes`` times; a row handler's ``Snooze`` is its ``Unfinished(delay=...)``."""

import json
import math
import uuid
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

import django_dbworker
from django_dbworker import Finished, Snooze, worker, workers
from django_dbworker.conf import MAX_DELAY
from django_dbworker.djtasks import InvalidTask, TaskResultStatus, task_finished, task_started
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.outcomes import RunOutcome
from django_dbworker.rows.store import lease_live
from django_dbworker.supervisor.progress import Progress
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import snooze
from django_dbworker.tasks import store as taskstore
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)

LIMIT = "django_dbworker.exceptions.SnoozeLimitExceeded"


def row(result):
    return TaskRecord.objects.get(pk=result.id)


def claim_one():
    (c,) = taskplanner.claim(None, 1, Claimant(), 30)
    return c


# ----- a snooze uses no attempt --------------------------------------------------------------

def test_a_snooze_uses_no_attempt_and_moves_available_at():
    result = tasks.snooze_then_succeed.enqueue(times=1, delay=30)
    before = timezone.now()
    assert run_until_idle() == {"snoozed": 1}
    after = timezone.now()
    task = row(result)
    assert task.status == TaskStatus.READY
    assert before + timedelta(seconds=30) <= task.available_at <= after + timedelta(seconds=30)
    assert (task.attempts, task.snoozes, task.crashes) == (0, 1, 0)
    assert task.errors == [] and task.worker_ids == []
    assert task.token is None and task.lease_expires_at is None
    assert task.started_at is not None and task.finished_at is None
    assert (task.progress, task.progress_message) == (10, "waiting"), "progress is kept"
    result.refresh()
    assert result.status == TaskResultStatus.READY and result.attempts == 0
    assert result.snoozes == 1 and result.dbworker_status == TaskStatus.READY
    assert run_until_idle() == {}, "not claimed before its delay"

    TaskRecord.objects.filter(pk=result.id).update(available_at=timezone.now())
    assert run_until_idle() == {"successful": 1}
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"attempt": 1, "snoozes": 1}
    assert result.attempts == 1 and len(result.worker_ids) == 1 and result.snoozes == 1
    assert row(result).attempts == 1


def test_snoozes_then_success_is_one_attempt():
    result = tasks.snooze_then_succeed.enqueue(times=3)
    assert run_until_idle() == {"snoozed": 3, "successful": 1}
    task = row(result)
    assert task.status == TaskStatus.SUCCESSFUL
    assert (task.attempts, task.snoozes, task.crashes, task.errors) == (1, 3, 0, [])
    assert task.return_value == {"attempt": 1, "snoozes": 3}
    assert list(Effect.objects.filter(worker="snooze_then_succeed")
                .values_list("item_id", flat=True)) == [0, 1, 2, 3]


def test_a_snooze_is_no_finish_no_callback_no_finished_signal():
    seen = []

    def on_started(sender, task_result, **kwargs):
        seen.append(("started", task_result.status))

    def on_finished(sender, task_result, **kwargs):
        seen.append(("finished", task_result.status))

    task_started.connect(on_started)
    task_finished.connect(on_finished)
    try:
        tasks.snooze_forever.enqueue(3600)
        assert run_until_idle() == {"snoozed": 1}
    finally:
        task_started.disconnect(on_started)
        task_finished.disconnect(on_finished)
    assert seen == [("started", TaskResultStatus.RUNNING)]
    assert not Effect.objects.filter(worker="on_failure").exists()


def test_a_snooze_delay_may_be_a_timedelta():
    assert Snooze(timedelta(minutes=5)).seconds == 300
    assert Snooze(0).seconds == 0 and Snooze(2.5).seconds == 2.5
    tasks.add.enqueue(1, 2)
    c = claim_one()
    before = timezone.now()
    assert snooze.record(c, Snooze(timedelta(minutes=5)).seconds) == 1
    waits = TaskRecord.objects.get(pk=c.task_id).available_at - before
    assert timedelta(minutes=5) <= waits < timedelta(minutes=5, seconds=5)


# ----- the bound --------------------------------------------------------------------------

def test_beyond_max_snoozes_a_snooze_is_a_failed_attempt_and_retries_apply():
    """max_snoozes=2, retries=1: two snoozes; the third is a failed attempt (retried); the
    retry snoozes again and fails for good."""
    result = tasks.snooze_forever.enqueue()
    assert run_until_idle() == {"snoozed": 2, "retrying": 1, "failed": 1}
    task = row(result)
    assert task.status == TaskStatus.FAILED
    assert (task.attempts, task.snoozes) == (2, 2)
    assert [e["exception_class_path"] for e in task.errors] == [LIMIT, LIMIT]
    assert [e["attempt"] for e in task.errors] == [1, 2]
    message = task.errors[0]["message"]
    assert "'tests.testapp.tasks.snooze_forever'" in message
    assert "after 2 snoozes" in message and "max_snoozes (2)" in message
    assert "Raise max_snoozes" in message and "stop snoozing" in message
    assert "Snooze(delay)" in task.errors[0]["traceback"], "where it snoozed"
    assert list(Effect.objects.filter(worker="on_failure").values_list("note", flat=True)) \
        == ["SnoozeLimitExceeded"]


def test_max_snoozes_zero_makes_every_snooze_a_failure_filtered_by_retry_for():
    result = tasks.snooze_never_allowed.enqueue()
    assert run_until_idle() == {"failed": 1}, "not a TimeoutError: not retried"
    task = row(result)
    assert (task.status, task.attempts, task.snoozes) == (TaskStatus.FAILED, 1, 0)
    assert "after 0 snoozes, its max_snoozes (0)" in task.errors[0]["message"]


@pytest.mark.parametrize(("value", "shown"), [
    (-1, "-1"), (True, "True"), ("3", "'3'"), (1.5, "1.5"), (None, "None"),
    (10**10, "10000000000"),
])
def test_bad_max_snoozes_fail_at_decoration(value, shown):
    from django_dbworker.djtasks import task

    def f():
        pass

    f.__module__ = "tests.testapp.tasks"
    f.__qualname__ = f.__name__ = "f"
    with pytest.raises(InvalidTask, match=rf"'f': max_snoozes={shown} must be an integer "
                                          r"from 0 \(.*\) to 1000000000\."):
        task(max_snoozes=value)(f)
    assert task(max_snoozes=0)(f).max_snoozes == 0


# ----- bad input ----------------------------------------------------------------------------

@pytest.mark.parametrize(("delay", "error", "message"), [
    (-1, ValueError, r"Snooze\(-1\): delay must be a finite number of seconds >= 0\."),
    (math.nan, ValueError, r"Snooze\(nan\): delay must be a finite number"),
    (math.inf, ValueError, r"Snooze\(inf\): delay must be a finite number"),
    (timedelta(seconds=-1), ValueError, r"Snooze\(datetime.timedelta\(days=-1, .*finite"),
    (MAX_DELAY + 1, ValueError, r"delay must be at most 3.1536e\+08 seconds \(ten years\)"),
    (timedelta.max, ValueError, r"delay must be at most 3.1536e\+08 seconds"),
    ("30", TypeError, r"Snooze\('30'\): delay must be a number of seconds or a timedelta\."),
    (True, TypeError, r"Snooze\(True\): delay must be a number of seconds or a timedelta"),
    (None, TypeError, r"Snooze\(None\): delay must be a number of seconds or a timedelta"),
])
def test_a_bad_snooze_is_refused_where_it_is_built(delay, error, message):
    with pytest.raises(error, match=message):
        Snooze(delay)


def test_a_bad_snooze_in_a_task_fails_that_attempt_with_its_message():
    result = tasks.snooze_bad.enqueue(-5)
    assert run_until_idle() == {"retrying": 1, "failed": 1}
    task = row(result)
    assert (task.status, task.attempts, task.snoozes) == (TaskStatus.FAILED, 2, 0)
    assert task.errors[0]["exception_class_path"] == "builtins.ValueError"
    assert task.errors[0]["message"] == ("Snooze(-5): delay must be a finite number of "
                                         "seconds >= 0.")
    other = tasks.snooze_bad.enqueue({"seconds": MAX_DELAY * 2})
    run_until_idle()
    assert "delay must be at most" in row(other).errors[0]["message"]
    assert row(other).snoozes == 0


# ----- fencing and cancellation ---------------------------------------------------------------

def test_a_stale_claim_cannot_snooze():
    result = tasks.add.enqueue(1, 2)
    stale = claim_one()
    assert taskstore.release(stale, crashed=None, max_crashes=3) == 1
    current = claim_one()
    assert current.token != stale.token
    assert snooze.record(stale, 60) == 0
    assert not snooze.cancel_requested(stale)
    task = row(result)
    assert (task.status, task.snoozes, task.token) == (TaskStatus.RUNNING, 0, current.token)
    forged = type(current)(current.task_id, current.task_path, uuid.uuid4(), current.attempt,
                           current.lease_expires_at, current.claimed_at)
    assert snooze.record(forged, 60) == 0
    assert snooze.record(current, 60) == 1
    assert snooze.record(current, 60) == 0, "a claim snoozes once"
    task = row(result)
    assert (task.status, task.snoozes, task.attempts) == (TaskStatus.READY, 1, 1)


def test_a_claim_whose_lease_expired_cannot_snooze():
    result = tasks.add.enqueue(1, 2)
    c = claim_one()
    TaskRecord.objects.filter(pk=c.task_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    changed = snooze.record(c, 60)
    using = django_dbworker.conf.get().DATABASE
    assert changed == (0 if lease_live(using) else 1)  # SQLite checks only the token
    assert row(result).status == (TaskStatus.RUNNING if lease_live(using) else TaskStatus.READY)


def test_a_snoozed_task_can_be_cancelled():
    result = tasks.snooze_then_succeed.enqueue(times=5, delay=3600)
    assert run_until_idle() == {"snoozed": 1}
    assert django_dbworker.cancel(result.id) is True
    task = row(result)
    assert task.status == TaskStatus.CANCELLED and task.snoozes == 1
    assert [e["exception_class_path"] for e in task.errors] == [
        "django_dbworker.exceptions.TaskCancelled"]
    TaskRecord.objects.filter(pk=result.id).update(available_at=timezone.now())
    assert run_until_idle() == {}


def test_a_task_asked_to_cancel_while_running_that_snoozes_is_cancelled():
    result = tasks.snooze_then_succeed.enqueue(times=5)
    c = claim_one()
    assert django_dbworker.cancel(result.id) is True  # running: asks its supervisor
    assert c.run().outcome == RunOutcome.FAILED
    task = row(result)
    assert task.status == TaskStatus.CANCELLED and task.snoozes == 0
    assert "it snoozed, so it stops" in task.errors[-1]["message"]


def test_the_snooze_transition():
    assert taskstore.TRANSITIONS["snooze"] == {TaskStatus.RUNNING}
    assert taskstore.TRANSITIONS["snooze"].to == {TaskStatus.READY}


# ----- what people see ---------------------------------------------------------------------

def test_the_cli_admin_and_progress_line_show_snoozes(admin_client):
    result = tasks.snooze_then_succeed.enqueue(times=5, delay=3600)
    run_until_idle()
    out = StringIO()
    call_command("dbworker", "inspect", str(result.id), "--json", stdout=out)
    (doc,) = json.loads(out.getvalue())["units"]
    assert (doc["attempts"], doc["snoozes"]) == (0, 1)
    out = StringIO()
    call_command("dbworker", "inspect", str(result.id), stdout=out)
    assert "  snoozes: 1" in out.getvalue()
    listing = admin_client.get(reverse("admin:django_dbworker_taskrecord_changelist"))
    assert "0 (+1 snoozed)" in listing.content.decode()
    detail = admin_client.get(reverse("admin:django_dbworker_taskrecord_change",
                                      args=[result.id]))
    assert "Snoozes" in detail.content.decode()
    progress = Progress(None)
    for outcome in ("snoozed", "successful", "snoozed"):
        progress.add(outcome)
    assert progress.line().startswith("3 units: successful 1, snoozed 2 |")


def test_a_failed_tasks_snoozes_are_shown_beside_its_attempts():
    tasks.snooze_forever.enqueue()
    run_until_idle()
    out = StringIO()
    call_command("dbworker", "dead", stdout=out)
    assert "2 (+2 snoozed)" in out.getvalue()


# ----- rows: Snooze is Unfinished(delay=...) ----------------------------------------------------

@pytest.fixture
def snoozing_rows():
    def handler(item):
        Effect.objects.create(item_id=item.pk, worker="snooze_rows")
        if item.action == "snooze":
            raise Snooze(timedelta(hours=1))
        return Finished()

    handler.__module__ = "tests.testapp.workers"
    worker(name="snooze_rows", source=Item,
           eligible=Item.objects.filter(kind="snooze"))(handler)
    try:
        yield workers["snooze_rows"]
    finally:
        workers.remove("snooze_rows")


def test_snooze_in_a_row_handler_is_unfinished_with_that_delay(snoozing_rows):
    item = Item.objects.create(kind="snooze", action="snooze")
    before = timezone.now()
    assert run_until_idle(["snooze_rows"]) == {"unfinished": 1}
    execution = Execution.objects.get(worker="snooze_rows", source_id=str(item.pk))
    assert execution.state == State.UNFINISHED
    assert execution.available_at >= before + timedelta(hours=1)
    assert execution.attempts == 1, "as Unfinished: the attempt is counted (rows have no bound)"
    assert not Failure.objects.filter(execution=execution).exists()
    assert not Effect.objects.filter(worker="snooze_rows").exists(), "its writes rolled back"
    Item.objects.filter(pk=item.pk).update(action="ok")
    Execution.objects.filter(pk=execution.pk).update(available_at=timezone.now())
    assert run_until_idle(["snooze_rows"]) == {"finished": 1}
    assert Effect.objects.filter(worker="snooze_rows").count() == 1


# ----- a real runworkers ----------------------------------------------------------------------

@pytest.mark.processes
def test_runworkers_runs_a_task_that_snoozes_twice_as_one_attempt(runworkers):
    result = tasks.snooze_then_succeed.enqueue(times=2)
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default")
    assert p.wait(120) == 0, p.output()
    task = row(result)
    assert task.status == TaskStatus.SUCCESSFUL, p.output()
    assert (task.attempts, task.snoozes, task.crashes, task.errors) == (1, 2, 0, [])
    assert task.return_value == {"attempt": 1, "snoozes": 2}
    assert len(task.worker_ids) == 1
    assert "3 units: successful 1, snoozed 2 |" in p.output(), p.output()
