"""``result.get(timeout)`` / ``await result.aget(timeout)``: the caller waits for a task a
real runworkers runs, and gets its value or its error (issue 21)."""

from __future__ import annotations

import asyncio
import time

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from django_dbworker import cancel
from django_dbworker.djtasks import TaskResultDoesNotExist
from django_dbworker.exceptions import ResultTimeout, TaskFailed
from django_dbworker.models import TaskRecord
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def run_async(coroutine):
    """asyncio.run, then close what the ORM opened in sync_to_async's thread (in a real
    async view that thread is the request's, and Django closes it at the end)."""

    async def then_close():
        try:
            return await coroutine
        finally:
            await sync_to_async(connections.close_all)()

    return asyncio.run(then_close())


@pytest.mark.processes
def test_get_waits_for_the_value_and_raises_the_tasks_error(runworkers):
    runworkers("--queue", "default", "--concurrency", "1")
    ok = tasks.add.enqueue(20, 22)
    assert ok.get(timeout=60) == 42
    assert ok.status == "SUCCESSFUL" and ok.return_value == 42  # refreshed too
    bad = tasks.always_fails.enqueue()
    with pytest.raises(TaskFailed, match=r"always_fails .* ended FAILED: "
                                         r"builtins.ValueError: always") as caught:
        bad.get(timeout=60)
    assert caught.value.exception_class_path == "builtins.ValueError"
    assert caught.value.message == "always" and caught.value.status == "FAILED"
    assert "Traceback" in caught.value.traceback
    assert run_async(tasks.add.enqueue(1, 2).aget(timeout=60)) == 3


def test_a_cancelled_task_raises_naming_the_cancel():
    waiting = tasks.add.enqueue(1, 1)
    cancel(waiting.id)
    with pytest.raises(TaskFailed, match="ended CANCELLED: django_dbworker.exceptions."
                                         "TaskCancelled") as caught:
        waiting.get(timeout=5)
    assert caught.value.status == "CANCELLED"


def test_a_task_that_does_not_end_in_time_raises_a_timeout_and_goes_on():
    waiting = tasks.add.enqueue(1, 1)  # nobody runs it
    started = time.monotonic()
    with pytest.raises(ResultTimeout, match=r"had not ended after 0.3 s \(it is READY\)"):
        waiting.get(timeout=0.3)
    assert time.monotonic() - started >= 0.3, "not before its timeout"
    assert isinstance(ResultTimeout("x"), TimeoutError)
    with pytest.raises(ResultTimeout):
        run_async(waiting.aget(timeout=0.1))
    assert TaskRecord.objects.get(pk=waiting.id).status == "READY"


def test_a_task_deleted_while_waited_for_says_so():
    waiting = tasks.add.enqueue(1, 1)
    TaskRecord.objects.filter(pk=waiting.id).delete()
    with pytest.raises(TaskResultDoesNotExist, match="no longer exists while waiting"):
        waiting.get(timeout=1)


@pytest.mark.parametrize("bad", [-1, float("nan"), "10"])
def test_a_bad_timeout_is_refused(bad):
    with pytest.raises(ValueError, match="give None .* or 0 or more seconds"):
        tasks.add.enqueue(1, 1).get(timeout=bad)
