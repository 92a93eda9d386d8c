"""A supervisor that knows a task with ``concurrency_limit`` claims the keyed way (more
statements: tasks/concurrency.py), but plain tasks need not pay for it: once a keyed claim
saw every waiting task and none had a key, its claims are plain, until new tasks that may
be keyed are announced (NOTIFY ``task``; keyless ones announce ``plain``) or POLL_INTERVAL
passed (supervisor/taskwork.py). Only where NOTIFY reaches the supervisor (PostgreSQL)."""

from __future__ import annotations

import time
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.utils import timezone

from django_dbworker import conf
from django_dbworker.db import notify
from django_dbworker.models import TaskRecord
from django_dbworker.supervisor import taskwork
from django_dbworker.supervisor.taskwork import TaskWork
from django_dbworker.units.claimant import Claimant
from tests.conftest import round_trips, wait_for
from tests.testapp import tasks
from tests.testapp.concurrency_tasks import conc_account

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def postgres(vendor):
    if vendor != "postgresql":
        pytest.skip("NOTIFY and libpq's protocol trace are PostgreSQL's")


def _work(listening: bool = True) -> TaskWork:
    work = TaskWork(None, conf.get(), Claimant(), schedule=False)
    assert work.keyed, "the concurrency tasks are imported: the supervisor knows keyed tasks"
    work.listening = listening
    work.limits = {}  # the testapp's rate-limited tasks would add the buckets' statements
    return work


def test_plain_tasks_are_claimed_plainly_once_no_keyed_task_waits(postgres, tmp_path):
    work = _work()
    tasks.add.enqueue(1, 2)
    claims, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert len(claims) == 1 and trips == 2, (claims, trips)  # keyed: read, then claim
    tasks.add.enqueue(3, 4)
    work.announced({notify.KEYLESS_TASKS})  # what the enqueue announced
    claims, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert len(claims) == 1 and trips == 1, (claims, trips)  # the plain claim


def test_an_announced_keyed_task_is_claimed_at_once(postgres, tmp_path):
    work = _work()
    assert work.claim(10) == []  # nothing waits: plain claims from now on
    conc_account.enqueue("a", 1)
    assert work.claim(10) == [], "a plain claim leaves keyed tasks alone"
    work.announced({notify.TASKS})  # what a keyed task's enqueue announces
    claims, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert [c.task_path for c in claims] == [conc_account.module_path], claims
    assert trips == 4  # candidates, its key's slot, the key's running count, the claim


def test_a_keyed_task_nobody_announced_waits_at_most_poll_interval(postgres, monkeypatch):
    clock = [1000.0]  # the supervisor's monotonic clock, moved by the test alone
    monkeypatch.setattr(taskwork, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    work = _work()
    soon = timezone.now() + timedelta(seconds=0.2)
    conc_account.using(run_after=soon).enqueue("a", 1)  # ready later: no announcement then
    assert work.claim(10) == []  # read before it is ready: plain claims from now on
    wait_for(lambda: timezone.now() > soon + timedelta(seconds=0.05), what="the task ready")
    clock[0] += conf.get().POLL_INTERVAL * 0.9
    assert work.claim(10) == [], "plain claims leave a keyed task alone within the window"
    clock[0] += conf.get().POLL_INTERVAL * 0.2
    claims = work.claim(10)  # POLL_INTERVAL passed: a keyed claim again
    assert [c.task_path for c in claims] == [conc_account.module_path]


def test_more_waiting_than_read_keeps_claims_keyed(postgres, tmp_path):
    """A keyed claim reads a page of candidates: when it is full, a keyed task may wait
    behind it, so the next claim is keyed too."""
    work = _work()
    tasks.add.enqueue_many([((n, n), {}) for n in range(40)])
    assert len(work.claim(1)) == 1  # its page (32) was full
    _, trips = round_trips(lambda: work.claim(1), tmp_path)
    assert trips == 2, "still keyed"


def test_without_notify_every_claim_is_keyed(postgres, tmp_path):
    work = _work(listening=False)
    assert work.claim(10) == []
    tasks.add.enqueue(1, 2)
    claims, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert len(claims) == 1 and trips == 2, (claims, trips)


def test_keyed_tasks_are_announced_as_tasks_that_may_be_keyed(postgres):
    from django.db import connection

    from django_dbworker.db import engine_for

    heard = engine_for(connection).listen(connection, notify.CHANNEL)
    try:
        conc_account.enqueue("a", 1)
        tasks.add.enqueue(1, 2)
        found: set[str] = set()
        deadline = time.monotonic() + 60
        while found != {notify.TASKS, notify.KEYLESS_TASKS} and time.monotonic() < deadline:
            found |= heard.received()
            time.sleep(0.01)
        assert found == {notify.TASKS, notify.KEYLESS_TASKS}
    finally:
        heard.close()
    assert TaskRecord.objects.count() == 2


def test_a_pause_or_resume_makes_the_next_claim_keyed(postgres, tmp_path):
    """A resumed queue may hold keyed tasks nobody announced."""
    from django_dbworker.pausing import ANNOUNCEMENT

    work = _work()
    assert work.claim(10) == []
    _, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert trips == 1, "plain"
    work.announced({ANNOUNCEMENT})
    _, trips = round_trips(lambda: work.claim(10), tmp_path)
    assert trips == 2, "keyed again"


def test_a_claim_queue_by_queue_decides_once_for_every_queue(postgres):
    """Beside a paused queue's backlog the claim goes queue by queue: the first queue's
    clean page must not make the next queue's claim plain within the same round."""
    work = _work()
    tasks.add.enqueue(1, 2)  # default, first in claim order
    conc_account.using(queue_name="emails").enqueue("a", 1)
    tasks.add.using(queue_name="slow").enqueue(3, 4)
    claims = work.claim(10, frozenset({"slow"}), backlog=True)
    assert sorted(c.task_path for c in claims) == sorted(
        [tasks.add.module_path, conc_account.module_path]), claims


@pytest.mark.processes
def test_a_running_supervisor_takes_announced_keyed_tasks_at_once(postgres, runworkers):
    """A real runworkers that knows keyed tasks, with a POLL_INTERVAL of 10 minutes: plain
    tasks put it in its plain window, yet every keyed task enqueued then starts (its
    enqueue announces a task that may be keyed), not a poll later (the waits are far
    shorter than the poll: no wall-clock bound needed)."""
    from django_dbworker.models import Supervisor, TaskStatus
    from tests.conftest import wait_for

    rw = runworkers("--queue", "default", extra_env={
        "DBWORKER_TEST_CONCURRENCY": "1", "DBWORKER_TEST_POLL": "600"})
    wait_for(lambda: Supervisor.objects.filter(pid=rw.pid).exists(), timeout=60,
             what="the supervisor up")

    def done(pk) -> bool:
        return TaskRecord.objects.get(pk=pk).status == TaskStatus.SUCCESSFUL

    for n in range(5):
        plain = tasks.add.enqueue(n, n).id
        wait_for(lambda pk=plain: done(pk), timeout=120, what="the plain task done")
        time.sleep(0.2)  # inside the plain window the plain task opened
        keyed = conc_account.enqueue("a", n).id
        wait_for(lambda pk=keyed: done(pk), timeout=120,
                 what="the keyed task done (a poll is 10 minutes away)")
    assert rw.process.poll() is None, rw.output()[-2000:]
