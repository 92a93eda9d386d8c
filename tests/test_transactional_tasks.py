"""``@task(transactional=True)``: a task's database writes commit with its SUCCESSFUL
record, fenced by its claim, so they happen exactly once (issue 21)."""

from __future__ import annotations

import signal

import pytest
from django.db import connection

from django_dbworker.djtasks import InvalidTask
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def effects(name: str) -> int:
    return Effect.objects.filter(worker=name).count()


def test_the_writes_commit_with_success_and_roll_back_with_a_raise():
    ok = tasks.effect_once.enqueue(1)
    bad = tasks.effect_then_raise.enqueue(2)
    assert run_until_idle() == {"successful": 1, "failed": 1}
    assert TaskRecord.objects.get(pk=ok.id).status == TaskStatus.SUCCESSFUL
    assert effects("effect_once") == 1
    assert TaskRecord.objects.get(pk=bad.id).status == TaskStatus.FAILED
    assert effects("effect_then_raise") == 0


@pytest.mark.skipif(connection.vendor == "sqlite",
                    reason="SQLite: the task's transaction holds the write lock, so no other "
                           "connection can take the claim over while it runs")
def test_a_task_whose_claim_was_taken_over_cannot_commit_its_writes():
    result = tasks.effect_then_stolen.enqueue(3)
    assert run_until_idle() == {"lease_lost": 1}
    assert effects("effect_then_stolen") == 0
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.RUNNING


def test_transactional_must_be_a_bool():
    with pytest.raises(InvalidTask, match="transactional='yes' must be True or False"):
        tasks.add.__class__(func=tasks.add.func, transactional="yes")


@pytest.mark.processes
@pytest.mark.parametrize(("task", "name", "expected"), [
    ("effect_once", "effect_once", 1),    # exactly once
    ("effect_plain", "effect_plain", 2),  # at least once: the killed attempt's write stays
])
def test_a_child_killed_mid_task(runworkers, task, name, expected):
    """kill -9 of the child while the first attempt sleeps after writing: the task runs
    again; its write is there once with transactional=True, twice without."""
    result = getattr(tasks, task).enqueue(4, sleep_first=60)
    p = runworkers("--queue", "default", "--concurrency", "1")
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.RUNNING
             and p.children(), what="the first attempt to run")
    if expected == 2:
        wait_for(lambda: effects(name) == 1, what="the plain task's write")
    else:
        import time

        time.sleep(1.0)  # it has written (uncommitted) and sleeps
        assert effects(name) == 0  # nobody sees an uncommitted write
    for child in p.children():
        import os

        os.kill(child, signal.SIGKILL)
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL,
             timeout=60, what="the second attempt")
    assert effects(name) == expected
    assert TaskRecord.objects.get(pk=result.id).attempts == 2
