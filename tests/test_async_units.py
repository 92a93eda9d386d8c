"""Async units run beside each other in a child (``units/aio.py``), with real
runworkers processes: the gain, the bound, failures and retries, timeouts, progress,
graceful stop, and the rule for transactional row handlers (one at a time, in their
transaction)."""

import os
import signal

import pytest

import django_dbworker
from django_dbworker import ExecutionStatus, execution_status
from django_dbworker.djtasks import TaskResultStatus, default_task_backend
from django_dbworker.models import Supervisor, TaskRecord, TaskStatus
from django_dbworker.rows.registry import workers
from tests.conftest import wait_for
from tests.testapp import async_units
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

ASYNC = {"DBWORKER_TEST_ASYNC": "1"}


def bound(n):
    return {**ASYNC, "DBWORKER_TEST_ASYNC_CONCURRENCY": str(n)}


@pytest.fixture
def async_workers():
    names = async_units.register_workers()
    yield names
    for name in names:
        workers.remove(name)


def status_of(task_id):
    return TaskRecord.objects.get(pk=task_id).status


def results(enqueued):
    return [default_task_backend.get_result(r.id) for r in enqueued]


def test_async_tasks_wait_together_in_one_child(runworkers):
    """20 tasks that each await 0.5 s in one child: ten at once (ASYNC_CONCURRENCY), as the
    peak each saw says, not one at a time."""
    enqueued = async_units.nap.enqueue_many([((0.5, i), {}) for i in range(20)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    done = results(enqueued)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    peaks = [r.return_value["peak"] for r in done]
    assert max(peaks) == 10, f"at most ASYNC_CONCURRENCY=10 at once, and that many: {peaks}"
    assert len({r.return_value["pid"] for r in done}) == 1
    assert Effect.objects.filter(worker="nap").count() == 20


def test_async_concurrency_one_runs_them_one_at_a_time(runworkers):
    enqueued = async_units.nap.enqueue_many([((0.2, i), {}) for i in range(4)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(1))
    assert p.wait(120) == 0, p.output()
    assert [r.return_value["peak"] for r in results(enqueued)] == [1, 1, 1, 1]


def test_the_bound_is_respected(runworkers):
    enqueued = async_units.nap.enqueue_many([((0.3, i), {}) for i in range(12)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(3))
    assert p.wait(120) == 0, p.output()
    assert max(r.return_value["peak"] for r in results(enqueued)) == 3


def test_sync_tasks_run_alone_beside_async_ones(runworkers):
    """A plain task waits until no async unit runs in its child, and runs alone."""
    mixed = [async_units.nap.enqueue(0.3, "a1"), async_units.nap.enqueue(0.3, "a2"),
             async_units.sync_nap.enqueue(0.3, "s"), async_units.nap.enqueue(0.3, "a3")]
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    done = results(mixed)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    # the process-wide peak when the plain one ended: the two before it ran together
    assert done[2].return_value["peak"] == 2


def test_async_failures_are_retried_and_recorded(runworkers):
    ok = async_units.async_flaky.enqueue(succeed_on=2)
    dead = async_units.async_flaky.enqueue(succeed_on=5)
    naps = async_units.nap.enqueue_many([((0.2, i), {}) for i in range(5)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    good = default_task_backend.get_result(ok.id)
    assert good.status == TaskResultStatus.SUCCESSFUL and good.return_value == 2
    assert good.attempts == 2 and len(good.errors) == 1
    bad = default_task_backend.get_result(dead.id)
    assert bad.status == TaskResultStatus.FAILED and bad.attempts == 3
    assert "attempt 3 failed" in bad.errors[-1].traceback
    assert {r.status for r in results(naps)} == {TaskResultStatus.SUCCESSFUL}


def test_a_timeout_cancels_one_async_task_not_its_neighbours(runworkers):
    hang = async_units.async_hang.enqueue(30)
    naps = async_units.nap.enqueue_many([((2.0, i), {}) for i in range(5)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    record = TaskRecord.objects.get(pk=hang.id)
    assert record.status == TaskStatus.FAILED
    error = default_task_backend.get_result(hang.id).errors[-1]
    assert error.exception_class_path == "django_dbworker.exceptions.TaskTimeout"
    assert "timeout of 1s and was cancelled" in error.traceback
    done = results(naps)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    assert len({r.return_value["pid"] for r in done}) == 1, "no child was replaced"
    assert "timed_out" not in p.output(), "the supervisor stopped a child"


def test_progress_from_an_async_task(runworkers):
    result = async_units.async_progress.enqueue()
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    record = TaskRecord.objects.get(pk=result.id)
    assert record.status == TaskStatus.SUCCESSFUL
    assert (record.progress, record.progress_message) == (50, "half way")


def test_sigterm_lets_running_async_tasks_finish(runworkers):
    naps = async_units.nap.enqueue_many([((3.0, "mark"), {}) for i in range(5)])
    p = runworkers("--concurrency", "1", "--queue", "default", extra_env=bound(10),
                   lease=1.5)  # a heartbeat every 0.5 s
    wait_for(lambda: Effect.objects.filter(worker="nap_started").count() == 5,
             timeout=60, what="five async tasks running at once")
    wait_for(lambda: len((Supervisor.objects.filter(pid=p.pid).first() or Supervisor())
                         .running or []) == 5,
             timeout=30, what="the heartbeat naming the five units the child runs")
    p.signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.output()
    assert {r.status for r in results(naps)} == {TaskResultStatus.SUCCESSFUL}


def test_async_row_handlers_run_together_unless_transactional(runworkers, async_workers):
    loose = Item.objects.bulk_create([Item(kind="async_loose") for _ in range(8)])
    boom = Item.objects.create(kind="async_loose", action="boom")
    tx = Item.objects.bulk_create([Item(kind="async_tx") for _ in range(3)])
    tx_boom = Item.objects.create(kind="async_tx", action="boom")
    p = runworkers("--burst", "--concurrency", "1", "--worker", "async_loose",
                   "--worker", "async_tx", extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    for item in loose + tx:
        assert execution_status(worker=item.kind, source_id=item.pk) == \
            ExecutionStatus.FINISHED
    assert execution_status(worker="async_loose", source_id=boom.pk) == \
        ExecutionStatus.FAILED
    peaks = [int(n) for n in Effect.objects.filter(worker="async_loose")
             .values_list("note", flat=True)]
    assert max(peaks) >= 4, f"the non-transactional handlers ran together: {peaks}"
    # transactional: one at a time, and a raise rolls back the writes it made
    assert set(Effect.objects.filter(worker="async_tx").values_list("item_id", flat=True)) \
        == {i.pk for i in tx}
    assert execution_status(worker="async_tx", source_id=tx_boom.pk) == \
        ExecutionStatus.FAILED


def test_a_child_killed_releases_every_async_unit_it_ran(runworkers):
    naps = async_units.nap.enqueue_many([((3.0, "mark"), {}) for i in range(5)])
    p = runworkers("--concurrency", "1", "--queue", "default", extra_env=bound(10))
    wait_for(lambda: Effect.objects.filter(worker="nap_started").count() == 5,
             timeout=60, what="five async tasks running at once")
    (child,) = p.children()
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: TaskRecord.objects.filter(pk__in=[r.id for r in naps],
                                               status=TaskStatus.SUCCESSFUL).count() == 5,
             timeout=60, what="the five tasks run again in a new child")
    assert set(TaskRecord.objects.filter(pk__in=[r.id for r in naps])
               .values_list("attempts", flat=True)) == {2}
    assert p.output().count("child_died") == 5, p.output()
    p.signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.output()


def test_an_async_task_blocking_its_loop_past_its_timeout_has_its_child_stopped(runworkers):
    """It cannot be cancelled on its loop: the supervisor stops its child STOP_GRACE
    seconds after its timeout; what ran beside it goes back and runs again."""
    block = async_units.async_block.enqueue(3600)  # a burst that ends: it was stopped
    beside = async_units.nap.enqueue(0.5, "beside")
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    error = default_task_backend.get_result(block.id).errors[-1]
    assert error.exception_class_path == "django_dbworker.exceptions.TaskTimeout"
    assert "timed_out" in p.output() and "reason=\"stopped with the unit beside it\"" \
        in p.output(), p.output()
    assert default_task_backend.get_result(beside.id).status == TaskResultStatus.SUCCESSFUL


def test_a_cancel_stops_one_running_async_task_not_its_neighbours(runworkers):
    target = async_units.nap.enqueue(30, "mark")
    naps = async_units.nap.enqueue_many([((3.0, "mark"), {}) for i in range(3)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    wait_for(lambda: Effect.objects.filter(worker="nap_started").count() == 4,
             timeout=60, what="four async tasks running at once")
    assert django_dbworker.cancel(target.id)
    wait_for(lambda: TaskRecord.objects.get(pk=target.id).status == TaskStatus.CANCELLED,
             timeout=10, what="the cancelled task stopped within seconds")
    assert p.wait(120) == 0, p.output()
    done = results(naps)
    assert {r.status for r in done} == {TaskResultStatus.SUCCESSFUL}
    assert set(TaskRecord.objects.filter(pk__in=[r.id for r in naps])
               .values_list("attempts", flat=True)) == {1}, "nothing beside it ran again"
    assert "cut_off" not in p.output() and "timed_out" not in p.output(), p.output()


@pytest.mark.parametrize("value", [0, 1.5, True, 5000, "10"])
def test_a_bad_async_concurrency_is_refused_naming_it(value):
    from django.core.exceptions import ImproperlyConfigured
    from django.test import override_settings

    from django_dbworker import conf

    with override_settings(DBWORKER={"ASYNC_CONCURRENCY": value}), \
            pytest.raises(ImproperlyConfigured,
                          match=rf"ASYNC_CONCURRENCY'\] is {value!r}; it must be an integer "
                                r">= 1 and <= 1000"):
        conf.load()


@pytest.mark.django_db
def test_async_handlers_and_tasks_run_in_process_with_run_until_idle(async_workers):
    """``run_until_idle`` (no child, no loop of ours): each coroutine runs to completion;
    a transactional handler's async ORM writes are in its transaction."""
    from django_dbworker.testing import run_until_idle

    loose = Item.objects.create(kind="async_loose")
    tx = Item.objects.create(kind="async_tx")
    tx_boom = Item.objects.create(kind="async_tx", action="boom")
    result = async_units.async_flaky.enqueue(succeed_on=1)
    counts = run_until_idle(async_workers, tasks=True)
    assert counts["finished"] == 2 and counts["failed"] == 1, counts
    assert execution_status(worker="async_loose", source_id=loose.pk) == \
        ExecutionStatus.FINISHED
    assert list(Effect.objects.filter(worker="async_tx").values_list("item_id", flat=True)) \
        == [tx.pk], "the raising handler's write rolled back"
    assert execution_status(worker="async_tx", source_id=tx_boom.pk) == ExecutionStatus.FAILED
    assert default_task_backend.get_result(result.id).return_value == 1


def test_async_orm_calls_reconnect_after_the_server_ended_their_session(runworkers):
    """The thread where async code's ORM calls run keeps its connection between units: one
    that the server ended is closed before the next unit's coroutine (``aio._heal``), so
    the next call reconnects instead of failing for ever."""
    from tests.test_chaos import _terminator

    terminate = _terminator()
    if terminate is None:
        pytest.skip("SQLite: no server session to end")
    first = async_units.async_orm.enqueue(1)
    p = runworkers("--concurrency", "1", "--queue", "default", extra_env=bound(10))
    wait_for(lambda: status_of(first.id) == TaskStatus.SUCCESSFUL, timeout=60,
             what="the first task")
    assert terminate() > 0
    later = async_units.async_orm.enqueue_many([((n,), {}) for n in range(2, 6)])
    ids = [r.id for r in later]
    wait_for(lambda: TaskRecord.objects.filter(pk__in=ids).exclude(
        status__in=[TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.RETRYING]).count() == 4,
        timeout=60, what="the later tasks ended")
    assert {status_of(i) for i in ids} == {TaskStatus.SUCCESSFUL}, p.output()
    p.signal(signal.SIGTERM)
    assert p.wait(60) == 0, p.output()
    # A claim that met the ended session is an outage (reconnect at once), not a broken
    # source left alone for 30 s.
    assert "claim_failed" not in p.output(), p.output()


def test_the_loop_and_its_threads_start_with_the_first_async_unit(runworkers):
    before = async_units.thread_names.enqueue()
    nap = async_units.nap.enqueue(0.1)
    after = async_units.thread_names.enqueue()
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    first, last = (default_task_backend.get_result(r.id).return_value for r in (before, after))
    assert default_task_backend.get_result(nap.id).status == TaskResultStatus.SUCCESSFUL
    assert "dbworker-loop" not in first and "dbworker-async" not in first, first
    assert "dbworker-loop" in last and "dbworker-async" in last, last


def test_past_the_grace_period_every_running_async_unit_goes_back(runworkers):
    naps = async_units.nap.enqueue_many([((60, "mark"), {}) for i in range(4)])
    p = runworkers("--concurrency", "1", "--queue", "default", "--grace-period", "1",
                   extra_env=bound(10))
    wait_for(lambda: Effect.objects.filter(worker="nap_started").count() == 4,
             timeout=60, what="four async tasks running at once")
    p.signal(signal.SIGTERM)
    p.wait(60)
    assert p.output().count("cut_off") == 4, p.output()
    assert {status_of(r.id) for r in naps} == {TaskStatus.READY}, "released, to run again"


def test_an_async_task_snoozes_beside_others(runworkers):
    snoozer = async_units.async_snoozer.enqueue("k")
    naps = async_units.nap.enqueue_many([((0.3, i), {}) for i in range(3)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                   extra_env=bound(10))
    assert p.wait(120) == 0, p.output()
    result = default_task_backend.get_result(snoozer.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == "awake"
    assert result.attempts == 1, "a snooze uses no attempt"
    assert {r.status for r in results(naps)} == {TaskResultStatus.SUCCESSFUL}


@pytest.fixture
def loop():
    import asyncio
    import threading

    running = asyncio.new_event_loop()
    threading.Thread(target=running.run_forever, daemon=True).start()
    yield running
    running.call_soon_threadsafe(running.stop)


def test_on_the_loop_a_timeout_a_cancel_and_the_coroutines_own_timeout_error(loop):
    """``aio._on_loop``, without a child: what a unit's thread gets back."""
    import asyncio

    from django_dbworker.exceptions import HandlerTimeout, TaskCancelled, TaskTimeout
    from django_dbworker.units import aio

    async def value(v, wait=0.0):
        await asyncio.sleep(wait)
        return v

    async def own_timeout():
        raise TimeoutError("the coroutine's own")

    assert aio._on_loop(aio.Binding(loop, 5, "task"), value(3)) == 3
    with pytest.raises(TaskTimeout, match="timeout of 0.05s and was cancelled"):
        aio._on_loop(aio.Binding(loop, 0.05, "task"), value(3, wait=5))
    with pytest.raises(HandlerTimeout, match="the handler ran longer"):
        aio._on_loop(aio.Binding(loop, 0.05, "handler"), value(3, wait=5))
    with pytest.raises(TimeoutError, match="the coroutine's own") as raised:
        aio._on_loop(aio.Binding(loop, 5, "task"), own_timeout())
    assert type(raised.value) is TimeoutError
    # a cancel asked for before its coroutine began (it was reading its row)
    early = value(3, wait=5)
    with pytest.raises(TaskCancelled) as cancelled:
        aio._on_loop(aio.Binding(loop, None, "task", 7, {}, {7}), early)
    assert aio.is_cancel(cancelled.value)
    early.close()
