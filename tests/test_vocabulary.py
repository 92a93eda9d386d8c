"""Vocabulary as data: one mapping per record (an execution, a task, a failed attempt) shown
the same by ``state()``, the CLI's JSON and the admin; querysets that own the status filters;
the kinds of run outcome."""

import json
from datetime import datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.serializers.json import DjangoJSONEncoder
from django.urls import reverse
from django.utils import timezone

from django_dbworker import ExecutionStatus, workers
from django_dbworker.admin import display
from django_dbworker.models import (
    EXECUTION_KEYS,
    FAILURE_KEYS,
    TASK_KEYS,
    Execution,
    State,
    TaskRecord,
    TaskStatus,
)
from django_dbworker.outcomes import RunOutcome
from django_dbworker.testing import run_until_idle
from tests.testapp import tasks
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db


def cli_json(*args):
    out = StringIO()
    call_command("dbworker", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def as_json(value):
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder))


@pytest.fixture
def failed_execution():
    item = Item.objects.create(action="raise")
    run_until_idle(["touch"])
    return item, Execution.objects.get(worker="touch", source_id=str(item.pk))


# ----- one execution mapping ---------------------------------------------------------------

def test_state_and_the_cli_show_one_execution_mapping(failed_execution):
    item, execution = failed_execution
    state = workers["touch"].state(item.pk)
    (doc,) = cli_json("inspect", str(execution.pk))["units"]
    assert tuple(k for k in state if k != "execution_id") == EXECUTION_KEYS
    assert tuple(k for k in doc if k != "status") == EXECUTION_KEYS
    assert state["execution_status"] == ExecutionStatus.FAILED
    assert doc["execution_status"] == "FAILED"
    assert state["source_id"] == item.pk and doc["source_id"] == str(item.pk)  # as given
    assert state["id"] == state["execution_id"] == doc["id"] == execution.pk
    same = [k for k in EXECUTION_KEYS if k not in ("source_id", "errors", "error")]
    assert {k: doc[k] for k in same} == as_json({k: state[k] for k in same})
    assert [tuple(e) for e in state["errors"]] == [FAILURE_KEYS]
    assert state["error"] == state["errors"][-1]
    assert state["error"]["exception_class"] == "builtins.ValueError"
    assert isinstance(state["error"]["occurred_at"], datetime)
    # The CLI's error: the same keys and values, plus "at" (schema 1's name for occurred_at).
    assert [{k: v for k, v in e.items() if k != "at"} for e in doc["errors"]] == \
        as_json(state["errors"])
    assert doc["error"] == doc["errors"][-1]


def test_a_row_without_an_execution_has_the_same_keys():
    state = workers["touch"].state(10**9)
    assert tuple(k for k in state if k != "execution_id") == EXECUTION_KEYS
    assert state["execution_status"] is None and state["id"] is None
    assert state["errors"] == [] and state["error"] is None and state["attempts"] == 0


def test_a_pending_execution_has_no_status_and_keeps_the_old_cli_key():
    item = Item.objects.create(action="ok")
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.PENDING
    (doc,) = cli_json("inspect", str(execution.pk))["units"]
    assert doc["execution_status"] is None and doc["status"] == "PENDING"
    assert workers["touch"].state(item.pk)["execution_status"] is None
    out = StringIO()
    call_command("dbworker", "inspect", str(execution.pk), stdout=out)
    lines = out.getvalue().splitlines()
    assert "  execution_status: PENDING" in lines
    assert not any(line.startswith("  status:") for line in lines), "aliases stay out of tables"


def test_plan_items_name_the_execution_status_and_keep_the_old_key(failed_execution):
    _, execution = failed_execution
    doc = cli_json("retry", str(execution.pk), "--yes")
    (item,) = doc["items"]
    assert item["execution_status"] == "FAILED" and item["status"] == "FAILED"
    assert Execution.objects.get(pk=execution.pk).state == State.UNFINISHED


# ----- one failure mapping, from a task row's stored errors ---------------------------------

@pytest.fixture
def failed_task():
    result = tasks.always_fails.enqueue()
    run_until_idle(tasks=True, worker_names=[])
    return TaskRecord.objects.get(pk=result.id)


def test_stored_task_errors_become_the_failure_mapping_and_stay_as_stored(failed_task):
    stored = failed_task.errors
    assert len(stored) == 3
    assert {"exception_class_path", "at"} <= set(stored[0]), "stored data is not rewritten"
    failures = failed_task.failure_dicts()
    assert [tuple(f) for f in failures] == [FAILURE_KEYS] * 3
    assert [f["exception_class"] for f in failures] == ["builtins.ValueError"] * 3
    assert [f["occurred_at"] for f in failures] == [
        datetime.fromisoformat(e["at"]) for e in stored]
    assert [f["attempt"] for f in failures] == [1, 2, 3]
    assert failed_task.failure_dicts(traceback=False)[0]["traceback"] is None


def test_the_cli_shows_the_task_mapping_with_the_old_error_key(failed_task):
    (doc,) = cli_json("inspect", str(failed_task.pk))["units"]
    assert tuple(doc) == TASK_KEYS
    assert doc["errors"] == [{**e, "at": e["occurred_at"]}
                             for e in as_json(failed_task.failure_dicts())]
    assert doc["error"] == doc["errors"][-1]
    failed = cli_json("dead")
    assert failed["tasks"][0]["errors"][0]["traceback"] is None  # without --tracebacks
    assert failed["tasks"][0]["errors"][0]["occurred_at"] == doc["errors"][0]["occurred_at"]


def test_the_admin_shows_task_errors_from_the_failure_mapping(admin_client, failed_task):
    page = admin_client.get(reverse("admin:django_dbworker_taskrecord_change",
                                    args=[failed_task.pk])).content.decode()
    for failure in failed_task.failure_dicts():
        assert (f"Attempt {failure['attempt']} at {display.moment(failure['occurred_at'])}: "
                f"{failure['exception_class']}") in page


def test_task_errors_changed_outside_still_show(failed_task):
    TaskRecord.objects.filter(pk=failed_task.pk).update(errors=["boom", {"at": "not a time"}])
    failures = TaskRecord.objects.get(pk=failed_task.pk).failure_dicts()
    assert [f["message"] for f in failures] == ["boom", ""]
    assert [f["occurred_at"] for f in failures] == [None, "not a time"]
    (doc,) = cli_json("inspect", str(failed_task.pk))["units"]
    assert [e["at"] for e in doc["errors"]] == [None, "not a time"]


# ----- querysets that own the status filters ------------------------------------------------

def test_each_execution_queryset_method_returns_exactly_its_states():
    now = timezone.now()
    rows = {}
    for i, state in enumerate(State.values):
        for due in (True, False):
            when = now - timedelta(minutes=1) if due else now + timedelta(hours=1)
            rows[state, due] = Execution.objects.create(
                worker="vocabulary", source_id=f"{i}-{due}", state=state, available_at=when).pk

    def pks(qs):
        return set(qs.filter(worker="vocabulary").values_list("pk", flat=True))

    def of(*states, due=(True, False)):
        return {pk for (state, d), pk in rows.items() if state in states and d in due}

    objects = Execution.objects
    assert pks(objects.pending()) == of(State.PENDING)
    assert pks(objects.claimable()) == of(State.PENDING, State.UNFINISHED)
    assert pks(objects.claimable(now)) == of(State.PENDING, State.UNFINISHED, due=(True,))
    assert pks(objects.working()) == of(State.WORKING)
    assert pks(objects.unfinished()) == of(State.UNFINISHED)
    assert pks(objects.finished()) == of(State.FINISHED)
    assert pks(objects.failed()) == of(State.FAILED)


def test_each_task_queryset_method_returns_exactly_its_statuses():
    now = timezone.now()
    rows = {}
    for status in TaskStatus.values:
        for due in (True, False):
            when = now - timedelta(minutes=1) if due else now + timedelta(hours=1)
            rows[status, due] = TaskRecord.objects.create(
                task_path="vocabulary.task", status=status, available_at=when).pk

    def pks(qs):
        return set(qs.filter(task_path="vocabulary.task").values_list("pk", flat=True))

    def of(*statuses, due=(True, False)):
        return {pk for (status, d), pk in rows.items() if status in statuses and d in due}

    objects = TaskRecord.objects
    assert pks(objects.ready()) == of(TaskStatus.READY, TaskStatus.RETRYING)
    assert pks(objects.ready(now)) == of(TaskStatus.READY, TaskStatus.RETRYING, due=(True,))
    assert pks(objects.running()) == of(TaskStatus.RUNNING)
    assert pks(objects.finished()) == of(
        TaskStatus.SUCCESSFUL, TaskStatus.FAILED, TaskStatus.CANCELLED)
    assert pks(objects.successful()) == of(TaskStatus.SUCCESSFUL)
    assert pks(objects.failed()) == of(TaskStatus.FAILED)
    assert pks(objects.cancelled()) == of(TaskStatus.CANCELLED)


def sql(qs):
    compiler = qs.query.get_compiler(using=qs.db)
    text, params = compiler.as_sql()
    return text, params


@pytest.mark.parametrize(("qs", "written", "flag"), [
    (lambda: Execution.objects.claimable(timezone.now()), "IN ('PENDING', 'UNFINISHED')",
     "dbworker_claimable"),
    (lambda: Execution.objects.working(), "= 'WORKING'", "dbworker_working"),
    (lambda: TaskRecord.objects.ready(timezone.now()), "IN ('READY', 'RETRYING')",
     "dbworker_claimable"),
    (lambda: TaskRecord.objects.running(), "= 'RUNNING'", "dbworker_running"),
    (lambda: TaskRecord.objects.finished(), "IN ('SUCCESSFUL', 'FAILED', 'CANCELLED')",
     "dbworker_finished"),
])
def test_status_filters_write_the_states_as_their_partial_indexes_do(qs, written, flag):
    """As ``models.in_states``: constants in the SQL text, in the order of the index's
    condition, so SQLite and PostgreSQL can prove the partial index applies; on
    MariaDB/MySQL the flag column the index leads with (``db.partial``)."""
    text, params = sql(qs())
    from django.db import connection
    if connection.vendor == "mysql":
        written = f"`{flag}` = 1"
    assert written in text
    assert not any(isinstance(p, str) and p.isupper() for p in params), params


# ----- the kinds of run outcome --------------------------------------------------------------

def test_run_outcomes_are_the_names_the_runners_log():
    from django_dbworker.rows import runner
    from django_dbworker.tasks import runner as task_runner

    logged = {runner.FINISHED, runner.UNFINISHED, runner.FAILED, runner.LOST, runner.GONE,
              task_runner.SUCCESSFUL, task_runner.SNOOZED, task_runner.RETRYING,
              task_runner.FAILED, task_runner.LOST, "crashed"}
    assert set(RunOutcome) == logged
    assert RunOutcome.LEASE_LOST == "lease_lost" and str(RunOutcome.GONE) == "gone"
