"""The django.tasks backend in-process: enqueue, results, retries, options, bad input."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone

import django_dbworker
from django_dbworker.backend import DBWorkerBackend
from django_dbworker.djtasks import (
    InvalidTask,
    TaskResultDoesNotExist,
    TaskResultStatus,
    default_task_backend,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)
from django_dbworker.exceptions import InvalidTaskArguments
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def test_backend_flags():
    backend = task_backends["default"]
    assert isinstance(backend, DBWorkerBackend)
    assert backend.supports_defer and backend.supports_async_task
    assert backend.supports_get_result and backend.supports_priority


def test_enqueue_run_and_get_result_from_the_store():
    result = tasks.add.enqueue(2, 3)
    assert result.status == TaskResultStatus.READY
    assert result.args == [2, 3] and result.kwargs == {}
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.READY
    assert run_until_idle() == {"successful": 1}
    fetched = default_task_backend.get_result(result.id)
    assert fetched.status == TaskResultStatus.SUCCESSFUL
    assert fetched.return_value == 5
    assert fetched.attempts == 1 and len(fetched.worker_ids) == 1
    assert fetched.started_at <= fetched.finished_at
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL and result.return_value == 5
    assert tasks.add.get_result(result.id).return_value == 5


def test_unknown_result_id():
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("not-a-uuid")
    with pytest.raises(TaskResultDoesNotExist):
        default_task_backend.get_result("00000000-0000-0000-0000-000000000000")


def test_signals_are_sent():
    seen = []

    def on(signal_name):
        return lambda sender, task_result, **kw: seen.append((signal_name, task_result.status))

    handlers = {s: on(n) for s, n in [(task_enqueued, "enqueued"), (task_started, "started"),
                                      (task_finished, "finished")]}
    for signal, handler in handlers.items():
        signal.connect(handler)
    try:
        tasks.add.enqueue(1, 1)
        run_until_idle()
    finally:
        for signal, handler in handlers.items():
            signal.disconnect(handler)
    assert seen == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]


def test_retries_until_success_keep_every_error():
    result = tasks.flaky.enqueue(succeed_on=3)
    counts = run_until_idle()
    assert counts == {"retrying": 2, "successful": 1}
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 3
    assert result.attempts == 3
    assert [e.exception_class_path for e in result.errors] == ["builtins.TimeoutError"] * 2
    assert result.errors[0].exception_class is TimeoutError


def test_retries_exhausted_is_dead_with_history_and_on_failure():
    result = tasks.always_fails.enqueue()
    assert run_until_idle() == {"retrying": 2, "failed": 1}
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.dbworker_status == TaskStatus.FAILED
    assert len(result.errors) == 3 and result.attempts == 3
    with pytest.raises(ValueError, match="Task failed"):
        result.return_value  # noqa: B018
    assert Effect.objects.filter(worker="on_failure", note="ValueError").count() == 1


def test_exception_outside_retry_for_fails_at_once():
    result = tasks.wrong_exception.enqueue()
    assert run_until_idle() == {"failed": 1}
    result.refresh()
    assert result.attempts == 1 and result.errors[0].exception_class_path == "builtins.KeyError"


def test_retry_backoff_delay_and_jitter():
    from django_dbworker.tasks import retry

    t = tasks.add.using()
    from dataclasses import replace

    t = replace(t, retries=5, retry_delay=2, retry_backoff=True, retry_backoff_factor=3,
                retry_max_delay=30)
    assert [retry.delay(t, n) for n in (1, 2, 3, 4)] == [2, 6, 18, 30]
    jittered = replace(t, retry_jitter=0.5)
    values = {retry.delay(jittered, 2) for _ in range(50)}
    assert all(3 <= v <= 6 for v in values) and len(values) > 1


def test_retrying_task_waits_for_its_delay():
    result = tasks.slow_retry.enqueue()
    assert run_until_idle() == {"retrying": 1}
    result.refresh()
    assert result.dbworker_status == TaskStatus.RETRYING
    assert result.status == TaskResultStatus.READY, "Django sees a retrying task as READY"


def test_return_value_must_be_json():
    """Recorded as Django's ImmediateBackend records it: TypeError, "Unsupported type"."""
    result = tasks.returns_object.enqueue()
    assert run_until_idle() == {"failed": 1}
    result.refresh()
    assert result.errors[0].exception_class is TypeError
    assert result.errors[0].traceback.endswith(
        "TypeError: Unsupported type: <class 'object'>; task 'returns_object' returned a "
        "value that cannot be stored as JSON: return dicts, lists, strings, numbers, "
        "booleans or None.\n")


def test_return_value_size_is_bounded(settings):
    settings.DBWORKER = {**settings.DBWORKER, "RESULT_MAX_BYTES": 100}
    ok, big = tasks.big_result.enqueue(10), tasks.big_result.enqueue(1000)
    run_until_idle()
    ok.refresh()
    big.refresh()
    assert ok.return_value == "x" * 10
    assert big.status == TaskResultStatus.FAILED
    assert "RESULT_MAX_BYTES" in big.errors[0].traceback


def test_arguments_must_be_json():
    with pytest.raises(InvalidTaskArguments, match="'add'.*cannot be stored as JSON"):
        tasks.add.enqueue(object(), 1)
    assert not TaskRecord.objects.exists()
    aware = tasks.add.enqueue((1, 2), b"x")  # tuples become lists, bytes text
    assert aware.args == [[1, 2], "x"]


def test_priority_queue_and_order():
    low = tasks.add.using(priority=-5).enqueue(1, 0)
    high = tasks.add.using(priority=50).enqueue(2, 0)
    mid = tasks.send_email.enqueue("a@example.com")
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.units.claimant import Claimant

    order = [c.task_id for c in taskplanner.claim(None, 3, Claimant(), 30)]
    assert sorted(order) == sorted(TaskRecord.objects.values_list("pk", flat=True))
    only_default = taskplanner.claim(["default"], 5, Claimant(), 30)
    assert only_default == []
    assert TaskRecord.objects.get(pk=mid.id).queue_name == "emails"
    assert [str(x) for x in TaskRecord.objects.order_by("-priority").values_list(
        "pk", flat=True)] == [high.id, mid.id, low.id]


def test_claim_order_is_priority_then_age():
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.units.claimant import Claimant

    first = tasks.add.enqueue(1, 1)
    high = tasks.add.using(priority=100).enqueue(2, 2)
    second = tasks.add.enqueue(3, 3)
    got = []
    while claims := taskplanner.claim(["default"], 1, Claimant(), 30):
        got.append(str(claims[0].task_id))
    assert got == [high.id, first.id, second.id]


def test_a_batch_comes_back_in_claim_order():
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.units.claimant import Claimant

    made = [tasks.add.using(priority=p).enqueue(p, 0) for p in (0, 5, -3, 5, 90, 1)]
    by_priority = sorted(made, key=lambda r: -r.task.priority)  # stable: age among equals
    claims = taskplanner.claim(["default"], 6, Claimant(), 30)
    assert [str(c.task_id) for c in claims] == [r.id for r in by_priority]


def test_rate_limited_tasks_of_high_priority_are_not_starved_by_unlimited_ones():
    from django_dbworker.models import RateBucket
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.units.claimant import Claimant

    tasks.add.enqueue_many([((i, i), {}) for i in range(10)])  # priority 0, unlimited
    urgent = tasks.limited.using(priority=50).enqueue_many([((i,), {}) for i in range(3)])
    late = tasks.limited.using(priority=-50).enqueue(99)
    limits = {tasks.limited.module_path: "2/s"}

    def claim(room: int) -> list:
        return taskplanner.claim_limited(["default"], room, Claimant(), 30, limits=limits,
                                       global_limit=None)

    first = claim(4)
    assert {c.task_path for c in first[:2]} == {tasks.limited.module_path}, \
        "the limited tasks of higher priority come first, as many as their rate allows"
    assert {str(c.task_id) for c in first[:2]} <= {r.id for r in urgent}
    assert [c.task_path for c in first[2:]] == [tasks.add.module_path] * 2
    bucket = RateBucket.objects.get(key=f"task:{tasks.limited.module_path}")
    assert bucket.tokens < 1, "the bucket paid for the two it started"
    waiting = TaskRecord.objects.filter(status=TaskStatus.READY)
    assert waiting.count() == 14 - 4, "what was claimed but not kept went back"
    assert sorted(TaskRecord.objects.filter(pk__in=[r.id for r in urgent]).values_list(
        "attempts", flat=True)) == [0, 1, 1], "the third given back, its attempt taken back"
    assert TaskRecord.objects.get(pk=late.id).worker_ids == []
    second = claim(10)
    assert tasks.limited.module_path not in {c.task_path for c in second}, "rate spent"
    assert len(second) == 8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"priority": 101}, r"^priority must be a whole number between -100 and 100\. "
                            r"Task 'add': priority=101 was given\.$"),
        ({"queue_name": "nope"}, r"^Queue 'nope' is not valid for backend\. .*"
                                 r"queue 'nope' is not configured"),
        ({"run_after": datetime(2030, 1, 1)},
         r"^run_after must be an aware datetime\. Task 'add': run_after=.* is naive"),
        ({"priority": 1.5}, r"^priority must be a whole number"),
        ({"queue_name": ""}, "queue_name='' must be a non-empty string"),
        ({"run_after": "tomorrow"}, "run_after must be a datetime or a timedelta"),
    ],
)
def test_bad_using_options(options, message):
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**options)


def test_an_unknown_queue_says_where_to_add_it():
    with pytest.raises(InvalidTask) as caught:
        tasks.add.using(queue_name="reports")
    assert str(caught.value) == (  # Django's own sentence first, then ours
        "Queue 'reports' is not valid for backend. "
        "Task 'add': queue 'reports' is not configured for task backend 'default'; "
        "TASKS['default']['QUEUES'] is ['default', 'emails', 'slow']. Add 'reports' to "
        "TASKS['default']['QUEUES'] in your settings, or use one of those queues.")


def test_an_unknown_queue_of_a_backend_without_queues_says_to_add_them():
    from django_dbworker.djtasks import task

    def f():
        pass

    f.__module__ = "tests.testapp.tasks"
    f.__qualname__ = f.__name__ = "f"
    with pytest.raises(InvalidTask) as caught:  # at decoration, as at import of tasks.py
        task(backend="on_commit", queue_name="reports")(f)
    assert str(caught.value) == (
        "Queue 'reports' is not valid for backend. "
        "Task 'f': queue 'reports' is not configured for task backend 'on_commit', which "
        "has no QUEUES setting and so takes only ['default']. Add "
        "\"QUEUES\": ['default', 'reports'] to TASKS['on_commit'] in your settings.")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"retries": -1}, "retries=-1 must be an integer >= 0"),
        ({"retries": "3"}, "retries='3'"),
        ({"retry_delay": "1s"}, "retry_delay='1s' must be a number of seconds"),
        ({"retry_for": (int,)}, "retry_for=.* must be a tuple of exception classes"),
        ({"retry_backoff_factor": 0.5}, "retry_backoff_factor=0.5"),
        ({"retry_jitter": 2}, "retry_jitter=2"),
        ({"timeout": 0}, "timeout=0"),
        ({"rate_limit": "fast"}, "rate 'fast' is not a rate"),
        ({"on_success": 3}, "on_success=3 must be a callable"),
    ],
)
def test_bad_decorator_options_fail_at_decoration(options, message):
    from django_dbworker.djtasks import task

    def f():
        pass

    f.__module__ = "tests.testapp.tasks"
    f.__qualname__ = f.__name__ = "f"
    with pytest.raises(InvalidTask, match=message):
        task(**options)(f)


def test_retry_for_accepts_a_single_class():
    from django_dbworker.djtasks import task

    def g():
        pass

    g.__qualname__ = g.__name__ = "g"
    assert task(retry_for=KeyError)(g).retry_for == (KeyError,)


def test_run_after_datetime_and_timedelta():
    later = timezone.now() + timedelta(hours=1)
    r1 = tasks.add.using(run_after=later).enqueue(1, 1)
    r2 = tasks.add.using(run_after=timedelta(minutes=30)).enqueue(1, 1)
    assert run_until_idle() == {}
    assert TaskRecord.objects.get(pk=r1.id).available_at == later
    delay = TaskRecord.objects.get(pk=r2.id).available_at - timezone.now()
    assert timedelta(minutes=29) < delay <= timedelta(minutes=30)
    TaskRecord.objects.update(available_at=timezone.now())
    assert run_until_idle() == {"successful": 2}


def test_run_after_in_another_time_zone_is_the_same_instant():
    from zoneinfo import ZoneInfo

    when = datetime(2031, 5, 1, 12, 0, tzinfo=ZoneInfo("Asia/Tokyo"))
    result = tasks.add.using(run_after=when).enqueue(1, 1)
    assert TaskRecord.objects.get(pk=result.id).available_at == datetime(2031, 5, 1, 3, 0,
                                                                         tzinfo=UTC)


def test_enqueue_inside_a_rolled_back_transaction_never_runs():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.add.enqueue(1, 1)
        raise RuntimeError("roll back")
    assert not TaskRecord.objects.exists()
    assert run_until_idle() == {}


def test_enqueue_on_commit_opt_in():
    with transaction.atomic():
        result = tasks.committed.enqueue(5)
        assert not TaskRecord.objects.exists(), "not stored before commit"
    assert TaskRecord.objects.filter(pk=result.id).exists()
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.committed.enqueue(6)
        raise RuntimeError("roll back")
    assert TaskRecord.objects.count() == 1
    per_call = tasks.add.using(enqueue_on_commit=True)
    with transaction.atomic():
        per_call.enqueue(1, 2)
        assert TaskRecord.objects.count() == 1
    assert TaskRecord.objects.count() == 2


def test_idempotency_key_returns_the_existing_result():
    first = tasks.add.using(idempotency_key="k-1").enqueue(1, 2)
    again = tasks.add.using(idempotency_key="k-1").enqueue(1, 2)
    assert again.id == first.id
    assert TaskRecord.objects.count() == 1
    run_until_idle()
    after = tasks.add.using(idempotency_key="k-1").enqueue(9, 9)
    assert after.id == first.id and after.return_value == 3


def test_task_enqueued_is_sent_for_the_call_that_stored_a_keyed_task_only():
    from django_dbworker.djtasks import task_enqueued

    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result.id)

    task_enqueued.connect(receiver)
    try:
        first = tasks.add.using(idempotency_key="k-signal").enqueue(1, 2)
        tasks.add.using(idempotency_key="k-signal").enqueue(1, 2)
        with transaction.atomic():
            tasks.add.using(idempotency_key="k-signal", enqueue_on_commit=True).enqueue(1, 2)
        with transaction.atomic():
            other = tasks.add.using(idempotency_key="k-other",
                                    enqueue_on_commit=True).enqueue(3, 4)
    finally:
        task_enqueued.disconnect(receiver)
    assert seen == [first.id, other.id], "once per stored task, not per call"


def test_idempotency_key_with_enqueue_on_commit_names_the_stored_task():
    first = tasks.add.using(idempotency_key="k-commit").enqueue(1, 2)
    with transaction.atomic():
        again = tasks.add.using(idempotency_key="k-commit", enqueue_on_commit=True).enqueue(3, 4)
    assert again.id == first.id
    assert default_task_backend.get_result(again.id).args == [1, 2]
    assert TaskRecord.objects.count() == 1


def test_idempotency_key_race_across_threads(vendor):
    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers; the process test covers it there")
    ids, errors = [], []
    barrier = threading.Barrier(8)

    def enqueue():
        from django.db import connection

        try:
            barrier.wait()
            ids.append(tasks.add.using(idempotency_key="race").enqueue(1, 1).id)
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=enqueue) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(set(ids)) == 1 and TaskRecord.objects.count() == 1


def test_enqueue_many_in_order_and_one_transaction():
    results = tasks.add.enqueue_many([((i, i), {}) for i in range(50)])
    assert [r.args for r in results] == [[i, i] for i in range(50)]
    assert TaskRecord.objects.count() == 50
    run_until_idle()
    assert [default_task_backend.get_result(r.id).return_value for r in results] == \
        [2 * i for i in range(50)]
    with pytest.raises(InvalidTaskArguments, match="call 1"):
        tasks.add.enqueue_many([((1, 1), {}), ((object(), 1), {})])
    assert TaskRecord.objects.count() == 50, "nothing half-written"
    with pytest.raises(InvalidTaskArguments, match=r"give \(args, kwargs\) pairs"):
        tasks.add.enqueue_many([(1, 2, 3)])
    with pytest.raises(InvalidTask, match="identifies one call"):
        tasks.add.using(idempotency_key="many").enqueue_many([((1, 1), {}), ((2, 2), {})])


def test_cancel_waiting_and_finished():
    waiting = tasks.add.enqueue(1, 1)
    assert django_dbworker.cancel(waiting.id) is True
    waiting.refresh()
    assert waiting.dbworker_status == TaskStatus.CANCELLED
    assert waiting.status == TaskResultStatus.FAILED
    assert "cancelled" in waiting.errors[0].traceback or waiting.errors
    assert run_until_idle() == {}
    done = tasks.add.enqueue(1, 1)
    run_until_idle()
    assert django_dbworker.cancel(done.id) is False
    with pytest.raises(TaskResultDoesNotExist):
        django_dbworker.cancel("00000000-0000-0000-0000-000000000000")


def test_callbacks_and_their_failures_are_contained():
    tasks.succeeds_with_callback.enqueue()
    tasks.broken_callback_task.enqueue()
    assert run_until_idle() == {"successful": 2}
    assert Effect.objects.filter(worker="on_success", note="7").count() == 1


def test_async_task():
    result = tasks.async_add.enqueue(2, 2)
    run_until_idle()
    result.refresh()
    assert result.return_value == 4


def test_progress_outside_a_unit_records_nothing_but_checks_values():
    assert django_dbworker.set_progress(10) is False
    with pytest.raises(ValueError, match="from 0 to 100"):
        django_dbworker.set_progress(101)
    with pytest.raises(TypeError, match="message must be a string"):
        django_dbworker.set_progress(5, message=3)


def test_progress_is_recorded():
    result = tasks.with_progress.enqueue(0)
    run_until_idle()
    result.refresh()
    assert result.progress == 50 and result.progress_message == "half way"


@pytest.mark.django_db(transaction=False)
@pytest.mark.timeout(60)
def test_progress_inside_a_tests_transaction_is_recorded_without_waiting():
    """A test case's transaction holds the task's row uncommitted: another connection's
    UPDATE of it would wait for that transaction on MariaDB/MySQL (forever, here)."""
    result = tasks.with_progress.enqueue(0)
    run_until_idle()
    result.refresh()
    assert result.progress == 50 and result.progress_message == "half way"


def test_unknown_task_path_in_a_row_fails_cleanly():
    row = TaskRecord.objects.create(task_path="os.system", args=["echo hacked"])
    bad_module = TaskRecord.objects.create(task_path="tests.testapp.models.Item")
    assert run_until_idle() == {"failed": 2}
    row.refresh_from_db()
    bad_module.refresh_from_db()
    assert row.status == TaskStatus.FAILED
    assert "'os.system' is not a registered task" in row.errors[0]["message"]
    assert "is not a registered task" in bad_module.errors[0]["message"]


def test_prune_keeps_recent_and_unfinished():
    from django_dbworker.tasks import store as taskstore

    old = tasks.add.enqueue(1, 1)
    recent = tasks.add.enqueue(2, 2)
    waiting = tasks.add.using(run_after=timedelta(hours=1)).enqueue(3, 3)
    run_until_idle()
    TaskRecord.objects.filter(pk=old.id).update(finished_at=timezone.now() - timedelta(days=9))
    assert taskstore.prune(timedelta(days=7), batch=1) == 1
    assert set(map(str, TaskRecord.objects.values_list("pk", flat=True))) == \
        {recent.id, waiting.id}


def test_backend_check_requires_installed_app(settings):
    backend = task_backends["default"]
    assert list(backend.check()) == []
    settings.INSTALLED_APPS = [a for a in settings.INSTALLED_APPS if a != "django_dbworker"]
    errors = list(backend.check())
    assert [e.id for e in errors] == ["django_dbworker.E010"]


def test_aenqueue_and_aget_result():
    from asgiref.sync import async_to_sync

    async def go():
        result = await tasks.add.aenqueue(4, 5)
        fetched = await default_task_backend.aget_result(result.id)
        return result, fetched

    result, fetched = async_to_sync(go)()
    assert fetched.id == result.id and fetched.status == TaskResultStatus.READY
    run_until_idle()

    async def refresh():
        await result.arefresh()

    async_to_sync(refresh)()
    assert result.return_value == 9


@pytest.mark.parametrize(("flag", "how", "message"), [
    ("supports_async_task", lambda: tasks.async_add, "does not support async tasks"),
    ("supports_priority", lambda: tasks.add.using(priority=5), "does not support priorities"),
    ("supports_defer", lambda: tasks.add.using(run_after=timedelta(seconds=5)),
     "does not support run_after"),
])
def test_a_subclass_that_turns_a_supports_flag_off_is_refused_that_feature(flag, how, message):
    """Django's own base checks enforce the supports_* flags; ours must too (Django's test
    test_validate_disallowed_async_task patches one off and expects InvalidTask)."""
    from django_dbworker.backend import DBWorkerBackend

    narrower = type("Narrower", (DBWorkerBackend,), {flag: False})("narrow", {
        "QUEUES": [], "OPTIONS": {}})
    with pytest.raises(InvalidTask, match=f"'narrow' {message}.*{flag} is False"):
        narrower.validate_task(how())
    DBWorkerBackend("wide", {"QUEUES": [], "OPTIONS": {}}).validate_task(how())
