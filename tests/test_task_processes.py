"""Tasks run by real runworkers processes: retries, timeouts, cancellation, rate limits,
cron across supervisors, idempotency under concurrent enqueues."""

import os
import signal
import subprocess
import sys
import time
from datetime import datetime

import pytest
from django.db import connection

import django_dbworker
from django_dbworker.djtasks import TaskResultStatus, default_task_backend
from django_dbworker.models import TaskRecord, TaskStatus
from tests.conftest import ROOT, wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes


def status_of(result_id):
    return TaskRecord.objects.get(pk=result_id).status


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); ask ps whether it is defunct
    state = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True,
                           text=True).stdout.strip()
    return bool(state) and not state.startswith("Z")


def test_tasks_and_rows_in_one_burst_with_retries(runworkers):
    Item.objects.bulk_create([Item() for _ in range(20)])
    flaky = tasks.flaky.enqueue(succeed_on=3)
    added = tasks.add.enqueue_many([((i, 1), {}) for i in range(30)])
    p = runworkers("--burst", "--concurrency", "2")
    assert p.wait(120) == 0, p.output()
    assert Effect.objects.filter(worker="touch").count() == 20
    result = default_task_backend.get_result(flaky.id)
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 3
    assert result.attempts == 3 and len(result.errors) == 2
    assert all(default_task_backend.get_result(r.id).return_value == i + 1
               for i, r in enumerate(added))


def test_a_burst_exits_when_the_work_is_done_not_after_a_poll(runworkers):
    """--burst ends with one more claim after the last, at once: it used to wait a whole
    POLL_INTERVAL after the last task (no sweep to make it go on); here that is an hour."""
    added = tasks.add.enqueue_many([((i, 1), {}) for i in range(5)])
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default", lease=3600,
                   extra_env={"DBWORKER_TEST_POLL": "3600"})  # renewals every 20 minutes
    assert p.wait(120) == 0, p.output()
    assert all(default_task_backend.get_result(r.id).return_value == i + 1
               for i, r in enumerate(added))


def test_children_start_with_the_supervisors_heap_frozen(runworkers):
    """The supervisor freezes its objects for the GC before it forks (``pool.start``): a
    task in a child finds them frozen, so its collections do not walk them."""
    result = tasks.gc_frozen.enqueue()
    p = runworkers("--burst", "--concurrency", "1", "--queue", "default")
    assert p.wait(120) == 0, p.output()
    frozen = default_task_backend.get_result(result.id).return_value
    assert frozen > 10_000, f"only {frozen} objects frozen: Django's alone are more"


def test_timeout_stops_the_process_and_retries(runworkers):
    result = tasks.sleeper.enqueue(3600)  # FAILED within the wait: stopped by its timeout
    p = runworkers("--concurrency", "1", "--queue", "default")
    wait_for(lambda: status_of(result.id) == TaskStatus.FAILED, timeout=120,
             what="the task to time out twice")
    row = TaskRecord.objects.get(pk=result.id)
    assert row.attempts == 2
    assert [e["exception_class_path"] for e in row.errors] == \
        ["django_dbworker.exceptions.TaskTimeout"] * 2
    assert "timeout of 1s" in row.errors[0]["message"]
    pids = list(Effect.objects.filter(worker="sleeper").values_list("pid", flat=True))
    assert len(set(pids)) == 2, "each attempt ran in a fresh child"
    assert not any(alive(pid) for pid in pids), "timed-out children are gone"
    later = tasks.add.enqueue(1, 1)
    wait_for(lambda: status_of(later.id) == TaskStatus.SUCCESSFUL, what="the pool to go on")
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0


def test_cancel_a_running_task(runworkers):
    result = tasks.long_running.enqueue(60)
    p = runworkers("--concurrency", "1", "--queue", "slow")
    wait_for(lambda: Effect.objects.filter(worker="long_running").exists(),
             what="the task to start")
    pid = Effect.objects.get(worker="long_running").pid
    assert django_dbworker.cancel(result.id) is True
    wait_for(lambda: status_of(result.id) == TaskStatus.CANCELLED, timeout=60,
             what="the running task to be cancelled")
    wait_for(lambda: not alive(pid), timeout=60, what="the cancelled child to be gone")
    fresh = default_task_backend.get_result(result.id)
    assert fresh.status == TaskResultStatus.FAILED
    assert fresh.errors[-1].exception_class_path == "django_dbworker.exceptions.TaskCancelled"
    # Logged just after the record (taskwork.TaskWork._stop): the test may read it first.
    wait_for(lambda: "cancelled" in p.output(), timeout=60, what="the cancelled line")
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0


def test_rate_limit_across_two_supervisors(runworkers):
    tasks.limited.enqueue_many([((n,), {}) for n in range(10)])
    first = runworkers("--concurrency", "2")
    second = runworkers("--concurrency", "2")
    wait_for(lambda: Effect.objects.filter(worker="limited").count() == 10, timeout=60,
             what="all rate-limited tasks")
    starts = sorted(TaskRecord.objects.values_list("last_attempted_at", flat=True))
    spread = (starts[-1] - starts[0]).total_seconds()
    # 2 at once, then 2 per second: the last of 10 cannot start before about 4 s
    assert spread >= 3.5, spread
    for i in range(len(starts)):
        window = [s for s in starts if 0 <= (s - starts[i]).total_seconds() < 1.0]
        assert len(window) <= 4, f"{len(window)} starts within one second"
    for p in (first, second):
        p.signal(signal.SIGTERM)
        assert p.wait(30) == 0


def test_cron_ticks_once_across_two_supervisors(runworkers):
    cron_on = {"DBWORKER_TEST_CRON": "1"}
    a = runworkers("--concurrency", "1", extra_env=cron_on)
    b = runworkers("--concurrency", "1", extra_env=cron_on)
    wait_for(lambda: TaskRecord.objects.filter(schedule="every_second").count() >= 4,
             timeout=120, what="four cron ticks")
    for p in (a, b):
        p.signal(signal.SIGTERM)
        assert p.wait(30) == 0
    rows = list(TaskRecord.objects.filter(schedule="every_second").order_by("idempotency_key"))
    keys = [r.idempotency_key for r in rows]
    assert len(keys) == len(set(keys))
    # One task per tick, not two: the ticks named by the keys are whole seconds, each once
    # (judged by the ticks themselves, not by when a loaded machine got to enqueue them).
    ticks = [datetime.fromisoformat(k.rsplit(":every_second:", 1)[1]) for k in keys]
    assert all(t.microsecond == 0 for t in ticks), keys
    assert len(ticks) <= (max(ticks) - min(ticks)).total_seconds() + 1, keys
    done = TaskRecord.objects.filter(schedule="every_second", status=TaskStatus.SUCCESSFUL)
    assert Effect.objects.filter(worker="tick").count() == done.count()


def test_idempotency_under_concurrent_enqueues(transactional_db, tmp_path):
    start_at = time.time() + 3
    code = (
        "import time, django; django.setup();"
        "from tests.testapp.tasks import add;"
        f"time.sleep(max(0, {start_at} - time.time()));"
        "print(add.using(idempotency_key='same').enqueue(1, 2).id)"
    )
    env = {**os.environ, "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    ids = {out.strip() for out, _ in outputs}
    assert len(ids) == 1
    assert TaskRecord.objects.filter(idempotency_key="same").count() == 1


def test_queue_selection(runworkers):
    email = tasks.send_email.enqueue("a@example.com")
    other = tasks.add.enqueue(1, 1)
    Item.objects.create()
    p = runworkers("--burst", "--queue", "emails")
    assert p.wait(60) == 0, p.output()
    assert status_of(email.id) == TaskStatus.SUCCESSFUL
    assert status_of(other.id) == TaskStatus.READY
    assert not Effect.objects.filter(worker="touch").exists(), "--queue alone runs no workers"
    bad = runworkers("--burst", "--queue", "nope")
    assert bad.wait(60) != 0
    assert "Unknown queue(s) 'nope'" in bad.output()


def test_postgres_wakes_idle_supervisors_without_polling(runworkers, vendor):
    if vendor == "sqlite":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's (MariaDB: the commit probe); SQLite polls")
    p = runworkers("--concurrency", "1", extra_env={"DBWORKER_TEST_POLL": "3600"})
    warm = tasks.add.enqueue(1, 1)  # the first claim happens at start, before any poll
    wait_for(lambda: status_of(warm.id) == TaskStatus.SUCCESSFUL, timeout=120,
             what="the first task")
    time.sleep(0.5)  # now it waits: the next poll is an hour away
    for _ in range(3):
        result = tasks.add.enqueue(2, 2)
        wait_for(lambda r=result: status_of(r.id) == TaskStatus.SUCCESSFUL, timeout=120,
                 what="a task woken by NOTIFY (a poll is an hour away)")
        item = Item.objects.create()
        wait_for(lambda i=item: Effect.objects.filter(item_id=i.pk, worker="touch").exists(),
                 timeout=120, what="a saved row woken by NOTIFY")
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0
