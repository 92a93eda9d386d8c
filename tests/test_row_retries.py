"""``@worker(retries=..., retry_delay=..., retry_backoff=..., retry_jitter=...,
retry_for=...)``: a failing row handler is retried like a task (issue 21)."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker import ExecutionStatus, Finished, worker, workers
from django_dbworker.exceptions import InvalidWorker
from django_dbworker.models import Execution, Failure
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db


def execution(item: Item) -> Execution:
    return Execution.objects.get(worker=item.kind, source_id=str(item.pk))


def test_a_failing_handler_is_retried_until_it_succeeds_each_error_kept():
    item = Item.objects.create(kind="retried", action="fail:2")
    assert run_until_idle(["retried"]) == {"retrying": 2, "finished": 1}
    e = execution(item)
    assert e.status == ExecutionStatus.FINISHED and e.attempts == 3
    assert [f.message for f in e.failures.order_by("attempt")] == ["attempt 1", "attempt 2"]
    # A transactional handler's writes roll back with each failed attempt: only the last
    # attempt's are kept.
    assert list(Effect.objects.filter(worker="retried").values_list("note", flat=True)) == [
        "3"]


def test_retries_run_out_and_the_unit_fails_with_every_attempts_error():
    item = Item.objects.create(kind="retried", action="fail:9")
    assert run_until_idle(["retried"]) == {"retrying": 2, "failed": 1}
    e = execution(item)
    assert e.status == ExecutionStatus.FAILED and e.attempts == 3
    assert Failure.objects.filter(execution=e).count() == 3


def test_an_exception_outside_retry_for_fails_at_once():
    item = Item.objects.create(kind="retried", action="type")
    assert run_until_idle(["retried"]) == {"failed": 1}
    assert execution(item).attempts == 1


def test_the_unit_waits_unfinished_for_its_retry_delay():
    item = Item.objects.create(kind="retry_later")
    before = timezone.now()
    assert run_until_idle(["retry_later"]) == {"retrying": 1}
    e = execution(item)
    assert e.status == ExecutionStatus.UNFINISHED and e.token is None
    assert before + timedelta(seconds=3590) < e.available_at < timezone.now() + timedelta(
        seconds=3610)
    assert run_until_idle(["retry_later"]) == {}  # not before its time


def test_no_retry_by_default():
    assert workers["touch"].retries == 0


@pytest.mark.parametrize(("options", "message"), [
    ({"retries": -1}, "retries=-1 must be an integer >= 0"),
    ({"retries": True}, "retries=True must be an integer"),
    ({"retry_delay": float("nan")}, "retry_delay=nan must be a number of seconds"),
    ({"retry_backoff_factor": 0.5}, "retry_backoff_factor=0.5 must be a finite number"),
    ({"retry_jitter": 2}, "retry_jitter=2 must be True/False or a fraction"),
    ({"retry_for": ("ValueError",)}, "retry_for=('ValueError',) must be a tuple of exception"),
])
def test_a_bad_retry_option_is_refused_by_name(options, message):
    with pytest.raises(InvalidWorker, match=rf"@worker 'bad_retry' .*{re.escape(message)}"):
        worker(source=Item, name="bad_retry", **options)(lambda item: Finished())
    assert "bad_retry" not in workers


def test_one_exception_class_alone_is_taken_as_retry_for():
    w = worker(source=Item, name="one_class", retry_for=KeyError, retries=1,
               eligible=Item.objects.none())(lambda item: Finished())
    try:
        assert w.retry_for == (KeyError,)
    finally:
        workers.remove("one_class")


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_runworkers_retries_a_row_in_its_children(runworkers):
    item = Item.objects.create(kind="retried", action="fail:1")
    p = runworkers("--worker", "retried", "--burst", "--concurrency", "1")
    assert p.wait() == 0, p.output()
    e = execution(item)
    assert e.status == ExecutionStatus.FINISHED and e.attempts == 2
    assert "retrying worker=retried" in p.output()


# ----- @worker(timeout=...) ---------------------------------------------------------------------


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_handler_past_its_timeout_is_stopped_and_the_attempt_fails(runworkers):
    """Its child is killed and replaced, the attempt fails with HandlerTimeout (retried
    here: the worker retries TimeoutError once), the other units go on."""
    again = Item.objects.create(kind="timed", action="sleep_first:30")
    never = Item.objects.create(kind="timed", action="sleep:30")
    quick = Item.objects.create(kind="timed", action="ok")
    p = runworkers("--worker", "timed", "--burst", "--concurrency", "1")
    assert p.wait(90) == 0, p.output()
    assert execution(again).status == ExecutionStatus.FINISHED
    assert execution(again).attempts == 2
    failed = execution(never)
    assert failed.status == ExecutionStatus.FAILED and failed.attempts == 2
    errors = list(failed.failures.order_by("attempt"))
    assert [f.exception_class for f in errors] == [
        "django_dbworker.exceptions.HandlerTimeout"] * 2
    assert "ran longer than its timeout of 1s and its process was stopped" in errors[0].message
    assert execution(quick).status == ExecutionStatus.FINISHED
    assert p.output().count("timed_out worker=timed") == 3


@pytest.mark.parametrize(("timeout", "message"), [
    (0, "timeout=0 would stop every attempt"),
    (-1, "timeout=-1 must be a number of seconds"),
    (float("inf"), "timeout=inf must be a number of seconds"),
])
def test_a_bad_timeout_is_refused_by_name(timeout, message):
    with pytest.raises(InvalidWorker, match=re.escape(message)):
        worker(source=Item, name="bad_timeout", timeout=timeout)(lambda item: Finished())
