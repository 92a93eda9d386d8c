"""Cron schedules: ticks, misfire policies, exactly-once enqueue, validation."""

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured

from django_dbworker import cron
from django_dbworker.checks import check_schedules
from django_dbworker.models import TaskRecord
from django_dbworker.tasks.scheduler import Scheduler
from django_dbworker.tasks.schedules import Schedule, schedules
from tests.conftest import ROOT

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)


def every_minute(**options):
    return Schedule(name="m", task_path="tests.testapp.tasks.add", cron="* * * * *",
                    args=[1, 2], **options)


def test_ticks_in_interval_and_time_zone():
    s = every_minute()
    assert s.ticks(T0, T0 + timedelta(minutes=3)) == [
        T0 + timedelta(minutes=n) for n in (1, 2, 3)
    ]
    daily = Schedule(name="d", task_path="x.y", cron="0 9 * * *", timezone="Asia/Tokyo")
    (tick,) = daily.ticks(T0, T0 + timedelta(days=1))
    assert tick == datetime(2026, 12, 1, 0, 0, tzinfo=UTC), "09:00 in Tokyo is 00:00 UTC"


def test_seconds_field():
    s = Schedule(name="s", task_path="x.y", cron="* * * * * */10")
    assert len(s.ticks(T0, T0 + timedelta(minutes=1))) == 6


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("skip", 0), ("latest", 1), ("all", 10)],
)
def test_misfire_policies_at_start(policy, expected):
    s = every_minute(misfire=policy, misfire_window=600)
    scheduler = Scheduler({"m": s}, now=T0)
    # ten ticks were missed before this look, none is recent
    scheduler.last["m"] = T0 - timedelta(minutes=10, seconds=30) if policy != "skip" else T0
    due = scheduler.due(s, T0 + timedelta(seconds=30))
    assert len(due) == expected


def test_recent_ticks_always_due():
    s = every_minute()
    scheduler = Scheduler({"m": s}, now=T0)
    assert scheduler.due(s, T0 + timedelta(seconds=61)) == [T0 + timedelta(minutes=1)]


@pytest.mark.django_db(transaction=True)
def test_each_tick_enqueued_once_by_any_number_of_schedulers():
    s = every_minute()
    a, b = Scheduler({"m": s}, now=T0), Scheduler({"m": s}, now=T0)
    later = T0 + timedelta(seconds=125)
    assert a.tick(T0 + timedelta(seconds=61)) == 1
    assert b.tick(T0 + timedelta(seconds=61)) == 0
    assert a.tick(later) + b.tick(later) == 1
    rows = TaskRecord.objects.order_by("enqueued_at")
    assert [r.idempotency_key for r in rows] == [
        "cron:m:2026-11-30T12:01:00+00:00", "cron:m:2026-11-30T12:02:00+00:00"
    ]
    assert all(r.schedule == "m" and r.args == [1, 2] for r in rows)


def test_decorator_registers_and_validates():
    from django_dbworker.djtasks import task
    from django_dbworker.tasks import schedules as scheduling
    from tests.testapp import tasks

    cron("*/5 * * * *", name="five", args=[1, 2])(tasks.add)
    try:
        assert schedules()["five"].task_path == "tests.testapp.tasks.add"
    finally:
        scheduling._declared.pop("five")

    def f():
        pass

    f.__qualname__ = f.__name__ = "f"
    with pytest.raises(ImproperlyConfigured, match="'bad'.*not a valid cron expression"):
        cron("61 * * * *", name="bad")(task(f))
    with pytest.raises(ImproperlyConfigured, match="misfire='sometimes'"):
        cron("* * * * *", name="bad2", misfire="sometimes")(task(f))
    with pytest.raises(ImproperlyConfigured, match="put it above @task"):
        cron("* * * * *")(f)


def test_settings_schedules_and_check(settings):
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {
        "nightly": {"task": "tests.testapp.tasks.add", "cron": "0 3 * * *", "args": [1, 1]},
    }}
    assert schedules()["nightly"].cron == "0 3 * * *"
    assert check_schedules() == []
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {
        "broken": {"task": "tests.testapp.tasks.add", "cron": "every day"},
    }}
    errors = check_schedules()
    assert [e.id for e in errors] == ["django_dbworker.E004"]
    assert "'broken'" in errors[0].msg
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {"x": {"cron": "* * * * *"}}}
    assert "'task' and 'cron'" in check_schedules()[0].msg


def test_a_supervisor_without_schedules_does_not_load_croniter():
    """croniter (and dateutil) is 4.7 MB in the supervisor and in each child forked from it:
    imported only where a schedule is read."""
    code = ("import sys, django; django.setup(); "
            "import django_dbworker.management.commands.runworkers; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('croniter', 'dateutil')))")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]", out
    every5 = Schedule(name="m", task_path="x.y", cron="*/5 * * * *")
    assert len(every5.ticks(T0, T0 + timedelta(minutes=10))) == 2, "loaded when needed"
