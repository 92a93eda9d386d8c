"""What a supervisor claims from (``supervisor/sources.py``): each row worker and the task
queues answer the same two questions, so the supervisor never asks which it holds."""

from __future__ import annotations

from collections import Counter

import pytest

from django_dbworker import conf, pause
from django_dbworker.db import notify
from django_dbworker.rows.registry import workers
from django_dbworker.rows.unit import RowUnit
from django_dbworker.supervisor.sources import TASK_SOURCE, RowSource, TaskSource
from django_dbworker.supervisor.supervisor import Options, Supervisor
from django_dbworker.tasks.unit import TaskUnit
from tests.testapp import tasks
from tests.testapp.models import Item


@pytest.fixture
def supervisor(transactional_db: None):
    sup = Supervisor(Options(workers=[workers["touch"]], tasks=True, concurrency=1),
                     conf.get(), None)
    yield sup
    sup._wake_r.close()
    sup._wake_w.close()


def test_each_worker_then_the_task_queues_are_sources(supervisor):
    row, task = supervisor.sources
    assert isinstance(row, RowSource) and isinstance(task, TaskSource)
    assert (row.name, row.key) == ("touch", "touch")
    assert (task.name, task.key) == ("tasks", TASK_SOURCE)


def test_an_announcement_names_the_sources_it_concerns(supervisor):
    row, task = supervisor.sources
    assert row.announced({"rows"}) and row.announced({"touch"})
    assert not row.announced({"loose"}) and not row.announced({notify.TASKS})
    assert task.announced({notify.TASKS}) and task.announced({notify.KEYLESS_TASKS})
    assert not task.announced({"rows", "touch"})


def test_each_source_claims_its_own_units(supervisor):
    Item.objects.create()
    tasks.add.enqueue(1, 2)
    row, task = supervisor.sources
    (r,) = row.claim(10, Counter())
    (t,) = task.claim(10, Counter())
    assert isinstance(r, RowUnit) and r.worker == "touch"
    assert isinstance(t, TaskUnit) and t.task_path == "tests.testapp.tasks.add"
    assert row.claim(10, Counter()) == [] and task.claim(10, Counter()) == []


def test_a_paused_worker_gives_nothing(supervisor):
    Item.objects.create()
    pause(worker="touch")
    supervisor.pauses.refresh(0.0, announced=True)
    row, _ = supervisor.sources
    assert row.claim(10, Counter()) == []
