"""Bad declarations and settings are refused where they are declared (issue #16, items 3, 4
and 7): long text keys, durations and rates that overflow or never end, cron expressions
that never fire, schedule arguments that are not JSON, backend OPTIONS, enqueue-side poison
(NUL, size); and one schedule failing at run time never stops a supervisor."""

from __future__ import annotations

import logging
import math
import re
import signal
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import models
from django.test import override_settings
from django.test.utils import isolate_apps
from django.utils import timezone

from django_dbworker import Finished, Unfinished, cron, worker, workers
from django_dbworker import conf as dbconf
from django_dbworker.backend import DBWorkerBackend
from django_dbworker.checks import check_schedules, check_settings, check_workers
from django_dbworker.djtasks import InvalidTask, task
from django_dbworker.exceptions import InvalidTaskArguments, InvalidWorker
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.rows.registry import Worker
from django_dbworker.supervisor.duties.tasks import retention_cutoff
from django_dbworker.tasks import newtasks
from django_dbworker.tasks.scheduler import Scheduler
from django_dbworker.tasks.schedules import Schedule, schedules
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Document, Item, Tag

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def _handler(row):
    return Finished()


# ----- item 3: a text primary key longer than Execution.source_id ----------------------


@isolate_apps("tests.testapp")
@pytest.mark.parametrize(("field", "told"), [
    (lambda: models.CharField(max_length=256, primary_key=True), "max_length=256"),
    (lambda: models.CharField(max_length=1000, primary_key=True), "max_length=1000"),
    (lambda: models.TextField(primary_key=True), "max_length=None"),
    (lambda: models.SlugField(max_length=300, primary_key=True), "max_length=300"),
])
def test_a_text_key_longer_than_255_is_refused_at_declaration(field, told):
    class LongKey(models.Model):
        code = field()

        class Meta:
            app_label = "testapp"

    with pytest.raises(InvalidWorker) as caught:
        worker(name="decl_long_key", source=LongKey)(_handler)
    message = str(caught.value)
    assert "testapp.LongKey" in message and "'code'" in message
    assert told in message and "at most 255 characters" in message
    assert "decl_long_key" not in workers


@isolate_apps("tests.testapp")
def test_a_long_text_key_is_system_check_e006():
    class LongKey(models.Model):
        code = models.CharField(max_length=400, primary_key=True)

        class Meta:
            app_label = "testapp"

    # registered some other way than @worker, which refuses it
    workers._workers["decl_long_e006"] = Worker(
        _handler, name="decl_long_e006", source=LongKey, eligible=None, concurrency=1,
        transactional=True)
    try:
        errors = check_workers()
    finally:
        workers.remove("decl_long_e006")
    assert [e.id for e in errors] == ["django_dbworker.E006"]
    assert "testapp.LongKey" in errors[0].msg and "max_length=400" in errors[0].msg
    assert "255" in errors[0].msg


@isolate_apps("tests.testapp")
def test_keys_that_fit_are_accepted():
    class Exact(models.Model):
        code = models.CharField(max_length=255, primary_key=True)

        class Meta:
            app_label = "testapp"

    for name, source in [("decl_int_key", Item), ("decl_uuid_key", Document),
                         ("decl_short_key", Tag), ("decl_exact_key", Exact)]:
        try:
            assert worker(name=name, source=source)(_handler).source is source
        finally:
            workers.remove(name)


# ----- item 4: settings -----------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ({"LEASE_SECONDS": math.inf}, r"LEASE_SECONDS'\] is inf; it must be a finite number"),
    ({"LEASE_SECONDS": math.nan}, r"LEASE_SECONDS'\] is nan; it must be a finite number"),
    ({"LEASE_SECONDS": 1e12}, r"LEASE_SECONDS'\] is 1000000000000.0; it must be at most "
                              r"3.1536e\+07 seconds \(one year\)"),
    ({"POLL_INTERVAL": -math.inf}, r"POLL_INTERVAL'\] is -inf; it must be a finite"),
    ({"GRACE_PERIOD": math.nan}, r"GRACE_PERIOD'\] is nan; it must be a finite"),
    ({"SWEEP_INTERVAL": 1e12}, r"SWEEP_INTERVAL'\] is 1000000000000.0; it must be at most"),
    ({"FULL_SWEEP_INTERVAL": 0}, r"FULL_SWEEP_INTERVAL'\] is 0; it must be greater than 0"),
    ({"FULL_SWEEP_INTERVAL": "hourly"}, r"FULL_SWEEP_INTERVAL'\] is 'hourly'; it must be a "
                                        r"number of seconds"),
    ({"SQLITE_BUSY_TIMEOUT": 1e9}, r"SQLITE_BUSY_TIMEOUT'\] is 1000000000.0; it must be at "
                                   r"most 2.14748e\+06 seconds"),
    ({"HEALTH_MAX_LAG": math.inf}, r"HEALTH_MAX_LAG'\] is inf; it must be a finite"),
    ({"RETENTION": timedelta.max}, r"RETENTION'\] is datetime.timedelta\(days=999999999, "
                                   r"seconds=86399, microseconds=999999\); it must be at "
                                   r"most 3.1536e\+09 seconds \(100 years\)"),
    ({"RETENTION": math.inf}, r"RETENTION'\] is inf; it must be a finite"),
    ({"RETENTION": 1e12}, r"RETENTION'\] is 1000000000000.0; it must be at most"),
    ({"PREFETCH": 2**40}, r"PREFETCH'\] is 1099511627776; it must be an integer >= 0 and "
                          r"<= 2147483647"),
    ({"ARGUMENTS_MAX_BYTES": 2**63}, r"ARGUMENTS_MAX_BYTES'\] is 9223372036854775808"),
    ({"TASK_RATE_LIMIT": "10/0s"}, r"TASK_RATE_LIMIT'\]: rate '10/0s' is not a rate; write "
                                   r"it as COUNT/UNIT"),
    ({"TASK_RATE_LIMIT": "0/s"}, r"rate '0/s' is not a rate"),
    ({"TASK_RATE_LIMIT": "10/-1s"}, r"rate '10/-1s' is not a rate"),
    ({"TASK_RATE_LIMIT": "1e400/s"}, r"rate '1e400/s' is not a rate"),
    ({"TASK_RATE_LIMIT": "nan/s"}, r"rate 'nan/s' is not a rate"),
    ({"TASK_RATE_LIMIT": math.nan}, r"rate nan is not a rate"),
    ({"TASK_RATE_LIMIT": "1" * 400 + "/s"}, r"rate '1111.*/s' is not a rate"),
])
def test_settings_that_would_stop_runworkers_are_refused(value, message):
    with override_settings(DBWORKER=value), pytest.raises(ImproperlyConfigured, match=message):
        dbconf.load()


def test_an_infinite_lease_is_system_check_e001():
    with override_settings(DBWORKER={"LEASE_SECONDS": math.inf}):
        errors = check_settings()
    assert [e.id for e in errors] == ["django_dbworker.E001"]
    assert "settings.DBWORKER['LEASE_SECONDS'] is inf" in errors[0].msg


def test_long_but_representable_settings_are_accepted():
    with override_settings(DBWORKER={"RETENTION": timedelta(days=365 * 100),
                                     "LEASE_SECONDS": 365 * 86400, "TASK_RATE_LIMIT": "5/2.5s",
                                     "SQLITE_BUSY_TIMEOUT": 2_000_000}):
        config = dbconf.load()
    assert retention_cutoff(config.RETENTION, timezone.now()).year < 2000


def test_the_prune_cutoff_never_overflows():
    now = timezone.now()
    assert retention_cutoff(timedelta.max, now) is None
    assert retention_cutoff(1e15, now) is None
    assert retention_cutoff(None, now) is None
    assert retention_cutoff(60, now) == now - timedelta(seconds=60)


# ----- item 4: schedules ----------------------------------------------------------------


def _task_f():
    def f():
        pass

    f.__module__ = "tests.testapp.tasks"
    f.__qualname__ = f.__name__ = "decl_f"
    return task(f)


@pytest.mark.parametrize(("options", "message"), [
    ({"expression": "0 0 30 2 *"}, r"Schedule 'decl_bad': '0 0 30 2 \*' never fires"),
    ({"expression": "0 0 31 4 *"}, r"'0 0 31 4 \*' never fires"),
    ({"args": [object()]}, r"Schedule 'decl_bad': its args/kwargs cannot be stored as JSON"),
    ({"args": [math.nan]}, r"cannot be stored as JSON \(Out of range float values"),
    ({"args": "abc"}, r"Schedule 'decl_bad': args='abc' must be a list"),
    ({"kwargs": {1: 2}}, r"kwargs=\{1: 2\} must be a dict with string keys"),
    ({"args": ["a\x00b"]}, r"its args/kwargs contain a NUL character \(U\+0000\)"),
    ({"misfire": "all", "misfire_window": 1e12},
     r"misfire_window=1000000000000.0 must be a number of seconds > 0 and at most 2.6784e\+06"),
    ({"misfire_window": math.nan}, r"misfire_window=nan must be"),
    ({"misfire_window": math.inf}, r"misfire_window=inf must be"),
    ({"misfire_window": timedelta(days=32)}, r"misfire_window=2764800.0 must be"),
    ({"misfire_window": 0}, r"misfire_window=0 must be"),
])
def test_bad_cron_declarations_are_refused(options, message):
    options = {"expression": "* * * * *", "name": "decl_bad", **options}
    with pytest.raises(ImproperlyConfigured, match=message):
        cron(options.pop("expression"), **options)(_task_f())
    assert "decl_bad" not in schedules()


@pytest.mark.parametrize(("spec", "message"), [
    ({"cron": "0 0 30 2 *"}, r"Schedule 'decl_s': '0 0 30 2 \*' never fires"),
    ({"args": [{1, 2}]}, r"Schedule 'decl_s': its args/kwargs cannot be stored as JSON"),
    ({"args": [math.inf]}, r"Schedule 'decl_s': its args/kwargs cannot be stored as JSON"),
    ({"args": "1,2"}, r"args='1,2' must be a list"),
    ({"kwargs": [("a", 1)]}, r"kwargs=\[\('a', 1\)\] must be a dict"),
    ({"kwargs": {"k": "\x00"}}, r"NUL character"),
    ({"misfire": "all", "misfire_window": 1e12}, r"misfire_window=1000000000000.0 must be"),
    ({"misfire_window": timedelta.max}, r"misfire_window=86400000000000.0 must be"),
    ({"task": 3}, r"task=3 must be the dotted path of a task"),
])
def test_bad_settings_schedules_are_system_check_e004(settings, spec, message):
    good = {"task": "tests.testapp.tasks.add", "cron": "* * * * *"}
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {"decl_s": {**good, **spec}}}
    errors = check_schedules()
    assert [e.id for e in errors] == ["django_dbworker.E004"]
    assert re.search(message, errors[0].msg), errors[0].msg


def test_a_settings_schedule_naming_an_unregistered_task_is_system_check_e004(settings):
    """Refused by ``check`` (and so by runworkers) where it is declared, not logged as
    ``schedule_failed`` every minute by every supervisor."""
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {
        "decl_typo": {"task": "tests.testapp.tasks.ad", "cron": "* * * * *"},
        "decl_fine": {"task": "tests.testapp.tasks.add", "cron": "* * * * *"}}}
    errors = check_schedules()
    assert [e.id for e in errors] == ["django_dbworker.E004"]
    assert errors[0].msg.startswith(
        "Schedule 'decl_typo' (DBWORKER['SCHEDULES']) names a task that is not registered: "
        "'tests.testapp.tasks.ad' is not a registered task; define it with @task")
    assert "Did you mean 'tests.testapp.tasks.add'?" in errors[0].hint


def test_schedules_that_fire_rarely_or_take_timedeltas_are_accepted(settings):
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {
        "decl_leap": {"task": "tests.testapp.tasks.add", "cron": "0 0 29 2 *",
                      "args": [1, 2], "misfire_window": timedelta(days=31)},
    }}
    assert check_schedules() == []
    assert schedules()["decl_leap"].misfire_window == 31 * 86400


def test_misfire_all_enqueues_a_bounded_number_of_ticks_per_round():
    every_second = Schedule(name="decl_all", task_path="x.y", cron="* * * * * */1",
                            misfire="all", misfire_window=31 * 86400)
    scheduler = Scheduler({"decl_all": every_second}, now=T0)
    due = scheduler.due(every_second, T0)
    assert len(due) == Scheduler.MISSED_PER_ROUND
    assert due[0] == T0 - timedelta(days=31) + timedelta(seconds=1)  # after the last look
    # the next round goes on after the last one enqueued
    assert scheduler._resume["decl_all"] == due[-1]


@pytest.mark.django_db(transaction=True)
def test_misfire_all_catches_up_round_by_round():
    every_second = Schedule(name="decl_all", task_path="tests.testapp.tasks.add",
                            cron="* * * * * */1", args=[1, 2], misfire="all",
                            misfire_window=31 * 86400)
    now = T0
    scheduler = Scheduler({"decl_all": every_second}, now=now)
    assert scheduler.tick(now) == Scheduler.MISSED_PER_ROUND
    first = scheduler.last["decl_all"]
    assert first == now - timedelta(days=31) + timedelta(seconds=100)
    assert scheduler.tick(now) == Scheduler.MISSED_PER_ROUND
    assert scheduler.last["decl_all"] == first + timedelta(seconds=100)
    assert TaskRecord.objects.filter(schedule="decl_all").count() == 200


@pytest.mark.django_db(transaction=True)
def test_one_failing_schedule_is_logged_once_per_interval_and_the_others_go_on(caplog):
    clock = [1000.0]
    gone = Schedule(name="decl_gone", task_path="tests.testapp.tasks.decl_missing",
                    cron="* * * * *")
    never = Schedule(name="decl_never", task_path="tests.testapp.tasks.add", cron="0 0 30 2 *")
    good = Schedule(name="decl_good", task_path="tests.testapp.tasks.add", cron="* * * * *",
                    args=[1, 2])
    scheduler = Scheduler({"decl_gone": gone, "decl_never": never, "decl_good": good},
                          now=T0, clock=lambda: clock[0])
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        assert scheduler.tick(T0 + timedelta(seconds=61)) == 1
        assert scheduler.tick(T0 + timedelta(seconds=121)) == 1
        clock[0] += Scheduler.ERROR_INTERVAL
        assert scheduler.tick(T0 + timedelta(seconds=181)) == 1
    failed = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
        "schedule_failed")]
    gone_lines = [m for m in failed if "schedule=decl_gone" in m]
    never_lines = [m for m in failed if "schedule=decl_never" in m]
    assert len(gone_lines) == 2, failed  # the first round, then one interval later
    assert "not_logged=1" in gone_lines[1]
    assert "tests.testapp.tasks.decl_missing" in gone_lines[0]
    assert len(never_lines) == 2 and "CroniterBadDateError" in never_lines[0]
    assert TaskRecord.objects.filter(schedule="decl_good").count() == 3


def test_a_supervisor_keeps_serving_beside_a_schedule_that_fails_at_run_time(runworkers):
    p = runworkers("--concurrency", "1", extra_env={"DBWORKER_TEST_CRON": "1",
                                                    "DBWORKER_TEST_CRON_BROKEN": "1"})
    wait_for(lambda: TaskRecord.objects.filter(schedule="every_second",
                                               status=TaskStatus.SUCCESSFUL).count() >= 3,
             timeout=30, what="three ticks of the good schedule run")
    result = tasks.add.enqueue(2, 3)
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL,
             timeout=30, what="a plain task to run beside the broken schedule")
    assert p.process.poll() is None, p.output()
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0
    out = p.output()
    lines = [line for line in out.splitlines() if "schedule_failed" in line]
    assert len(lines) == 1, out  # once per interval, not once a second
    assert "schedule=decl_raises" in lines[0] and "user_id" in lines[0]
    assert not TaskRecord.objects.filter(schedule="decl_raises").exists()


# ----- item 4: task options and Unfinished ----------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"retry_delay": math.nan}, r"retry_delay=nan must be a number of seconds >= 0 \(finite\)"),
    ({"retry_delay": math.inf}, r"retry_delay=inf must be a number of seconds"),
    ({"retry_delay": 1e12}, r"retry_delay=1000000000000.0 is more than 3.1536e\+08 seconds"),
    ({"retry_delay": timedelta.max}, r"retry_delay=datetime.timedelta\(days=999999999"),
    ({"retry_max_delay": math.inf}, r"retry_max_delay=inf must be"),
    ({"timeout": math.nan}, r"timeout=nan must be"),
    ({"timeout": math.inf}, r"timeout=inf must be"),
    ({"timeout": timedelta(days=365 * 11)}, r"timeout=datetime.timedelta\(days=4015\) is more"),
    ({"retry_backoff_factor": math.inf}, r"retry_backoff_factor=inf must be a finite number"),
    ({"retry_backoff_factor": math.nan}, r"retry_backoff_factor=nan must be"),
    ({"retry_backoff_factor": 1e6}, r"retry_backoff_factor=1000000.0 must be .* from 1 to 1000"),
    ({"retry_jitter": math.nan}, r"retry_jitter=nan must be"),
    ({"retries": 10**12}, r"retries=1000000000000 must be an integer >= 0 and <= 1000000"),
    ({"rate_limit": "10/0s"}, r"rate_limit: rate '10/0s' is not a rate"),
    ({"rate_limit": "0/s"}, r"rate_limit: rate '0/s' is not a rate"),
    ({"rate_limit": "10/-1s"}, r"rate '10/-1s' is not a rate"),
    ({"rate_limit": "1e400/s"}, r"rate '1e400/s' is not a rate"),
    ({"rate_limit": math.nan}, r"rate nan is not a rate"),
])
def test_non_finite_or_huge_task_options_fail_at_decoration(options, message):
    def f():
        pass

    f.__module__ = "tests.testapp.tasks"
    f.__qualname__ = f.__name__ = "decl_f"
    with pytest.raises(InvalidTask, match=message):
        task(**options)(f)


@pytest.mark.parametrize(("options", "message"), [
    ({"run_after": timedelta.max}, r"run_after=datetime.timedelta\(days=999999999.* must be "
                                   r"a timedelta from 0 to ten years"),
    ({"run_after": timedelta(days=-1)}, r"run_after=datetime.timedelta\(days=-1\) must be"),
    ({"queue_name": "q" * 101}, r"queue_name='q{101}' must be a non-empty string of at most "
                                r"100 characters"),
    ({"enqueue_on_commit": "no"}, r"enqueue_on_commit='no' must be True, False or None"),
])
def test_bad_using_options_are_refused(options, message):
    with pytest.raises(InvalidTask, match=message):
        tasks.add.using(**options)


@pytest.mark.parametrize(("delay", "message"), [
    (math.nan, r"Unfinished\(delay=nan\): delay must be a finite number of seconds >= 0"),
    (math.inf, r"Unfinished\(delay=inf\): delay must be a finite"),
    (-1, r"Unfinished\(delay=-1\): delay must be a finite number of seconds >= 0"),
    (1e12, r"Unfinished\(delay=1000000000000.0\): delay must be at most 3.1536e\+08 seconds"),
    (timedelta.max, r"Unfinished\(delay=datetime.timedelta\(days=999999999.*at most"),
    (timedelta(days=-1), r"Unfinished\(delay=datetime.timedelta\(days=-1\)\): delay must be"),
])
def test_unfinished_refuses_delays_that_overflow(delay, message):
    with pytest.raises(ValueError, match=message):
        Unfinished(delay=delay)


def test_unfinished_accepts_long_delays():
    assert Unfinished(delay=timedelta(days=3650)).seconds == 3650 * 86400


# ----- item 7: the backend's OPTIONS ----------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"ENQUEUE_ON_COMMIT": "no"},
     "TASKS['decl']['OPTIONS']['ENQUEUE_ON_COMMIT'] is 'no'; it must be True or False."),
    ({"ENQUEUE_ON_COMMIT": 1},
     "TASKS['decl']['OPTIONS']['ENQUEUE_ON_COMMIT'] is 1; it must be True or False."),
    ({"ENQUEUE_ON_COMIT": True},
     "TASKS['decl']['OPTIONS'] has unknown keys 'ENQUEUE_ON_COMIT'; DBWorkerBackend knows "
     "ENQUEUE_ON_COMMIT, IMMEDIATE."),
    ({"IMMEDIATE": "yes"},
     "TASKS['decl']['OPTIONS']['IMMEDIATE'] is 'yes'; it must be True or False."),
    ("fast", "TASKS['decl']['OPTIONS'] is str; it must be a dict."),
])
def test_bad_backend_options_are_check_e011_and_refuse_every_task(options, message):
    backend = DBWorkerBackend("decl", {"OPTIONS": options})
    errors = list(backend.check())
    assert [e.id for e in errors] == ["django_dbworker.E011"]
    assert errors[0].msg == message
    assert backend.enqueue_on_commit is False and backend.immediate is False
    with pytest.raises(ImproperlyConfigured) as caught:
        backend.validate_task(tasks.add)
    assert str(caught.value) == message


def test_good_backend_options_pass():
    backend = DBWorkerBackend("decl", {"OPTIONS": {"ENQUEUE_ON_COMMIT": True}})
    assert list(backend.check()) == [] and backend.enqueue_on_commit is True
    immediate = DBWorkerBackend("decl", {"OPTIONS": {"IMMEDIATE": True}})
    assert list(immediate.check()) == [] and immediate.immediate is True
    assert list(DBWorkerBackend("decl", {}).check()) == []


# ----- enqueue-side poison: NUL, size ----------------------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("args", "kwargs"), [
    (("a\x00b", 1), {}),
    (({"k\x00": 1}, 2), {}),
    ((1,), {"b": ["ok", {"deep": "x\x00"}]}),
])
def test_an_argument_with_nul_is_refused_on_every_database(args, kwargs):
    with pytest.raises(InvalidTaskArguments) as caught:
        tasks.add.enqueue(*args, **kwargs)
    assert str(caught.value).startswith(
        "Task 'add': the arguments of call 0 contain a NUL character (U+0000)")
    assert "Nothing was enqueued" in str(caught.value)
    assert not TaskRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_nul_is_refused_by_every_enqueue_path(monkeypatch):
    from asgiref.sync import async_to_sync

    monkeypatch.setattr(newtasks, "BATCH", 4)
    with pytest.raises(InvalidTaskArguments, match="arguments of call 0 contain a NUL"):
        async_to_sync(tasks.add.aenqueue)("\x00", 1)
    with pytest.raises(InvalidTaskArguments, match="arguments of call 0 contain a NUL"):
        tasks.add.using(idempotency_key="decl-nul").enqueue("\x00", 1)
    with pytest.raises(InvalidTaskArguments, match="arguments of call 0 contain a NUL"):
        tasks.add.using(backend="on_commit").enqueue("\x00", 1)
    calls = [((i, i), {}) for i in range(10)]
    calls[6] = (("bad\x00", 1), {})
    with pytest.raises(InvalidTaskArguments, match="arguments of call 6 contain a NUL"):
        tasks.add.enqueue_many(calls)
    assert not TaskRecord.objects.exists(), "nothing of the batch is stored"
    # a backslash and 'u0000' is no NUL
    result = tasks.add.enqueue("\\u0000", 1)
    assert TaskRecord.objects.get(pk=result.id).args == ["\\u0000", 1]


@pytest.mark.django_db(transaction=True)
def test_arguments_larger_than_arguments_max_bytes_are_refused(settings, monkeypatch):
    settings.DBWORKER = {**settings.DBWORKER, "ARGUMENTS_MAX_BYTES": 100}
    monkeypatch.setattr(newtasks, "BATCH", 4)
    fits = "x" * (100 - len('[["", 1], {}]'))
    tasks.add.enqueue(fits, 1)
    assert TaskRecord.objects.count() == 1
    with pytest.raises(InvalidTaskArguments) as caught:
        tasks.add.enqueue(fits + "x", 1)
    assert str(caught.value).startswith(
        "Task 'add': the arguments of call 0 are 101 bytes of JSON, more than "
        "DBWORKER['ARGUMENTS_MAX_BYTES'] (100)")
    calls = [((i, i), {}) for i in range(10)]
    calls[5] = (("y" * 500, 1), {})
    with pytest.raises(InvalidTaskArguments, match=r"arguments of call 5 are 513 bytes"):
        tasks.add.enqueue_many(calls)
    with pytest.raises(InvalidTaskArguments, match=r"call 0 are 513 bytes"):
        tasks.add.using(backend="on_commit").enqueue("y" * 500, 1)
    assert TaskRecord.objects.count() == 1, "nothing of the refused calls is stored"
    # many small calls whose batch is larger than the limit all go in
    assert len(tasks.add.enqueue_many([((i, i), {}) for i in range(10)])) == 10


# ----- retention never stops a supervisor ------------------------------------------------


def _retention(retention):
    from django_dbworker.supervisor.duties.tasks import Retention

    return Retention(replace(dbconf.get(), RETENTION=retention))


@pytest.mark.django_db(transaction=True)
def test_prune_with_the_longest_retentions_deletes_nothing_and_never_overflows():
    old = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=old.id).update(
        status=TaskStatus.SUCCESSFUL, finished_at=timezone.now() - timedelta(days=3650))
    # the longest RETENTION the setting allows, and one past it (a Config built directly)
    for retention in (timedelta(days=365 * 100), timedelta.max, 1e15):
        _retention(retention).run(0.0)
        assert TaskRecord.objects.filter(pk=old.id).exists()
    _retention(60).run(0.0)
    assert not TaskRecord.objects.filter(pk=old.id).exists()


@pytest.mark.django_db(transaction=True)
def test_a_failing_prune_is_logged_once_per_interval(monkeypatch, caplog):
    from django_dbworker.tasks import store as taskstore

    def broken(cutoff, batch):
        raise RuntimeError("decl prune broke")

    monkeypatch.setattr(taskstore, "prune_batch", broken)
    work = _retention(60)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        work.run(0.0)
        work.run(1.0)  # within the interval: not logged again
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("prune_failed")]
    assert len(lines) == 1 and "RuntimeError: decl prune broke" in lines[0], lines


def test_a_rates_longest_period_is_the_longest_duration_of_the_settings():
    from django_dbworker.tasks import rates

    assert rates.MAX_RATE_PERIOD == dbconf.MAX_SECONDS
