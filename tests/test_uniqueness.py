"""Uniqueness by state and period (``unique_key``, ``unique_while``, ``unique_for``,
``on_duplicate``): in-process behaviour, bad input, retention, the admin and the CLI, and
the race of 8 threads and 2 processes enqueueing one key at once."""

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker.djtasks import InvalidTask, task, task_enqueued
from django_dbworker.exceptions import InvalidTaskArguments
from django_dbworker.models import TaskRecord, TaskStatus, TaskUniqueness
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks import uniqueness
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.conftest import ROOT
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def claim_all():
    return taskplanner.claim(None, 100, Claimant(), 30)


@pytest.fixture
def enqueued():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    yield seen
    task_enqueued.disconnect(receiver)


# ----- by state: "active" (default) and "waiting" ------------------------------------------


def test_keep_returns_the_holder_until_it_finishes(enqueued):
    first = tasks.unique_report.enqueue("monday")
    again = tasks.unique_report.enqueue("tuesday")
    assert again.id == first.id and again.args == ["monday"], "kept as it was"
    assert TaskRecord.objects.get().unique_key == "report"
    holder = TaskUniqueness.objects.get()
    assert (str(holder.task_id), holder.unique_key, holder.period_start) == \
        (first.id, "report", None)
    assert enqueued == [first.id], "task_enqueued for the stored task only"
    claim_all()  # RUNNING still holds the key ("active")
    assert tasks.unique_report.enqueue("wednesday").id == first.id
    TaskRecord.objects.filter(pk=first.id).update(status=TaskStatus.SUCCESSFUL)
    after = tasks.unique_report.enqueue("thursday")
    assert after.id != first.id and after.args == ["thursday"]
    assert str(TaskUniqueness.objects.get().task_id) == after.id, "the row names the new one"
    assert enqueued == [first.id, after.id]
    assert TaskRecord.objects.count() == 2


def test_retrying_holds_the_key_and_failed_or_cancelled_frees_it():
    first = tasks.unique_report.enqueue(1)
    TaskRecord.objects.filter(pk=first.id).update(status=TaskStatus.RETRYING)
    assert tasks.unique_report.enqueue(2).id == first.id
    for status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
        TaskRecord.objects.filter(unique_key="report").update(status=status)
        new = tasks.unique_report.enqueue(3)
        assert new.id != first.id and new.dbworker_status == TaskStatus.READY
        first = new


def test_a_deleted_holder_frees_the_key():
    first = tasks.unique_report.enqueue(1)
    assert taskstore.purge(None) == 1
    again = tasks.unique_report.enqueue(2)
    assert again.id != first.id and TaskRecord.objects.get().args == [2]


def test_keys_are_per_task_and_per_call():
    a = tasks.unique_report.enqueue(1)
    b = tasks.unique_report.using(unique_key="other").enqueue(2)
    c = tasks.unique_hourly.using(unique_key="report").enqueue(3)  # same key, other task
    assert len({a.id, b.id, c.id}) == 3
    assert tasks.unique_report.using(unique_key="other").enqueue(4).id == b.id
    # a key given per call to a task that declares none
    d = tasks.add.using(unique_key="sum").enqueue(1, 2)
    assert tasks.add.using(unique_key="sum").enqueue(5, 5).id == d.id
    assert tasks.add.enqueue(1, 2).id != d.id, "a call without a key is not unique"


def test_waiting_a_running_task_does_not_block_and_replace_debounces():
    first = tasks.unique_debounced.using(run_after=timedelta(seconds=5)).enqueue(7, note="a")
    second = tasks.unique_debounced.using(run_after=timedelta(seconds=30)).enqueue(7, note="b")
    assert second.id == first.id
    row = TaskRecord.objects.get(pk=first.id)
    assert row.kwargs == {"note": "b"} and second.kwargs == {"note": "b"}, "replaced"
    assert row.available_at > timezone.now() + timedelta(seconds=20), "run_after replaced"
    assert row.enqueued_at == first.enqueued_at, "the first enqueue is kept"
    other_user = tasks.unique_debounced.enqueue(8, note="c")
    assert other_user.id != first.id, "a key derived from the arguments"
    TaskRecord.objects.update(available_at=timezone.now())
    assert {str(c.task_id) for c in claim_all()} == {first.id, other_user.id}  # RUNNING
    third = tasks.unique_debounced.enqueue(7, note="d")
    assert third.id != first.id, "a RUNNING holder does not hold a 'waiting' key"
    assert TaskRecord.objects.get(pk=first.id).kwargs == {"note": "b"}, "nor is it replaced"
    assert tasks.unique_debounced.enqueue(7, note="e").id == third.id
    assert TaskRecord.objects.get(pk=third.id).kwargs == {"note": "e"}


def test_replace_leaves_a_running_active_holder_unchanged():
    first = tasks.unique_debounced.enqueue(1, note="a")
    TaskRecord.objects.filter(pk=first.id).update(status=TaskStatus.RUNNING)
    active = replace(tasks.unique_debounced, unique_while="active")
    again = active.enqueue(1, note="b")
    assert again.id == first.id and again.kwargs == {"note": "a"}, "returned unchanged"


def test_debounced_task_runs_once_with_the_last_arguments():
    for note in ("a", "b", "c"):
        tasks.unique_debounced.enqueue(3, note=note)
    assert run_until_idle() == {"successful": 1}
    assert list(Effect.objects.values_list("note", flat=True)) == ["c"]


# ----- by period ----------------------------------------------------------------------------


def test_period_start_is_aligned_on_the_epoch():
    at = datetime(2026, 12, 2, 14, 37, 12, 345678, tzinfo=UTC)
    assert uniqueness.period_start(at, 3600) == datetime(2026, 12, 2, 14, tzinfo=UTC)
    assert uniqueness.period_start(at, 86400) == datetime(2026, 12, 2, tzinfo=UTC)
    assert uniqueness.period_start(at, 0.5) == datetime(2026, 12, 2, 14, 37, 12, 0,
                                                        tzinfo=UTC)
    assert uniqueness.period_start(at, 15 * 60) == datetime(2026, 12, 2, 14, 30, tzinfo=UTC)


def at(when):
    """Enqueue as if it were ``when`` (the enqueue's clock: Shared.of's timezone.now)."""
    return mock.patch("django_dbworker.tasks.newtasks.timezone.now", return_value=when)


def test_one_per_key_per_period_whatever_its_status(enqueued):
    hour = datetime(2025, 12, 2, 14, tzinfo=UTC)
    with at(hour + timedelta(minutes=1)):
        first = tasks.unique_hourly.enqueue(1)
    run_until_idle()
    assert TaskRecord.objects.get().status == TaskStatus.SUCCESSFUL
    with at(hour + timedelta(minutes=59, seconds=59)):
        again = tasks.unique_hourly.enqueue(2)
    assert again.id == first.id and again.dbworker_status == TaskStatus.SUCCESSFUL
    with at(hour + timedelta(hours=1)):
        next_hour = tasks.unique_hourly.enqueue(3)
    assert next_hour.id != first.id
    starts = sorted(TaskUniqueness.objects.values_list("period_start", flat=True))
    assert starts == [hour, hour + timedelta(hours=1)]
    assert enqueued == [first.id, next_hour.id]


def test_a_running_period_holder_is_returned_and_replace_only_changes_a_waiting_one():
    hour = datetime(2025, 12, 2, 14, tzinfo=UTC)
    debounced = replace(tasks.unique_hourly, on_duplicate="replace")
    with at(hour):
        first = debounced.enqueue(1)
        assert debounced.enqueue(2).args == [2]
        TaskRecord.objects.update(status=TaskStatus.RUNNING)
        third = debounced.enqueue(3)
    assert third.id == first.id and third.args == [2]


# ----- enqueue_many, idempotency keys, cron ---------------------------------------------


def test_enqueue_many_collapses_duplicates_in_order(enqueued):
    results = tasks.unique_debounced.enqueue_many(
        [((1,), {"note": "a"}), ((2,), {}), ((1,), {"note": "b"}), ((3,), {})])
    ids = [r.id for r in results]
    assert ids[0] == ids[2] and len(set(ids)) == 3
    assert TaskRecord.objects.get(pk=ids[0]).kwargs == {"note": "b"}, "in call order"
    assert enqueued == [ids[0], ids[1], ids[3]]
    again = tasks.unique_report.enqueue_many([((1,), {}), ((2,), {})])
    assert again[0].id == again[1].id and again[1].args == [1]


def test_idempotency_key_is_checked_first_then_the_unique_key():
    first = tasks.unique_report.using(idempotency_key="tick-1").enqueue(1)
    assert tasks.unique_report.using(idempotency_key="tick-1").enqueue(9).id == first.id
    assert tasks.unique_report.using(idempotency_key="tick-2").enqueue(2).id == first.id
    TaskRecord.objects.update(status=TaskStatus.SUCCESSFUL)
    assert tasks.unique_report.using(idempotency_key="tick-1").enqueue(3).id == first.id
    new = tasks.unique_report.using(idempotency_key="tick-2").enqueue(4)
    assert new.id != first.id
    assert TaskRecord.objects.get(pk=new.id).idempotency_key == "tick-2"


# ----- bad input ---------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"unique_key": 42}, r"unique_key=42 must be a non-empty string .* or a function"),
    ({"unique_key": ""}, r"unique_key='' must be a non-empty string"),
    ({"unique_key": "x" * 256}, r"at most 255 characters"),
    ({"unique_key": "a\x00b"}, r"without NUL"),
    ({"unique_key": "k", "unique_for": "1h"},
     r"unique_for='1h' must be a duration: a number of seconds .* or a timedelta"),
    ({"unique_key": "k", "unique_for": 0}, r"unique_for=0 must be a duration"),
    ({"unique_key": "k", "unique_for": float("nan")}, r"unique_for=nan must be a duration"),
    ({"unique_key": "k", "unique_for": timedelta(days=-1)}, r"must be a duration"),
    ({"unique_key": "k", "unique_for": 10**10}, r"more than ten years"),
    ({"unique_key": "k", "unique_while": "running"},
     r"unique_while='running' must be 'active' .* or 'waiting'"),
    ({"unique_key": "k", "unique_while": ["active"]}, r"unique_while=\['active'\] must be"),
    ({"unique_key": "k", "on_duplicate": "merge"},
     r"on_duplicate='merge' must be 'keep' .* or 'replace'"),
    ({"unique_key": "k", "unique_for": 60, "unique_while": "waiting"},
     r"unique_while='waiting' does not apply with unique_for=60.* Remove one"),
    ({"unique_key": "k", "enqueue_on_commit": True},
     r"unique_key cannot be used with enqueue_on_commit=True.*enqueue_on_commit=False"),
])
def test_bad_declarations_are_refused_at_the_decorator(options, message):
    def unique_bad(x):
        return x

    unique_bad.__qualname__ = "unique_bad"  # module level, as @task requires
    with pytest.raises(InvalidTask, match=message):
        task(**options)(unique_bad)
    assert not TaskRecord.objects.exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"unique_key": 42}, r"Task 'add': unique_key=42 must be a non-empty string"),
    ({"unique_key": "x" * 256}, r"at most 255 characters"),
    ({"enqueue_on_commit": True}, r"unique_key cannot be used with enqueue_on_commit=True"),
])
def test_bad_options_are_refused_per_call(options, message):
    keyed = tasks.unique_report if "unique_key" not in options else tasks.add
    with pytest.raises(InvalidTask, match=message):
        keyed.using(**options)


def test_bad_calls_are_refused_and_nothing_is_written():
    with pytest.raises(InvalidTask, match=r"unique_for=60 is set but the call has no "
                                          r"unique_key; give one: @task\(unique_key=...\) "
                                          r"or .using\(unique_key=...\)"):
        tasks.unique_keyless.enqueue(1)
    assert tasks.unique_keyless.using(unique_key="k").enqueue(1).args == [1]
    TaskRecord.objects.all().delete()
    TaskUniqueness.objects.all().delete()
    bad_key = tasks.unique_debounced.using(unique_key=lambda user_id, **kw: user_id)
    with pytest.raises(InvalidTask, match=r"unique_key \(returned by .*<lambda> for call 1\)"
                                          r"=5 must be a non-empty string"):
        bad_key.enqueue_many([(("ok",), {}), ((5,), {})])
    with pytest.raises(TypeError) as raised:
        tasks.unique_debounced.enqueue(note="no user")
    assert "computing unique_key of call 0" in "".join(raised.value.__notes__)
    with pytest.raises(InvalidTaskArguments, match="call 0"):
        tasks.unique_report.enqueue(object())
    with pytest.raises(InvalidTask, match=r"backend 'on_commit'.*enqueue_on_commit=False"):
        tasks.unique_report.using(backend="on_commit").enqueue(1)
    assert not TaskRecord.objects.exists() and not TaskUniqueness.objects.exists()


def test_a_failing_enqueue_in_your_transaction_leaves_nothing():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.unique_report.enqueue(1)
        raise RuntimeError("roll back")
    assert not TaskRecord.objects.exists() and not TaskUniqueness.objects.exists()
    with transaction.atomic():
        first = tasks.unique_report.enqueue(1)
        assert tasks.unique_report.enqueue(2).id == first.id
    assert TaskRecord.objects.count() == 1


# ----- retention, admin, CLI ---------------------------------------------------------------


def test_retention_deletes_the_keys_of_the_tasks_it_deletes():
    held = tasks.unique_report.enqueue(1)
    done = tasks.unique_report.using(unique_key="done").enqueue(2)
    with at(datetime(2025, 12, 2, 14, 59, tzinfo=UTC)):
        period = tasks.unique_hourly.enqueue(4)
    recent = tasks.unique_report.using(unique_key="recent").enqueue(5)
    plain = tasks.add.enqueue(1, 1)
    old = timezone.now() - timedelta(days=30)
    TaskRecord.objects.filter(pk__in=[done.id, period.id, plain.id]).update(
        status=TaskStatus.SUCCESSFUL, finished_at=old)
    TaskRecord.objects.filter(pk=recent.id).update(status=TaskStatus.SUCCESSFUL,
                                                   finished_at=timezone.now())
    # A key taken over by a newer task stays: the delete names its holder.
    taken = tasks.unique_report.using(unique_key="taken").enqueue(6)
    TaskRecord.objects.filter(pk=taken.id).update(status=TaskStatus.FAILED, finished_at=old)
    newer = tasks.unique_report.using(unique_key="taken").enqueue(7)
    assert taskstore.prune(timedelta(days=7), 2) == 4
    assert sorted(TaskUniqueness.objects.values_list("unique_key", flat=True)) == [
        "recent", "report", "taken"]
    assert {str(t) for t in TaskUniqueness.objects.values_list("task_id", flat=True)} == {
        held.id, recent.id, newer.id}


def test_the_cli_and_the_admin_show_the_key(admin_client):
    result = tasks.unique_report.enqueue(1)
    out = StringIO()
    call_command("dbworker", "inspect", result.id, "--json", stdout=out)
    (doc,) = json.loads(out.getvalue())["units"]
    assert doc["unique_key"] == "report"
    out = StringIO()
    call_command("dbworker", "inspect", result.id, stdout=out)
    assert "unique_key: report" in out.getvalue()
    TaskRecord.objects.update(status=TaskStatus.FAILED, finished_at=timezone.now())
    out = StringIO()
    call_command("dbworker", "dead", stdout=out)
    assert "unique_report [report]" in out.getvalue()
    page = admin_client.get("/admin/django_dbworker/taskrecord/").content.decode()
    assert '<small class="dbw-key" title="unique key">key: report</small>' in page
    page = admin_client.get(f"/admin/django_dbworker/taskrecord/{result.id}/change/")
    assert "Unique key" in page.content.decode() and "report" in page.content.decode()
    found = admin_client.get("/admin/django_dbworker/taskrecord/?q=report").content.decode()
    assert result.id[:8] in found
    # Exactly: indexed equalities, never a substring scan (docs/operating.md).
    found = admin_client.get("/admin/django_dbworker/taskrecord/?q=repo").content.decode()
    assert result.id[:8] not in found


# ----- the race ----------------------------------------------------------------------------

RACER = """
import sys, time, django
django.setup()
from dataclasses import replace
from django.db import connection
from tests.testapp.tasks import unique_report
task = replace(unique_report, on_duplicate=sys.argv[1])
connection.ensure_connection()
print("ready", flush=True)
start_at = float(sys.stdin.readline())
time.sleep(max(0, start_at - time.time()))
print(task.enqueue("process").id)
"""


@pytest.mark.parametrize("on_duplicate", ["keep", "replace"])
@pytest.mark.parametrize("holder", ["none", "finished"])
def test_one_task_from_8_threads_and_2_processes_at_once(holder, on_duplicate):
    """The same key enqueued by 8 threads here and 2 other processes at the same instant
    (each connected first, then released together) gives exactly one new task (and, where
    the key's holder had finished, takes it over once); no enqueue fails (SQLite: they
    wait for the write lock)."""
    if holder == "finished":
        old = tasks.unique_report.enqueue("old")
        TaskRecord.objects.filter(pk=old.id).update(status=TaskStatus.SUCCESSFUL)
    env = {**os.environ, "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, on_duplicate], cwd=ROOT, env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    racing = replace(tasks.unique_report, on_duplicate=on_duplicate)
    ids, errors = [], []
    ready = threading.Barrier(9)
    start_at = []

    def enqueue(n):
        from django.db import connection as own

        try:
            own.ensure_connection()
            ready.wait(timeout=60)
            time.sleep(max(0, start_at[0] - time.time()))
            ids.append(racing.enqueue(f"thread {n}").id)
        except Exception as exc:
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=enqueue, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for p in procs:  # each process has set Django up and connected
        assert p.stdout.readline().strip() == "ready", p.stderr.read()[-3000:]
    start_at.append(time.time() + 0.3)
    ready.wait(timeout=60)
    for p in procs:
        p.stdin.write(f"{start_at[0]}\n")
        p.stdin.flush()
    for t in threads:
        t.join()
    outputs = [p.communicate(timeout=90) for p in procs]
    assert errors == []
    assert all(p.returncode == 0 for p in procs), [err[-3000:] for _, err in outputs]
    ids += [out.strip() for out, _ in outputs]
    assert len(ids) == 10 and len(set(ids)) == 1, ids
    waiting = TaskRecord.objects.filter(status=TaskStatus.READY)
    assert waiting.count() == 1 and str(waiting.get().pk) == ids[0]
    assert TaskRecord.objects.count() == (2 if holder == "finished" else 1)
    assert str(TaskUniqueness.objects.get().task_id) == ids[0]


def test_a_unique_task_with_a_concurrency_limit_keeps_both():
    from django_dbworker.models import ConcurrencySlot
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.units.claimant import Claimant

    first = tasks.unique_and_limited.enqueue("a", 1)
    again = tasks.unique_and_limited.enqueue("a", 1)
    other = tasks.unique_and_limited.enqueue("a", 2)
    assert again.id == first.id and other.id != first.id
    rows = {str(r.id): r for r in TaskRecord.objects.all()}
    assert len(rows) == 2
    assert {(r.unique_key, r.concurrency_key, r.concurrency_limit) for r in rows.values()} \
        == {("sync:a:1", "account:a", 1), ("sync:a:2", "account:a", 1)}
    assert ConcurrencySlot.objects.filter(key="account:a").exists()
    # One account, limit 1: one of the two is claimed, the other waits.
    claimed = taskplanner.claim(None, 10, Claimant(), 30, keyed=True)
    assert len(claimed) == 1
