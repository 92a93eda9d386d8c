"""Tasks and rows together: ``has_task_status`` (a row worker's eligible waits for a task)
and ``after_row`` (a task waits for a row worker's execution of a row), in-process and
with real ``runworkers``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from django.db.models import OuterRef, Q
from django.tasks import TaskResultStatus
from django.utils import timezone

from django_dbworker import ExecutionStatus, execution_status, has_task_status
from django_dbworker.models import TaskRecord, TaskStatus
from tests.conftest import wait_for
from tests.testapp.models import Awaiting, Document, Effect

pytestmark = pytest.mark.django_db(transaction=True)


def task_row(status: str) -> TaskRecord:
    return TaskRecord.objects.create(task_path="tests.testapp.tasks.add", status=status)


def pks(qs) -> list[int]:
    return sorted(qs.values_list("pk", flat=True))


@pytest.fixture
def awaiting() -> dict[str, Awaiting]:
    """A row per task status, holding the task's id both as a UUID and as text
    (``str(result.id)``), and rows holding no task, a pruned task, and garbage."""
    rows = {}
    for status in TaskStatus.values:
        t = task_row(status)
        rows[status] = Awaiting.objects.create(task_id=t.pk, task_text=str(t.pk))
    gone = uuid.uuid4()
    rows["pruned"] = Awaiting.objects.create(task_id=gone, task_text=str(gone))
    rows["empty"] = Awaiting.objects.create(task_id=None, task_text="")
    rows["garbage"] = Awaiting.objects.create(task_text="not-a-task-id; DROP TABLE x")
    return rows


@pytest.mark.parametrize("field", ["task_id", "task_text"])
def test_filters_by_the_status_of_the_task_a_field_names(awaiting, field):
    done = has_task_status(field, "SUCCESSFUL")
    assert pks(Awaiting.objects.filter(done)) == [awaiting["SUCCESSFUL"].pk]
    either = has_task_status(field, [TaskStatus.FAILED, TaskStatus.CANCELLED])
    assert pks(Awaiting.objects.filter(either)) == pks(Awaiting.objects.filter(
        pk__in=[awaiting["FAILED"].pk, awaiting["CANCELLED"].pk]))
    # No statuses: the task exists (not pruned, not empty, not garbage).
    assert pks(Awaiting.objects.filter(has_task_status(field))) == sorted(
        awaiting[s].pk for s in TaskStatus.values)
    assert pks(Awaiting.objects.exclude(done) & Awaiting.objects.filter(
        ~Q(has_task_status(field)))) == sorted(
        awaiting[k].pk for k in ("pruned", "empty", "garbage"))


def test_text_ids_without_hyphens_and_in_capitals(awaiting):
    t = task_row(TaskStatus.SUCCESSFUL)
    hexed = Awaiting.objects.create(task_text=t.pk.hex.upper())
    assert hexed.pk in pks(Awaiting.objects.filter(has_task_status("task_text", "SUCCESSFUL")))


def test_waiting_and_djangos_statuses(awaiting):
    waiting = has_task_status("task_id", TaskStatus.WAITING)
    assert pks(Awaiting.objects.filter(waiting)) == [awaiting["WAITING"].pk]
    # Django's FAILED is ours FAILED and CANCELLED; its READY is READY, WAITING, RETRYING.
    failed = has_task_status("task_id", [TaskResultStatus.FAILED])
    assert pks(Awaiting.objects.filter(failed)) == sorted(
        [awaiting["FAILED"].pk, awaiting["CANCELLED"].pk])
    ready = has_task_status("task_text", [TaskResultStatus.READY])
    assert pks(Awaiting.objects.filter(ready)) == sorted(
        awaiting[s].pk for s in ("READY", "WAITING", "RETRYING"))


def test_annotation_and_expression_field(awaiting, django_assert_num_queries):
    with django_assert_num_queries(1):
        rows = dict(Awaiting.objects.annotate(done=has_task_status(
            OuterRef("task_text"), ["SUCCESSFUL"])).values_list("pk", "done"))
    assert [pk for pk, done in rows.items() if done] == [awaiting["SUCCESSFUL"].pk]


def test_a_uuid_primary_key_holding_the_task_id():
    t = task_row(TaskStatus.SUCCESSFUL)
    doc = Document.objects.create(id=t.pk, title="the task's own document")
    Document.objects.create(title="another")
    assert pks(Document.objects.filter(has_task_status("pk", "SUCCESSFUL"))) == [doc.pk]


def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="'DONE' is not a task status; use one of"):
        has_task_status("task_id", "DONE")
    with pytest.raises(ValueError, match="statuses= is empty"):
        has_task_status("task_id", [])
    with pytest.raises(ValueError, match="name the field"):
        has_task_status("")
    with pytest.raises(TypeError, match="give the name of the field"):
        has_task_status(42)  # type: ignore[arg-type]
    with pytest.raises(Exception, match="nope"):  # Django's FieldError names the field
        list(Awaiting.objects.filter(has_task_status("nope")))


def test_an_eligible_waits_for_a_task_in_real_runworkers(runworkers, tmp_path: Path):
    """``after_task``'s eligible is ``has_task_status("task_text", "SUCCESSFUL")``: its row
    runs only once the task ended SUCCESSFUL, and a row whose task failed never runs."""
    from tests.testapp.tasks import always_fails, wait_file

    gate = tmp_path / "gate"
    slow = wait_file.enqueue(1, str(gate))
    failing = always_fails.enqueue()
    waits = Awaiting.objects.create(task_text=slow.id)
    never = Awaiting.objects.create(task_text=failing.id)
    process = runworkers("--concurrency=2")
    wait_for(lambda: TaskRecord.objects.filter(pk=failing.id, status="FAILED").exists(),
             what="the failing task to fail")
    wait_for(lambda: TaskRecord.objects.filter(pk=slow.id, status="RUNNING").exists(),
             what="the slow task to start")
    # several polls pass while the task runs: its row is never claimed meanwhile
    wait_for(lambda: Effect.objects.filter(worker="wait_file").exists())
    time.sleep(1.0)
    assert execution_status(worker="after_task", source_id=waits.pk) is None
    assert not Effect.objects.filter(worker="after_task").exists()
    gate.touch()
    wait_for(lambda: execution_status(worker="after_task", source_id=waits.pk)
             == ExecutionStatus.FINISHED, what="the row after its task")
    finished = TaskRecord.objects.get(pk=slow.id).finished_at
    ran = Effect.objects.get(worker="after_task")
    assert ran.item_id == waits.pk and finished is not None and finished <= timezone.now()
    time.sleep(0.5)
    assert execution_status(worker="after_task", source_id=never.pk) is None
    process.signal(15)
    assert process.wait() == 0, process.output()
