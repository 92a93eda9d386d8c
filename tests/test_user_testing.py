"""The test helpers our users get (issue 21): the pytest plugin's fixtures (loaded through
the package's entry point, as in a user's project), ``DBWorkerTestMixin`` for
``django.test.TestCase``, and a clock that run_after, retries and cron follow."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import TestCase
from django.utils import timezone

from django_dbworker.models import StoredSchedule, TaskRecord, TaskStatus
from django_dbworker.testing import DBWorkerTestMixin
from tests.testapp import tasks

ROOT = Path(__file__).resolve().parent.parent


def test_enqueued_records_every_call_and_asserts_by_arguments(db, enqueued):
    tasks.add.enqueue(1, 2)
    tasks.add.using(priority=5).enqueue(3, b=4)
    tasks.send_email.enqueue("a@example.com")
    assert enqueued.calls(tasks.add) == [([1, 2], {}), ([3], {"b": 4})]
    result = enqueued.assert_enqueued(tasks.add, 3, b=4)
    assert result.task.priority == 5
    enqueued.assert_enqueued(tasks.send_email, "a@example.com")
    with pytest.raises(AssertionError, match=r"add was not enqueued with args=\[9\].*2 time"):
        enqueued.assert_enqueued(tasks.add, 9)
    enqueued.assert_not_enqueued(tasks.tick)
    with pytest.raises(AssertionError, match="send_email was enqueued 1 time"):
        enqueued.assert_not_enqueued(tasks.send_email)
    enqueued.clear()
    assert enqueued.results == []


def test_dbworker_run_runs_the_tasks_in_process(dbworker_run):
    result = tasks.add.enqueue(2, 3)
    assert dbworker_run()["successful"] == 1
    result.refresh()
    assert result.return_value == 5


def test_the_clock_moves_run_after_and_retry_delays(dbworker_run, dbworker_clock):
    start = dbworker_clock.now()
    later = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    retried = tasks.slow_retry.enqueue()  # fails, retried after an hour
    assert dbworker_run() == {"retrying": 1}
    dbworker_clock.advance(timedelta(minutes=59))
    assert dbworker_run() == {}
    assert dbworker_clock.advance(60) == start + timedelta(hours=1)
    assert dbworker_run() == {"successful": 1, "failed": 1}
    assert TaskRecord.objects.get(pk=later.id).status == TaskStatus.SUCCESSFUL
    assert TaskRecord.objects.get(pk=retried.id).attempts == 2
    with pytest.raises(ValueError, match="give 0 or more seconds"):
        dbworker_clock.advance(-1)


def test_cron_ticks_follow_the_clock(db, dbworker_clock, enqueued):
    from django_dbworker.testing import Schedules

    StoredSchedule.objects.create(name="hourly", task_path="tests.testapp.tasks.add",
                                  cron="0 * * * *", args=[1, 2])
    schedules = Schedules()
    dbworker_clock.advance(timedelta(hours=3))
    assert schedules.tick() == 3  # the three hours' ticks, as a supervisor would have
    assert schedules.tick() == 0  # once per tick
    assert enqueued.calls(tasks.add) == [([1, 2], {})] * 3


class MixinTests(DBWorkerTestMixin, TestCase):
    def test_capture_assert_and_run(self):
        with self.captureEnqueued() as enqueued:
            result = tasks.add.enqueue(4, 5)
        self.assertEnqueued(tasks.add, 4, 5)
        self.assertNotEnqueued(tasks.send_email)
        assert len(enqueued.results) == 1
        assert self.runUntilIdle()["successful"] == 1
        result.refresh()
        assert result.return_value == 9

    def test_assert_without_a_capture_says_what_to_do(self):
        with pytest.raises(AssertionError, match="with self.captureEnqueued"):
            self.assertEnqueued(tasks.add, 1, 2)

    def test_freeze_time(self):
        with self.freezeTime() as clock:
            tasks.add.using(run_after=timedelta(minutes=5)).enqueue(1, 1)
            assert self.runUntilIdle() == {}
            clock.advance(300)
            assert self.runUntilIdle() == {"successful": 1}
            assert timezone.now() == clock.now()


def test_the_plugin_loads_from_the_entry_point_in_a_project_without_a_conftest(tmp_path):
    """A user's test file uses the fixtures by name, nothing else: the installed package's
    pytest11 entry point provides them."""
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        from tests.testapp import tasks

        def test_uses_our_fixtures(enqueued, dbworker_run, dbworker_clock):
            tasks.add.enqueue(1, 2)
            enqueued.assert_enqueued(tasks.add, 1, 2)
            assert dbworker_run()["successful"] == 1
    """))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
         "--ds=tests.settings", "--rootdir", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=180,
        env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
