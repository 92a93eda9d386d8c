"""The unit protocol (``units.protocol.Unit``): both kinds of unit implement it, and one
row unit and one task unit go through the same protocol calls against the database."""

from __future__ import annotations

import pickle
import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker import workers
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.rows import planner, store
from django_dbworker.rows.runner import Result
from django_dbworker.rows.unit import RowUnit
from django_dbworker.supervisor import units
from django_dbworker.supervisor.units import KINDS, Unit
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks.unit import TaskUnit, is_task
from django_dbworker.units.claimant import Claimant
from django_dbworker.units.failures import FailureInfo
from tests.testapp import tasks
from tests.testapp.models import Item

MEMBERS = ["kind", "unit_pk", "token", "attempt", "group", "begins_next", "describe",
           "concurrent", "timeout", "time_out", "paused", "run", "result", "fail", "release"]


def row_claim() -> RowUnit:
    now = timezone.now()
    return RowUnit(7, "touch", "42", uuid.uuid4(), 2, now)


def task_claim() -> TaskUnit:
    now = timezone.now()
    return TaskUnit(uuid.uuid4(), "tests.testapp.tasks.add", uuid.uuid4(), 3, now, now)


# ----- the protocol, without a database ----------------------------------------------


@pytest.mark.parametrize("make", [row_claim, task_claim])
def test_both_kinds_implement_the_protocol(make):
    c = make()
    assert isinstance(c, Unit)
    assert all(hasattr(c, name) for name in MEMBERS)
    assert c.kind in KINDS


@pytest.mark.parametrize("make", [row_claim, task_claim])
def test_a_unit_stays_a_slotted_value_that_crosses_the_pipe(make):
    """A unit is its store's slotted claim with methods: no ``__dict__``, and a unit
    pickled to a child comes back equal, with its methods."""
    c = make()
    assert not hasattr(c, "__dict__")
    again = pickle.loads(pickle.dumps(c))
    assert again == c and again.group == c.group and again.kind is c.kind


def test_group_and_describe_of_a_row_unit():
    c = row_claim()
    assert c.group == units.group(c) == "touch"
    assert units.describe(c) == {"worker": "touch", "execution": 7, "source": "42",
                                 "attempt": 2}
    assert c.kind.name == "execution" and c.unit_pk == 7
    assert not is_task(c)


def test_group_and_describe_of_a_task_unit():
    c = task_claim()
    assert c.group == units.group(c) == "task:tests.testapp.tasks.add"
    assert units.describe(c) == {"task": "tests.testapp.tasks.add", "id": c.task_id,
                                 "attempt": 3}
    assert c.kind.name == "task" and c.unit_pk == c.task_id
    assert is_task(c)


def test_a_store_claim_becomes_its_unit_once():
    """The stores know claims as data; the planners make them units (``RowUnit.of``)."""
    now = timezone.now()
    data = store.Claim(7, "touch", "42", uuid.uuid4(), 2, now)
    (unit,) = RowUnit.of([data])
    assert isinstance(unit, RowUnit) and not isinstance(data, Unit)
    assert (unit.execution_id, unit.token, unit.lease_expires_at) == (7, data.token, now)
    assert RowUnit.of([unit])[0] is unit
    task = taskstore.TaskClaim(uuid.uuid4(), "tests.testapp.tasks.add", uuid.uuid4(), 3, now,
                               now, ("values",))
    (tunit,) = TaskUnit.of([task])
    assert isinstance(tunit, TaskUnit) and tunit.values == ("values",)


def test_each_unit_says_its_timeout_and_its_pause():
    r, t = row_claim(), task_claim()
    assert r.timeout() == (workers["touch"].timeout_seconds, "handler")
    assert t.timeout() == (None, "task")
    assert r.paused(frozenset({"default"}), frozenset({"touch"}))
    assert not r.paused(frozenset({"default"}), frozenset())
    assert not t.paused(frozenset({"default"}), frozenset({"touch"}))  # no row: it runs
    assert r.begins_next and not t.begins_next
    assert not r.concurrent() and not t.concurrent()  # sync handlers


def test_result_reports_each_kind_by_its_id_and_its_worker_or_task():
    r, t = row_claim(), task_claim()
    assert r.result("failed", 1.5, "E: boom") == Result(7, "touch", "failed", 1.5, "E: boom")
    assert t.result("lease_lost", 0.0) == Result(str(t.task_id), t.task_path, "lease_lost",
                                                 0.0, "")


def test_fallback_names_the_kind():
    exc = RuntimeError("boom")
    assert "recording this execution: boom" in units.fallback(row_claim(), exc).message
    assert "recording this task: boom" in units.fallback(task_claim(), exc).message


def test_units_are_grouped_by_kind_executions_first_whatever_the_order():
    r, t = row_claim(), task_claim()
    grouped = units.by_kind([t, r, t])
    assert list(grouped) == list(KINDS)
    assert [len(g) for g in grouped.values()] == [1, 2]
    assert all(c.kind is kind for kind, g in grouped.items() for c in g)


# ----- one row unit and one task unit through the same calls, on the database --------


@pytest.fixture
def claimed(transactional_db: None) -> list[Unit]:
    """One claimed row unit (worker ``touch``) and one claimed task unit (``add``)."""
    Item.objects.create()
    tasks.add.enqueue(2, 3)
    claimant = Claimant()
    (row,) = planner.claim(workers["touch"], 1, claimant, 30)
    (task,) = taskplanner.claim(None, 1, claimant, 30)
    return [row, task]


def status(c: Unit) -> str:
    if is_task(c):
        return TaskRecord.objects.get(pk=c.unit_pk).status
    return Execution.objects.get(pk=c.unit_pk).state


def test_run_runs_and_records_either_kind(claimed):
    outcomes = [units.run(c).outcome for c in claimed]
    assert outcomes == ["finished", "successful"]
    assert [status(c) for c in claimed] == [State.FINISHED, TaskStatus.SUCCESSFUL]
    assert TaskRecord.objects.get(pk=claimed[1].unit_pk).return_value == 5


def test_renew_extends_both_kinds_in_one_call(claimed):
    claimant = Claimant()
    assert units.renew(claimant, 3600, tasks=True) == 0  # not ours: nothing renewed
    owner = Execution.objects.get(pk=claimed[0].unit_pk).supervisor_id
    soon = timezone.now() + timedelta(seconds=3000)
    assert units.renew(Claimant(supervisor_id=owner), 3600, tasks=True) == 2
    assert Execution.objects.get(pk=claimed[0].unit_pk).lease_expires_at > soon
    assert TaskRecord.objects.get(pk=claimed[1].unit_pk).lease_expires_at > soon


def test_unclaim_gives_both_kinds_back_in_one_call(claimed):
    assert units.unclaim(claimed) == 2
    assert [status(c) for c in claimed] == [State.PENDING, TaskStatus.READY]


def test_release_gives_either_kind_back(claimed):
    assert [units.release(c, crashed=None, max_crashes=3) for c in claimed] == [1, 1]
    assert [status(c) for c in claimed] == [State.UNFINISHED, TaskStatus.READY]
    assert [units.release(c, crashed=None, max_crashes=3) for c in claimed] == [0, 0]


def test_fail_records_either_kind_failed_with_its_info(claimed):
    info = FailureInfo("builtins.RuntimeError", "the child's last word")
    assert [units.fail(c, info) for c in claimed] == [1, 1]
    assert [status(c) for c in claimed] == [State.FAILED, TaskStatus.FAILED]
    assert Failure.objects.get(execution_id=claimed[0].unit_pk).message == info.message
    (error,) = TaskRecord.objects.get(pk=claimed[1].unit_pk).errors
    assert error["exception_class_path"] == info.exception_class
    assert [units.fail(c, info) for c in claimed] == [0, 0]  # its token is gone
