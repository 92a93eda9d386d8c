"""``result.forget()`` deletes a task's row before retention would (issue 21)."""

from __future__ import annotations

import pytest

from django_dbworker.djtasks import TaskResultDoesNotExist
from django_dbworker.exceptions import CannotForget
from django_dbworker.models import (
    DependencyState,
    TaskDependency,
    TaskRecord,
    TaskStatus,
    TaskUniqueness,
)
from django_dbworker.testing import run_until_idle
from tests.testapp import tasks

pytestmark = pytest.mark.django_db


def test_forget_an_ended_task_deletes_its_row_and_result():
    result = tasks.add.enqueue(1, 2)
    run_until_idle()
    assert result.forget() is True
    assert not TaskRecord.objects.filter(pk=result.id).exists()
    with pytest.raises(TaskResultDoesNotExist):
        tasks.add.get_result(result.id)
    assert result.forget() is False  # already gone


def test_a_waiting_task_is_deleted_before_it_runs():
    result = tasks.add.enqueue(1, 2)
    assert result.forget() is True
    assert run_until_idle() == {}


def test_a_running_task_is_refused_naming_what_to_do():
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(status=TaskStatus.RUNNING)
    with pytest.raises(CannotForget, match=r"is RUNNING: forgetting it would not stop it. "
                                           r"Cancel it"):
        result.forget()
    assert TaskRecord.objects.filter(pk=result.id).exists()


def test_a_task_others_wait_for_is_refused():
    result = tasks.add.enqueue(1, 2)
    other = tasks.add.enqueue(3, 4)
    TaskDependency.objects.create(dependent_id=other.id, dependency_id=result.id,
                                  state=DependencyState.WAITING)
    with pytest.raises(CannotForget, match="has 1 task.s. waiting for it"):
        result.forget()
    assert other.forget() is True  # its own edges go with it
    assert not TaskDependency.objects.exists()


def test_its_uniqueness_key_goes_with_it_so_the_next_enqueue_is_new():
    result = tasks.unique_report.enqueue("monday")
    assert TaskUniqueness.objects.filter(task_id=result.id).exists()
    assert result.forget() is True
    assert not TaskUniqueness.objects.filter(task_id=result.id).exists()
    assert tasks.unique_report.enqueue("tuesday").id != result.id
