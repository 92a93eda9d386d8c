"""Settings validation, system checks, and runworkers' refusals."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from django_dbworker import conf
from django_dbworker.checks import check_settings, check_workers

ROOT = Path(__file__).resolve().parent.parent


def test_defaults():
    with override_settings(DBWORKER={}):
        config = conf.load()
    assert config.LEASE_SECONDS == 30.0 and config.MAX_CRASHES == 3
    assert config.HEARTBEAT_INTERVAL == 2.0
    assert config.DATABASE == "default" and config.MAX_TASKS_PER_CHILD is None
    assert config.PREFETCH == 32 and config.METRICS_PROCESS is True
    assert config.SWEEP_INTERVAL == 2.0 and config.FULL_SWEEP_INTERVAL == 3600.0
    with override_settings(DBWORKER={"FULL_SWEEP_INTERVAL": None}):
        assert conf.load().FULL_SWEEP_INTERVAL is None  # only the first full pass


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"LEASE_SECONDS": "30"}, r"DBWORKER\['LEASE_SECONDS'\] is '30'; it must be a number"),
        ({"LEASE_SECONDS": 0}, r"LEASE_SECONDS'\] is 0; it must be greater than 0"),
        ({"HEARTBEAT_INTERVAL": 0}, r"HEARTBEAT_INTERVAL'\] is 0; it must be greater than 0"),
        ({"HEARTBEAT_INTERVAL": "2"}, r"HEARTBEAT_INTERVAL'\] is '2'; it must be a number"),
        ({"GRACE_PERIOD": -1}, r"GRACE_PERIOD'\] is -1; it must not be negative"),
        ({"STARTUP_WAIT": -1}, r"STARTUP_WAIT'\] is -1; it must not be negative"),
        ({"STARTUP_WAIT": "60"}, r"STARTUP_WAIT'\] is '60'; it must be a number of seconds"),
        ({"STARTUP_WAIT": float("inf")}, r"STARTUP_WAIT'\] is inf; it must be a finite"),
        ({"MAX_CRASHES": 0}, r"MAX_CRASHES'\] is 0; it must be an integer >= 1"),
        ({"CONCURRENCY": 2.5}, r"CONCURRENCY'\] is 2.5; it must be an integer >= 1"),
        ({"CONCURRENCY": 5000}, r"CONCURRENCY'\] is 5000; it must be an integer >= 1 and <= 1000"),
        ({"MAX_TASKS_PER_CHILD": True}, r"MAX_TASKS_PER_CHILD'\] is True"),
        ({"PREFETCH": -1}, r"PREFETCH'\] is -1; it must be an integer >= 0"),
        ({"PREFETCH": 1.5}, r"PREFETCH'\] is 1.5; it must be an integer >= 0"),
        ({"ASYNC_COMMIT": "no"}, r"ASYNC_COMMIT'\] is 'no'; it must be True or False"),
        ({"PREPARED_STATEMENTS": 1},
         r"PREPARED_STATEMENTS'\] is 1; it must be True or False"),
        ({"METRICS_PROCESS": "off"}, r"METRICS_PROCESS'\] is 'off'; it must be True or False"),
        ({"DATABASE": "other"}, r"DATABASE'\] is 'other'; it must name a database"),
        ({"LEASE": 3}, r"unknown keys 'LEASE'; known keys are .*LEASE_SECONDS"),
        ([("LEASE_SECONDS", 3)], r"DBWORKER must be a dict, not list"),
    ],
)
def test_bad_settings_are_named(value, message):
    with override_settings(DBWORKER=value), pytest.raises(ImproperlyConfigured, match=message):
        conf.load()


def test_bad_settings_are_a_system_check_error():
    with override_settings(DBWORKER={"POLL_INTERVAL": "fast"}):
        errors = check_settings()
    assert [e.id for e in errors] == ["django_dbworker.E001"]
    assert "POLL_INTERVAL" in errors[0].msg


def test_workers_check_reports_a_broken_eligible():
    from django_dbworker import Finished, worker, workers
    from tests.testapp.models import Effect, Item

    worker(name="broken_eligible", source=Item, eligible=lambda: Effect.objects.all())(
        lambda item: Finished()
    )
    try:
        errors = check_workers()
    finally:
        workers.remove("broken_eligible")
    assert [e.id for e in errors] == ["django_dbworker.E003"]
    assert "'broken_eligible'" in errors[0].msg


def _manage(*args: str, db: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DBWORKER_TEST_DB": db, "PYTHONPATH": str(ROOT)}
    env.pop("DBWORKER_TEST_DB_NAME", None)
    return subprocess.run(
        [sys.executable, "-m", "django", *args, "--settings=tests.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )


def test_in_memory_sqlite_is_refused():
    result = _manage("runworkers", "--burst", db="memory")
    assert result.returncode != 0
    assert "in-memory SQLite database" in result.stderr
    check = _manage("check", db="memory")
    assert check.returncode != 0
    assert "django_dbworker.E002" in check.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--worker", "nope"], "No worker named 'nope'"),
        (["--concurrency", "0"], "--concurrency 0"),
        (["--concurrency", "99999999999999999999"],
         "--concurrency 99999999999999999999: give at least 1 and at most 1000"),
        (["--max-tasks-per-child", "0"], "--max-tasks-per-child 0"),
        (["--grace-period", "-1"], "--grace-period -1"),
    ],
)
def test_runworkers_bad_options(args, message):
    result = _manage("runworkers", "--burst", *args, db="sqlite")
    assert result.returncode != 0
    assert message in result.stderr


def test_runworkers_refuses_an_unmigrated_database(tmp_path):
    env_db = str(tmp_path / "empty.sqlite3")
    env = {**os.environ, "DBWORKER_TEST_DB": "sqlite", "DBWORKER_TEST_DB_NAME": env_db,
           "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "django", "runworkers", "--burst", "--settings=tests.settings"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "unapplied migration(s)" in result.stderr and "manage.py migrate" in result.stderr
