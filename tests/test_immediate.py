"""Tests that run without a queue (issue 21): the immediate mode of our backend
(``OPTIONS: {"IMMEDIATE": True}``: each enqueue runs its tasks in the caller, with our
semantics), and ``django_dbworker.task`` under Django's own ``ImmediateBackend`` and
``DummyBackend`` (a module declaring ``@task(retries=5)`` imports there)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.test import override_settings

import django_dbworker
from django_dbworker.djtasks import (
    FRAMEWORK,
    InvalidTask,
    TaskResultStatus,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from django_dbworker.workflows import chain, group
from tests.testapp import tasks
from tests.testapp.models import Effect

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.django_db(transaction=True)


def now(task):
    """The task on the immediate backend."""
    return task.using(backend="immediate")


# ----- immediate mode -------------------------------------------------------------------


def test_enqueue_runs_the_task_and_returns_its_end():
    seen = []

    def on(name):
        return lambda sender, task_result, **kw: seen.append((name, task_result.status))

    handlers = {s: on(n) for s, n in [(task_enqueued, "enqueued"), (task_started, "started"),
                                      (task_finished, "finished")]}
    for signal, handler in handlers.items():
        signal.connect(handler)
    try:
        result = now(tasks.add).enqueue(2, 3)
    finally:
        for signal, handler in handlers.items():
            signal.disconnect(handler)
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 5 and result.attempts == 1
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskStatus.SUCCESSFUL and row.finished_at is not None
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    assert task_backends["immediate"].get_result(result.id).return_value == 5


def test_retries_run_at_once_and_keep_every_error():
    result = now(tasks.flaky).enqueue(succeed_on=3)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.TimeoutError"] * 2
    # A retry delay of an hour is not waited either: the caller gets the task's end.
    slow = now(tasks.slow_retry).enqueue()
    assert slow.status == TaskResultStatus.FAILED and slow.attempts == 2


def test_a_task_that_fails_for_good_is_failed_with_its_callback():
    result = now(tasks.always_fails).enqueue()
    assert result.status == TaskResultStatus.FAILED and len(result.errors) == 3
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert Effect.objects.filter(worker="on_failure", note="ValueError").count() == 1
    wrong = now(tasks.wrong_exception).enqueue()  # not in retry_for: one attempt
    assert wrong.status == TaskResultStatus.FAILED and wrong.attempts == 1


def test_a_transactional_task_that_raises_leaves_no_write():
    result = now(tasks.effect_then_raise).enqueue(7)
    assert result.status == TaskResultStatus.FAILED
    assert not Effect.objects.filter(item_id=7).exists()
    done = now(tasks.effect_once).enqueue(8)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert Effect.objects.filter(item_id=8, worker="effect_once").count() == 1


def test_a_ctrl_c_goes_up_to_the_caller_and_the_tasks_go_back(caplog):
    """As Django's ImmediateBackend (its test_throws_keyboard_interrupt): a
    KeyboardInterrupt is the user's, not the task's failure: no FAILED record, no ERROR
    line, no retry; the task is READY again for runworkers, its attempt taken back, and
    so is every task of the enqueue that had not run."""
    with caplog.at_level("DEBUG"), pytest.raises(KeyboardInterrupt, match="Ctrl-C"):
        now(tasks.interrupted).enqueue_many([((), {}), ((), {})])
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
    rows = TaskRecord.objects.filter(task_path=tasks.interrupted.module_path)
    assert [(r.status, r.attempts, r.token, r.errors) for r in rows] == [
        (TaskStatus.READY, 0, None, [])] * 2
    with pytest.raises(KeyboardInterrupt):  # a transactional one: its writes roll back
        now(tasks.interrupted_in_transaction).enqueue(9)
    assert not Effect.objects.filter(item_id=9).exists()
    row = TaskRecord.objects.get(task_path=tasks.interrupted_in_transaction.module_path)
    assert (row.status, row.attempts, row.errors) == (TaskStatus.READY, 0, [])


def test_a_ctrl_c_in_run_until_idle_goes_up_too():
    tasks.interrupted.enqueue_many([((), {}), ((), {})])
    with pytest.raises(KeyboardInterrupt):
        run_until_idle()
    assert {(r.status, r.attempts) for r in TaskRecord.objects.all()} == {
        (TaskStatus.READY, 0)}


def test_enqueue_many_runs_every_call_in_order():
    results = now(tasks.add).enqueue_many([((i, i), {}) for i in range(5)])
    assert [r.status for r in results] == [TaskResultStatus.SUCCESSFUL] * 5
    assert [r.return_value for r in results] == [0, 2, 4, 6, 8]


def test_an_async_task_runs_too():
    assert now(tasks.async_add).enqueue(4, 5).return_value == 9


def test_only_the_callers_tasks_run():
    """A backlog of other tasks (enqueued for runworkers) is not run by an immediate
    enqueue; neither is a task whose run_after has not come."""
    queued = tasks.add.enqueue(1, 1)  # the default backend: stored for runworkers
    later = now(tasks.add).using(run_after=timedelta(hours=1)).enqueue(2, 2)
    assert later.status == TaskResultStatus.READY
    now(tasks.add).enqueue(3, 3)
    assert TaskRecord.objects.get(pk=queued.id).status == TaskStatus.READY
    assert TaskRecord.objects.get(pk=later.id).status == TaskStatus.READY
    assert run_until_idle() == {"successful": 1}  # the backlog; run_after still waits


def test_dependents_run_when_their_dependency_ends_in_the_caller():
    first = now(tasks.add).enqueue(1, 2)
    second = now(tasks.join_effect).using(after=[first]).enqueue(1)
    assert second.status == TaskResultStatus.SUCCESSFUL
    assert second.return_value == [3]  # its dependency's result, through the edge


def test_a_workflow_runs_whole_with_its_callback():
    handle = chain(now(tasks.add).step(1, 1),
                   group(now(tasks.join_effect).step(10), now(tasks.join_effect).step(11)),
                   now(tasks.join_effect).step(12)).enqueue(
        name="immediate", on_complete=now(tasks.wf_callback).step(label="done"))
    statuses = set(TaskRecord.objects.filter(workflow_id=handle.id)
                   .values_list("status", flat=True))
    assert statuses == {TaskStatus.SUCCESSFUL}
    assert sorted(Effect.objects.filter(worker="join").values_list("item_id", flat=True)) \
        == [10, 11, 12]
    assert Effect.objects.get(worker="wf_callback").note == str(handle.id)


def test_enqueue_on_commit_runs_when_the_transaction_commits():
    with transaction.atomic():
        result = now(tasks.add).using(enqueue_on_commit=True).enqueue(4, 4)
        assert result.status == TaskResultStatus.READY
        assert not TaskRecord.objects.filter(pk=result.id).exists()
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL
    with transaction.atomic():
        rolled = now(tasks.add).using(enqueue_on_commit=True).enqueue(5, 5)
        transaction.set_rollback(True)
    assert not TaskRecord.objects.filter(pk=rolled.id).exists()


def test_an_idempotency_key_held_returns_the_ended_holder():
    first = now(tasks.add).using(idempotency_key="im-1").enqueue(1, 2)
    again = now(tasks.add).using(idempotency_key="im-1").enqueue(1, 2)
    assert again.id == first.id and again.status == TaskResultStatus.SUCCESSFUL
    assert TaskRecord.objects.filter(idempotency_key="im-1").count() == 1


@pytest.mark.django_db(transaction=False)
def test_inside_a_test_transaction_the_task_runs_in_a_savepoint():
    """A plain ``TestCase``/``db`` test: the run is part of the test's transaction."""
    assert now(tasks.add).enqueue(6, 6).return_value == 12
    assert now(tasks.effect_then_raise).enqueue(9).status == TaskResultStatus.FAILED
    assert not Effect.objects.filter(item_id=9).exists()
    assert now(tasks.add).enqueue(1, 0).return_value == 1  # the transaction still works


# ----- our @task under Django's own backends ---------------------------------------------


def portable(a, b):
    return a + b


def backend_path(name):
    """Django's own backend ``name`` (the backport's on Django 5.2)."""
    return f"{FRAMEWORK}.backends.{name}.{name.title()}Backend"


@pytest.mark.parametrize("backend", ["immediate", "dummy"])
def test_our_task_options_under_djangos_own_backends(backend, monkeypatch):
    path = backend_path(backend)
    with override_settings(TASKS={"default": {"BACKEND": path}}):
        declared = django_dbworker.task(retries=5, retry_delay=2, unique_key="x",
                                        concurrency_limit=2)(portable)
        assert declared.retries == 5 and declared.get_backend().alias == "default"
        # As in a user's module, the name is the task (DummyBackend copies it by path).
        monkeypatch.setattr(sys.modules[__name__], "portable", declared)
        result = declared.using(priority=3).enqueue(1, 2)
        if backend == "immediate":
            assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
        else:
            assert result.status == TaskResultStatus.READY
            assert task_backends["default"].results == [result]
        results = declared.enqueue_many([((1, 1), {}), ((2, 2), {})])
        assert len(results) == 2
        # Without options, the backend's own Task class, as Django makes it.
        assert type(django_dbworker.task(declared.func)).__name__ == "Task"
        # Options are checked under any backend: a mistake shows before production.
        with pytest.raises(InvalidTask, match="retries"):
            django_dbworker.task(retries=-1)(declared.func)


def test_a_module_with_our_options_imports_under_djangos_immediate_backend(tmp_path):
    """A user's project: its tasks module (``@task(retries=5, ...)``) is imported by
    ``django.setup()`` under test settings that use Django's ImmediateBackend."""
    (tmp_path / "userapp").mkdir()
    (tmp_path / "userapp" / "__init__.py").write_text("")
    (tmp_path / "userapp" / "tasks.py").write_text(textwrap.dedent("""
        from django_dbworker import task

        @task(retries=5, retry_backoff=True, rate_limit="10/s", timeout=30)
        def double(n):
            return 2 * n
    """))
    (tmp_path / "usersettings.py").write_text(textwrap.dedent("""
        SECRET_KEY = "x"
        USE_TZ = True
        INSTALLED_APPS = ["django_dbworker", "userapp"]
        DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3",
                                 "NAME": ":memory:"}}
        TASKS = {"default": {"BACKEND": PATH}}
    """).replace("PATH", repr(backend_path("immediate"))))
    script = textwrap.dedent("""
        import django
        django.setup()
        from userapp.tasks import double
        result = double.enqueue(21)
        print(result.status, result.return_value)
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}",
             "DJANGO_SETTINGS_MODULE": "usersettings"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["SUCCESSFUL", "42"]


# ----- flow control in immediate mode ------------------------------------------------------


def test_unique_keyed_and_rate_limited_tasks_run_too():
    from tests.testapp import concurrency_tasks

    unique = now(tasks.unique_report).enqueue("monday")
    assert unique.status == TaskResultStatus.SUCCESSFUL and unique.return_value == "monday"
    keyed = now(tasks.unique_and_limited).enqueue("acme", 1)
    assert keyed.status == TaskResultStatus.SUCCESSFUL and keyed.return_value == 1
    results = now(concurrency_tasks.conc_single).enqueue_many([((n,), {}) for n in range(3)])
    assert [r.return_value for r in results] == [0, 1, 2]
    limited = now(tasks.limited).enqueue_many([((n,), {}) for n in range(5)])
    assert [r.status for r in limited] == [TaskResultStatus.SUCCESSFUL] * 5  # no rate wait


def test_a_snoozing_task_stays_stored_until_its_time():
    result = now(tasks.snooze_then_succeed).enqueue(1, delay=3600)
    assert result.status == TaskResultStatus.READY  # snoozed: Django sees READY
    assert TaskRecord.objects.get(pk=result.id).snoozes == 1


def test_aenqueue_runs_it_too():
    from tests.test_result_wait import run_async

    result = run_async(now(tasks.add).aenqueue(20, 22))
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 42


def test_a_task_retried_without_end_stops_at_the_cap(monkeypatch):
    from django_dbworker.tasks import immediate

    monkeypatch.setattr(immediate, "MAX_ATTEMPTS", 2)
    with pytest.raises(RuntimeError, match="immediate mode ran 2 attempts"):
        now(tasks.always_fails).enqueue()  # three attempts: the third is refused
    row = TaskRecord.objects.get(task_path=tasks.always_fails.module_path)
    assert row.attempts == 2 and row.status == TaskStatus.READY  # given back: stored, not lost
