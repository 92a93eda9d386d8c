"""Operators' surface outside the admin: system checks, JSON logs, health and metrics
views, and the supervisor's heartbeat row."""

import json
import logging
import signal
import sys
import uuid
from types import SimpleNamespace

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db.migrations.recorder import MigrationRecorder
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from django_dbworker import conf
from django_dbworker.checks import check_migrations, check_workers
from django_dbworker.logs import JsonFormatter, log_event
from django_dbworker.models import Supervisor, TaskRecord
from django_dbworker.rows.registry import workers
from django_dbworker.testing import run_until_idle
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Item

# ----- settings and checks -------------------------------------------------------------


@pytest.mark.parametrize(("value", "message"), [
    ({"LOG_FORMAT": "xml"}, r"LOG_FORMAT'\] is 'xml'; it must be one of 'text', 'json'"),
    ({"HEALTH_MAX_LAG": 0}, r"HEALTH_MAX_LAG'\] is 0; it must be greater than 0"),
    ({"HEALTH_MIN_SUPERVISORS": -1}, r"HEALTH_MIN_SUPERVISORS'\] is -1; it must be an integer"),
])
def test_operator_settings_are_validated(value, message):
    with override_settings(DBWORKER=value), pytest.raises(ImproperlyConfigured, match=message):
        conf.load()


def test_a_worker_over_a_model_without_a_single_pk_is_e005():
    meta = SimpleNamespace(pk=None, label="shop.OrderLine")
    fake = SimpleNamespace(name="lines", source=SimpleNamespace(_meta=meta), handler=None)
    workers._workers["lines"] = fake
    try:
        errors = check_workers()
    finally:
        workers.remove("lines")
    assert [e.id for e in errors] == ["django_dbworker.E005"]
    assert "shop.OrderLine has no single-column primary key" in errors[0].msg


@pytest.mark.django_db
def test_unapplied_migrations_are_w002():
    assert check_migrations(databases=["default"]) == []
    assert check_migrations(databases=None) == [], "only with --database"
    MigrationRecorder.Migration.objects.filter(app="django_dbworker",
                                               name="0003_supervisor").delete()
    warnings = check_migrations(databases=["default"])
    assert [w.id for w in warnings] == ["django_dbworker.W002"]
    assert "0003_supervisor" in warnings[0].msg


# ----- JSON logs -----------------------------------------------------------------------


def test_text_log_lines_stay_one_line_per_event(caplog):
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        log_event(logging.WARNING, "database_error", retry_in=0.5,
                  error='connection failed: Connection refused\n\tIs the server "up"?\r\n')
    message = caplog.records[-1].getMessage()
    assert "\n" not in message and "\r" not in message
    assert message == ('database_error retry_in=0.5 error="connection failed: Connection '
                       'refused\\n\tIs the server \\"up\\"?\\r\\n"')


def test_a_listen_that_fails_is_logged_once_and_tried_again_later(vendor, caplog, monkeypatch):
    if vendor != "postgresql":
        pytest.skip("LISTEN is PostgreSQL's")
    from django.db import connection

    from django_dbworker.supervisor import wakeups

    listener = wakeups.Listener(connection.alias)
    real_port = connection.settings_dict["PORT"]
    monkeypatch.setitem(connection.settings_dict, "PORT", "1")  # nothing listens there
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        for _ in range(5):
            assert listener.fileno() is None
        failed = [r for r in caplog.records if r.getMessage().startswith("listen_failed")]
        assert len(failed) == 1, "once per outage, not once per loop"
        assert "retry_in=1.0" in failed[0].getMessage()
        listener._retry_at = 0.0  # as if a second had passed: the next try fails again
        assert listener.fileno() is None and listener._delay == 2.0
        monkeypatch.setitem(connection.settings_dict, "PORT", real_port)
        listener._retry_at = 0.0
        assert listener.fileno() is not None, "LISTEN works again"
    messages = [r.getMessage() for r in caplog.records]
    assert sum(m.startswith("listen_failed") for m in messages) == 1
    assert "listening after_failures=2" in messages
    listener.close()


def test_json_formatter_writes_one_object_per_event(caplog):
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        log_event(logging.ERROR, "failed", worker="touch", execution=7, attempt=2,
                  seconds=0.25, id=uuid.UUID(int=1), error='ValueError: "quoted"', empty="")
    record = caplog.records[-1]
    doc = json.loads(JsonFormatter().format(record))
    assert doc["event"] == "failed" and doc["level"] == "error"
    assert doc["worker"] == "touch" and doc["execution"] == 7 and doc["seconds"] == 0.25
    assert doc["id"] == "00000000-0000-0000-0000-000000000001"
    assert doc["error"] == 'ValueError: "quoted"' and "empty" not in doc
    plain = logging.LogRecord("django", logging.INFO, __file__, 1, "hello %s", ("you",), None)
    assert json.loads(JsonFormatter().format(plain))["event"] == "hello you"


@pytest.mark.processes
def test_runworkers_log_format_json(runworkers):
    Item.objects.create(action="raise")
    Item.objects.create(action="ok")
    tasks.add.enqueue(2, 3)
    p = runworkers("--burst", "--concurrency", "1", "--log-format", "json", "-v", "3")
    assert p.wait(60) == 0, p.output()
    lines = [line for line in p.output().splitlines() if line.strip()]
    docs = [json.loads(line) for line in lines]  # every line is one JSON object
    events = {d["event"] for d in docs}
    assert {"supervisor_started", "claimed", "started", "finished", "failed", "successful",
            "supervisor_stopped"} <= events
    failed = next(d for d in docs if d["event"] == "failed")
    assert failed["worker"] == "touch" and failed["attempt"] == 1
    assert "seconds" in failed and failed["error"].startswith("builtins.ValueError")
    task = next(d for d in docs if d["event"] == "successful")
    assert task["task"] == "tests.testapp.tasks.add" and uuid.UUID(task["id"])


# ----- health and metrics ------------------------------------------------------------------


def beating(**fields):
    now = timezone.now()
    return Supervisor.objects.create(**{
        "id": uuid.uuid4(), "host": "h", "pid": 1, "started_at": now, "last_heartbeat": now,
        "heartbeat_expires_at": now + timezone.timedelta(seconds=30), **fields})


@pytest.mark.django_db
def test_health_needs_a_live_supervisor_and_little_lag(client):
    url = reverse("django_dbworker:health")
    response = client.get(url)
    assert response.status_code == 503
    assert "0 supervisor(s) alive" in response.json()["problems"][0]
    beating()
    assert client.get(url).status_code == 200
    result = tasks.add.enqueue(1, 1)
    TaskRecord.objects.filter(pk=result.id).update(
        available_at=timezone.now() - timezone.timedelta(minutes=10))
    with override_settings(DBWORKER={"HEALTH_MAX_LAG": 60}):
        response = client.get(url)
    assert response.status_code == 503
    assert response.json()["problems"] == [
        "queue:default has waited 600s; DBWORKER['HEALTH_MAX_LAG'] is 60s"]
    with override_settings(DBWORKER={"HEALTH_MAX_LAG": None}):
        assert client.get(url).status_code == 200


@pytest.mark.django_db
def test_worker_lag_counts_only_eligible_waiting_units(client):
    beating()
    Item.objects.create(kind="other")  # pending for touch, but not eligible: no lag
    from django_dbworker.models import Execution

    Execution.objects.update(available_at=timezone.now() - timezone.timedelta(hours=1))
    assert client.get(reverse("django_dbworker:health")).json()["lag_seconds"][
        "worker:touch"] is None
    Item.objects.create(kind="touch")
    Execution.objects.update(available_at=timezone.now() - timezone.timedelta(hours=1))
    body = client.get(reverse("django_dbworker:health")).json()
    assert body["lag_seconds"]["worker:touch"] >= 3599
    assert client.get(reverse("django_dbworker:health")).status_code == 503


@pytest.mark.django_db
def test_metrics_in_prometheus_text_format(client):
    Item.objects.create(action="raise")
    tasks.add.enqueue(1, 1)
    run_until_idle()
    beating()
    response = client.get(reverse("django_dbworker:metrics"))
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    assert "# TYPE dbworker_executions gauge" in text
    # prometheus_client writes labels sorted by name and values as floats ("1.0"): compare
    # the parsed samples, not the lines.
    values = samples(text)
    assert values["dbworker_executions", ("status", "failed"), ("worker", "touch")] == 1
    assert values["dbworker_tasks", ("queue", "default"), ("status", "successful")] == 1
    assert values["dbworker_completed", ("window", "15m"), ("worker", "touch")] == 1
    assert values["dbworker_failed", ("exception_class", "builtins.ValueError"),
                  ("worker", "touch")] == 1
    assert values["dbworker_supervisors", ("state", "alive")] == 1
    assert ("dbworker_duration_seconds", ("queue", "default"), ("stat", "avg")) in values


def samples(text):
    """{(name, *sorted label pairs): value} of every sample of a Prometheus text."""
    return {(s.name, *sorted(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


METRIC_HELP = {
    "dbworker_executions": "Executions by worker and status (pending: not claimed yet).",
    "dbworker_tasks": "Tasks by queue and status.",
    "dbworker_lag_seconds": "Seconds the oldest due waiting unit has waited (0: none).",
    "dbworker_completed": "Units completed in the last window (1m, 5m, 15m).",
    "dbworker_duration_seconds": "Run time of units completed in the last 15 minutes.",
    "dbworker_failed": "Units FAILED for good, by their last exception class.",
    "dbworker_supervisors": "Supervisors seen in the last day, by state.",
    "dbworker_paused_since_seconds": "Unix time a paused worker or queue was paused "
                                     "(only paused ones have a sample).",
    "dbworker_oldest_transaction_seconds": "Seconds the oldest open transaction of another "
                                           "connection has run (0: none).",
    "dbworker_dead_rows": "Dead row versions of the units' tables (PostgreSQL).",
    "dbworker_history_list_length": "Row versions waiting for InnoDB's purge "
                                    "(MariaDB/MySQL).",
}


@pytest.mark.django_db
def test_metrics_families_parse_with_their_names_types_and_help(client):
    Item.objects.create(action="raise")
    tasks.add.enqueue(1, 1)
    run_until_idle()
    response = client.get(reverse("django_dbworker:metrics"))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert response["Cache-Control"] == "max-age=0, no-cache, no-store, must-revalidate, private"
    parsed = {f.name: f for f in text_string_to_metric_families(response.content.decode())}
    for name, help_text in METRIC_HELP.items():  # every family, with or without samples
        assert parsed[name].type == "gauge" and parsed[name].documentation == help_text
    labels = {name: {frozenset(s.labels) for s in parsed[name].samples} for name in METRIC_HELP}
    assert labels["dbworker_executions"] == {frozenset({"worker", "status"})}
    assert frozenset({"queue", "status"}) in labels["dbworker_tasks"]
    assert labels["dbworker_lag_seconds"] >= {frozenset({"worker"}), frozenset({"queue"})}
    assert labels["dbworker_supervisors"] == {frozenset({"state"})}


@pytest.mark.django_db
def test_metrics_carry_the_serving_process_unless_turned_off(client):
    url = reverse("django_dbworker:metrics")
    names = {f.name for f in text_string_to_metric_families(client.get(url).content.decode())}
    assert {"python_info", "python_gc_objects_collected", "python_gc_collections"} <= names
    if sys.platform == "linux":  # the library reads /proc
        assert {"process_cpu_seconds", "process_resident_memory_bytes"} <= names
    with override_settings(DBWORKER={"METRICS_PROCESS": False}):
        text = client.get(url).content.decode()
    names = {f.name for f in text_string_to_metric_families(text)}
    assert names == set(METRIC_HELP)
    assert "process_" not in text and "python_" not in text


# ----- the supervisor's heartbeat ------------------------------------------------------------


@pytest.mark.processes
def test_heartbeat_shows_what_runs_and_marks_a_clean_stop(runworkers):
    # Not transactional: on SQLite a transactional handler holds the only write lock, and
    # the heartbeat (like the lease renewal) waits for it.
    item = Item.objects.create(kind="loose", action="sleep:30")
    p = runworkers("--worker", "loose", "--concurrency", "2", lease=1.5)
    row = wait_for(lambda: Supervisor.objects.filter(pid=p.pid).exclude(running=[]).first(),
                   what="a heartbeat naming the running unit")
    assert row.state() == "alive" and row.concurrency == 2 and row.workers == ["loose"]
    assert row.queues == [] and not row.burst
    unit = row.running[0]
    assert unit["worker"] == "loose" and unit["source"] == str(item.pk) and unit["child"]
    first = row.last_heartbeat
    wait_for(lambda: Supervisor.objects.get(pk=row.pk).last_heartbeat > first,
             what="the next heartbeat (every third of the lease)")
    p.signal(signal.SIGTERM)
    p.signal(signal.SIGTERM)  # do not wait for the 30 s handler
    p.wait(30)
    row.refresh_from_db()
    assert row.state() == "stopped" and row.exit_code is not None and row.running == []


@pytest.mark.processes
def test_a_killed_supervisor_shows_as_dead(runworkers):
    from django.core.management import call_command

    Item.objects.create(kind="loose", action="sleep:30")
    p = runworkers("--worker", "loose", "--concurrency", "1", lease=1.5)
    row = wait_for(lambda: Supervisor.objects.filter(pid=p.pid).exclude(running=[]).first(),
                   what="the supervisor's heartbeat")
    p.signal_group(signal.SIGKILL)
    p.wait(10)
    wait_for(lambda: Supervisor.objects.get(pk=row.pk).state() == "dead", timeout=10,
             what="the heartbeat to go stale")
    import io

    out = io.StringIO()
    call_command("dbworker", "supervisors", "--dead", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert [s["pid"] for s in doc["supervisors"]] == [p.pid]
    assert doc["supervisors"][0]["running"][0]["worker"] == "loose"
