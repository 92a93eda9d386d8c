"""A unit's bad value fails that unit, once, with its real cause (#16 items 1 and 2),
in-process: the runners, the child's containment of one unit (``child.run_one``) and the
batched record of successes, on both databases. ``test_poison_processes.py`` has the
same cases through real ``runworkers``."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import DataError, IntegrityError, connection
from django.utils import timezone

from django_dbworker import conf
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.rows import planner, store
from django_dbworker.supervisor import child, units
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import registry as task_registry
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks.completions import Completions, Kept
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from django_dbworker.units.failures import FailureInfo, recording
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


def claim_task(result_id: object) -> taskstore.TaskClaim:
    (c,) = [c for c in taskplanner.claim(None, 50, Claimant(), 30) if str(c.task_id) == str(
        result_id)] or [None]
    assert c is not None, "the task was not claimed"
    return c


def run_in_child(c: units.Unit) -> list[tuple]:
    """What a child reports of one unit (``child.run_one``, as ``child.main`` runs it)."""
    report: list[tuple] = []
    child.run_one(0, c, "default", report)
    return report


def only_error(result_id: object) -> dict:
    row = TaskRecord.objects.get(pk=result_id)
    assert row.status == TaskStatus.FAILED, (row.status, row.errors)
    assert len(row.errors) == 1, row.errors
    return row.errors[0]


# ----- FailureInfo: one place where stored text is made safe ---------------------------


def test_failure_info_replaces_nul_with_a_visible_escape():
    info = FailureInfo("x.Error\x00", "a\x00b", "tb\x00")
    assert (info.exception_class, info.message, info.traceback) == (
        "x.Error\\x00", "a\\x00b", "tb\\x00")


def test_failure_info_of_an_unprintable_exception_says_so_and_formats_its_traceback():
    try:
        raise tasks.Unprintable()
    except tasks.Unprintable as exc:
        info = FailureInfo.caught(exc)
    assert info.exception_class == "tests.testapp.workers.Unprintable"
    assert info.message == ("<unprintable Unprintable: str() raised TypeError: "
                            "str() of this exception is broken>")
    assert "test_failure_info_of_an_unprintable" in info.traceback


# ----- tasks ---------------------------------------------------------------------------


@pytest.mark.parametrize("nested", [False, True])
def test_a_returned_nul_fails_the_task_with_where_and_the_fix(nested):
    result = tasks.poison_return_nul.enqueue(nested)
    run_until_idle()
    error = only_error(result.id)
    assert error["exception_class_path"] == "django_dbworker.exceptions.InvalidTaskArguments"
    assert "contains a NUL character (U+0000)" in error["message"]
    assert "strip it" in error["message"]
    where = "['outer'][1]" if nested else "the top level"
    assert f"at {where}" in error["message"], error["message"]


def test_a_raised_nul_is_stored_escaped_once():
    result = tasks.poison_raise_nul.enqueue()
    run_until_idle()
    error = only_error(result.id)
    assert error["exception_class_path"] == "builtins.ValueError"
    assert error["message"] == "a\\x00b"
    assert "ValueError: a\\x00b" in error["traceback"]


def test_an_unprintable_exception_fails_its_task_with_a_description():
    result = tasks.poison_unprintable.enqueue()
    run_until_idle()
    error = only_error(result.id)
    assert error["exception_class_path"] == "tests.testapp.workers.Unprintable"
    assert "<unprintable Unprintable: str() raised TypeError" in error["message"]


def test_a_progress_message_with_nul_is_stored_escaped():
    result = tasks.poison_progress_nul.enqueue()
    run_until_idle()
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskStatus.SUCCESSFUL
    assert row.progress_message == "half\\x00way"


@pytest.mark.parametrize("stored", [{"a": 1}, [1, 2], "oops", [{"traceback": 3}]])
def test_a_tampered_errors_value_fails_the_task_naming_it(stored):
    result = tasks.poison_innocent.enqueue(1)
    TaskRecord.objects.filter(pk=result.id).update(errors=stored)
    report = run_in_child(claim_task(result.id))
    assert report[0][1] == "result" and report[0][2].outcome == "failed", report
    error = only_error(result.id)
    assert "its stored errors value" in error["message"]
    assert "changed outside django-dbworker" in error["message"]
    assert not Effect.objects.filter(worker="poison_innocent").exists()


@pytest.mark.parametrize("change", [{"priority": 1000}, {"queue_name": "nowhere"}])
def test_a_tampered_priority_or_queue_fails_the_task_naming_it(change):
    result = tasks.poison_innocent.enqueue(1)
    TaskRecord.objects.filter(pk=result.id).update(**change)
    report = run_in_child(claim_task(result.id))
    assert report[0][2].outcome == "failed", report
    error = only_error(result.id)
    assert f"task row {result.id} cannot be run as stored" in error["message"]
    (value,) = change.values()
    assert str(value) in error["message"], error["message"]


def test_an_overflowing_retry_delay_is_capped_at_retry_max_delay():
    result = tasks.poison_retry_overflow.enqueue()
    TaskRecord.objects.filter(pk=result.id).update(attempts=5000)  # 1000 ** 5000 seconds
    before = timezone.now()
    report = run_in_child(claim_task(result.id))
    assert report[0][2].outcome == "retrying", report
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskStatus.RETRYING
    assert before + timedelta(seconds=590) < row.available_at < \
        timezone.now() + timedelta(seconds=610)
    assert row.errors[-1]["message"] == "poison: fails again"


def test_retry_at_caps_any_delay():
    from django_dbworker.tasks import retry

    now = timezone.now()
    assert retry.at(now, float("inf")) == now + timedelta(seconds=conf.MAX_DELAY)
    assert retry.at(now, float("nan")) == now + timedelta(seconds=conf.MAX_DELAY)
    assert retry.at(now, 1e300) == now + timedelta(seconds=conf.MAX_DELAY)


@pytest.mark.parametrize("raised", [RuntimeError("resolver is broken"),
                                    ZeroDivisionError("division by zero")])
def test_anything_raised_by_resolve_fails_the_task_with_its_cause(monkeypatch, raised):
    result = tasks.poison_innocent.enqueue(1)

    def broken(path):
        raise raised

    monkeypatch.setattr(task_registry, "resolve", broken)
    report = run_in_child(claim_task(result.id))
    monkeypatch.undo()
    assert report[0][2].outcome == "failed", report
    error = only_error(result.id)
    assert error["exception_class_path"] == f"builtins.{type(raised).__name__}"
    assert "looking up the task 'tests.testapp.tasks.poison_innocent' raised" in \
        error["message"]
    assert str(raised) in error["message"]


def test_a_module_raising_at_import_fails_only_its_task():
    result = tasks.poison_innocent.enqueue(1)
    TaskRecord.objects.filter(pk=result.id).update(
        task_path="tests.testapp.poison_boom.anything")
    report = run_in_child(claim_task(result.id))
    assert report[0][2].outcome == "failed", report
    error = only_error(result.id)
    assert "tests.testapp.poison_boom.anything" in error["message"]


# ----- the generic guard: a database error while recording -----------------------------


def test_a_database_error_while_recording_fails_the_unit_with_a_fallback_record(monkeypatch):
    result = tasks.poison_innocent.enqueue(1)
    c = claim_task(result.id)
    real = taskstore.succeed_many

    def refuse(done):
        with recording("its return value"):
            raise DataError("value refused\x00 by the database")

    monkeypatch.setattr(taskstore, "succeed_many", refuse)
    report = run_in_child(c)
    monkeypatch.setattr(taskstore, "succeed_many", real)
    assert report[0][2].outcome == "failed", report
    error = only_error(result.id)
    assert error["exception_class_path"] == "django.db.utils.DataError"
    assert error["message"].startswith(
        "the database refused recording its return value with DataError: value "
        "refused\\x00 by the database; the task is marked FAILED"), error["message"]


def test_a_fallback_record_that_fails_too_is_reported_for_a_crash_release(monkeypatch):
    result = tasks.poison_innocent.enqueue(1)
    c = claim_task(result.id)

    def refuse(*args, **kwargs):
        raise IntegrityError("refused again")

    monkeypatch.setattr(taskstore, "succeed_many", refuse)
    monkeypatch.setattr(taskstore, "fail_attempt", refuse)
    report = run_in_child(c)
    monkeypatch.undo()
    (_seq, kind, info, error) = report[0]
    assert kind == "unrecordable" and error == "refused again"
    assert isinstance(info, FailureInfo) and "IntegrityError" in info.message
    # What the supervisor then does: a crash release, so MAX_CRASHES ends it.
    for _ in range(3):
        units.release(c, crashed=info, max_crashes=3)
        if TaskRecord.objects.get(pk=result.id).status == TaskStatus.FAILED:
            break
        c = claim_task(result.id)
    row = TaskRecord.objects.get(pk=result.id)
    assert row.status == TaskStatus.FAILED
    assert "MAX_CRASHES" in row.errors[-1]["message"]


def test_a_lost_connection_gives_the_unit_back_unfailed(monkeypatch):
    from django.db import OperationalError

    result = tasks.poison_innocent.enqueue(1)
    c = claim_task(result.id)

    def lose(*args, **kwargs):
        connection.close()
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(taskstore, "succeed_many", lose)
    report = run_in_child(c)
    monkeypatch.undo()
    # The database answered a new connection at once: its session ended, not the
    # database; the supervisor gives it back as a crash (MAX_CRASHES ends a loop).
    assert report[0][1] == "session_ended", report
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.RUNNING


def test_one_bad_value_in_a_batched_record_does_not_fail_its_batch_mates(monkeypatch):
    results = [tasks.poison_innocent.enqueue(n) for n in range(3)]
    by_id = {str(c.task_id): c for c in taskplanner.claim(None, 3, Claimant(), 30)}
    claims = [by_id[str(r.id)] for r in results]
    real = taskstore.succeed_many
    poisoned = claims[1].task_id

    def picky(done):
        if any(c.task_id == poisoned for c, _, _ in done):
            raise DataError("this one value is refused")
        return real(done)

    monkeypatch.setattr(taskstore, "succeed_many", picky)
    completions = Completions("default")
    for c in claims:
        completions.add(Kept(c, 1, timezone.now(), lambda recorded: recorded))
    outcomes = dict((k.claim.task_id, o) for k, o in completions.flush())
    completions.close()
    monkeypatch.undo()
    assert outcomes[claims[0].task_id] is True and outcomes[claims[2].task_id] is True
    assert isinstance(outcomes[poisoned], DataError)
    statuses = {r.id: TaskRecord.objects.get(pk=r.id).status for r in results}
    assert statuses[results[0].id] == statuses[results[2].id] == TaskStatus.SUCCESSFUL
    assert statuses[results[1].id] == TaskStatus.RUNNING, "left to the child's guard"


# ----- rows ----------------------------------------------------------------------------


def run_in_child_refusing_the_first_record(c: units.Unit, monkeypatch) -> list[tuple]:
    """``run_in_child`` with the runner's own FAILED record refused by the database (as a
    value PostgreSQL cannot store would be): the child's fallback record goes in."""
    real = store.fail
    calls = []

    def refuse_first(claim, info):
        calls.append(info)
        if len(calls) == 1:
            raise DataError("refused by the database")
        return real(claim, info)

    monkeypatch.setattr(store, "fail", refuse_first)
    try:
        return run_in_child(c)
    finally:
        monkeypatch.undo()


def row_failure(item: Item) -> Failure:
    execution = Execution.objects.get(worker="poison_rows", source_id=str(item.pk))
    assert execution.state == State.FAILED
    (failure,) = Failure.objects.filter(execution=execution)
    return failure


def test_a_row_handler_raising_nul_fails_its_row_once_and_the_others_run_once():
    items = [Item.objects.create(kind="poison", action=a)
             for a in ("ok", "nul_raise", "ok", "unprintable", "ok", "nul_progress")]
    counts = run_until_idle(["poison_rows"])
    assert counts["failed"] == 2 and counts["finished"] == 4, counts
    assert row_failure(items[1]).message == "a\\x00b"
    assert row_failure(items[3]).message.startswith(
        "<unprintable Unprintable: str() raised TypeError")
    ran = sorted(Effect.objects.filter(worker="poison_rows").values_list("item_id", flat=True))
    assert ran == [items[i].pk for i in (0, 2, 4, 5)]
    assert Execution.objects.get(worker="poison_rows",
                                 source_id=str(items[5].pk)).progress_message == \
        "row\\x00progress"


def test_a_row_whose_record_raises_fails_with_a_fallback_in_the_child(monkeypatch):
    item = Item.objects.create(kind="poison", action="nul_raise")
    (c,) = planner.claim(__import__("django_dbworker").workers["poison_rows"], 1, Claimant(), 30)
    report = run_in_child_refusing_the_first_record(c, monkeypatch)
    assert report[0][2].outcome == "failed", report
    assert "the database refused recording its failure with DataError" in \
        row_failure(item).message


def test_unit_ids_in_reports_are_unique_strings_for_tasks():
    result = tasks.poison_unprintable.enqueue()
    report = run_in_child(claim_task(result.id))
    assert report[0][2].unit_id == str(uuid.UUID(str(result.id)))


def test_a_locked_database_is_not_the_units_fault(monkeypatch):
    """SQLite's write lock held past its busy timeout says nothing of the unit's value:
    given back, not FAILED (the connection still works)."""
    from django.db import OperationalError

    result = tasks.poison_innocent.enqueue(1)
    c = claim_task(result.id)

    def locked(*args, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(taskstore, "succeed_many", locked)
    report = run_in_child(c)
    monkeypatch.undo()
    assert report[0][1] == "db_error", report
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.RUNNING


def test_a_class_path_longer_than_its_column_is_shortened():
    info = FailureInfo("x" * 400, "m")
    assert len(info.exception_class) == 255 and info.exception_class.endswith("...")


def test_a_row_failed_by_the_child_makes_it_pending_for_its_sibling_workers(monkeypatch):
    """A fallback FAILED record, like the runner's own, makes the row pending for the
    other workers over its model at once (one waiting on FAILED need not wait for a
    sweep), even for a row written without save()."""
    from django_dbworker import workers
    from django_dbworker.rows import pending

    (item,) = Item.objects.bulk_create([Item(kind="poison", action="nul_raise")])
    pending.add(workers["poison_rows"], [item.pk], "default")
    (c,) = planner.claim(workers["poison_rows"], 1, Claimant(), 30)
    report = run_in_child_refusing_the_first_record(c, monkeypatch)
    assert report[0][2].outcome == "failed", report
    siblings = set(Execution.objects.filter(source_id=str(item.pk), state=State.PENDING)
                   .values_list("worker", flat=True))
    assert {"touch", "after_touch", "ranked"} <= siblings, siblings
