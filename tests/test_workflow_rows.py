"""Tasks and rows together: ``has_task_status`` (a row worker's eligible waits for a task)
and ``after_row`` (a task waits for a row worker's execution of a row), in-process and
with real ``runworkers``."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
from django.db.models import OuterRef, Q
from django.utils import timezone

from django_dbworker import ExecutionStatus, execution_status, has_task_status
from django_dbworker.djtasks import TaskResultStatus
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


# ----- after_row: a task waits for a row worker's execution of a row ---------------------


def record(result) -> TaskRecord:
    return TaskRecord.objects.get(pk=result.id)


def test_a_task_waits_for_a_row_and_runs_after_it_finished():
    from django_dbworker import after_row
    from django_dbworker.models import DependencyState, Execution, TaskDependency
    from django_dbworker.testing import run_until_idle
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    item = Item.objects.create()
    waits = add.using(after=[after_row("touch", item)]).enqueue(1, 2)
    assert record(waits).status == TaskStatus.WAITING and record(waits).waiting_for == 1
    edge = TaskDependency.objects.get(dependent_id=waits.id)
    assert (edge.row_worker, edge.row_source_id, edge.dependency_id) == (
        "touch", str(item.pk), None)
    assert run_until_idle(["touch"], tasks=True) == {"finished": 1, "successful": 1}
    done = record(waits)
    assert done.status == TaskStatus.SUCCESSFUL and done.return_value == 3
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.finished_at <= done.started_at
    edge.refresh_from_db()
    assert edge.state == DependencyState.MET and edge.resolved_at is not None


def test_a_failed_row_cancels_the_task_naming_the_row():
    from django_dbworker import after_row
    from django_dbworker.testing import run_until_idle
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    item = Item.objects.create(action="raise")
    waits = add.using(after=[after_row("touch", item.pk)]).enqueue(1, 2)
    later = add.using(after=[waits]).enqueue(3, 4)  # and what waits for the task
    counts = run_until_idle(["touch"], tasks=True)
    assert counts == {"failed": 1}, counts
    for result in (waits, later):
        stored = record(result)
        assert stored.status == TaskStatus.CANCELLED
        (error,) = stored.failure_dicts()
        assert error["exception_class"] == "django_dbworker.exceptions.DependencyFailed"
    assert f"row touch[{item.pk}] ended FAILED" in record(waits).failure_dicts()[0]["message"]
    assert f"{waits.id} ended CANCELLED" in record(later).failure_dicts()[0]["message"]


def test_run_on_failure_runs_after_a_failed_row():
    from django_dbworker import after_row
    from django_dbworker.testing import run_until_idle
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    item = Item.objects.create(action="raise")
    waits = add.using(after=[after_row("touch", item)], run_on_failure=True).enqueue(1, 1)
    assert run_until_idle(["touch"], tasks=True) == {"failed": 1, "successful": 1}
    assert record(waits).status == TaskStatus.SUCCESSFUL


def test_a_row_that_already_ended_decides_at_enqueue():
    from django_dbworker import after_row
    from django_dbworker.testing import run_until_idle
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    ok, bad = Item.objects.create(), Item.objects.create(action="raise")
    run_until_idle(["touch"])
    ready = add.using(after=[after_row("touch", ok)]).enqueue(1, 1)
    cancelled = add.using(after=[after_row("touch", bad)]).enqueue(1, 1)
    assert record(ready).status == TaskStatus.READY
    assert record(cancelled).status == TaskStatus.CANCELLED
    assert f"row touch[{bad.pk}]" in record(cancelled).failure_dicts()[0]["message"]


def test_rows_and_tasks_mixed_in_one_after():
    from django_dbworker import after_row
    from django_dbworker.testing import run_until_idle
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    first = add.enqueue(1, 1)
    items = [Item.objects.create() for _ in range(3)]
    last = add.using(after=[first, *(after_row("touch", i) for i in items)]).enqueue(2, 2)
    assert record(last).waiting_for == 4
    assert run_until_idle(["touch"], tasks=True) == {"finished": 3, "successful": 2}
    assert record(last).status == TaskStatus.SUCCESSFUL


def test_after_row_bad_input_is_refused_by_name():
    from django_dbworker import after_row
    from django_dbworker.exceptions import UnknownWorker
    from tests.testapp.models import Item, Tag

    with pytest.raises(UnknownWorker, match="nope"):
        after_row("nope", 1)
    with pytest.raises(ValueError, match="the row is a Tag, but worker 'touch' works on Item"):
        after_row("touch", Tag.objects.create(code="x"))
    with pytest.raises(ValueError, match="not saved yet"):
        after_row("touch", Item())
    with pytest.raises(ValueError, match="'abc' is not a primary key of Item"):
        after_row("touch", "abc")
    with pytest.raises(ValueError, match="there is no Item with primary key 987654"):
        after_row("touch", 987654)


def test_the_release_reads_only_the_waiting_row_edges(django_assert_num_queries):
    """With nothing waiting for a row, a supervisor's look is one query and changes
    nothing; with edges on rows that have not ended, still one."""
    from django_dbworker import after_row
    from django_dbworker.workflows.rows import release_ended_rows
    from tests.testapp.models import Item
    from tests.testapp.tasks import add

    with django_assert_num_queries(1):
        assert release_ended_rows() == 0
    add.using(after=[after_row("touch", Item.objects.create())]).enqueue(1, 1)
    with django_assert_num_queries(1):
        assert release_ended_rows() == 0


def test_tasks_wait_for_rows_in_two_real_supervisors(runworkers):
    """Two supervisors run the rows and the tasks; each task after a row runs once, after
    its row finished, within a few polls; the task after every row runs once, last."""
    from django_dbworker import after_row
    from django_dbworker.models import Execution
    from tests.testapp.models import Item
    from tests.testapp.tasks import chaos_effect

    items = [Item.objects.create(action="sleep:0.05") for _ in range(30)]
    singles = [chaos_effect.using(after=[after_row("touch", i)]).enqueue(i.pk)
               for i in items]
    every = chaos_effect.using(after=[after_row("touch", i) for i in items]).enqueue(0)
    first = runworkers("--concurrency=2")
    second = runworkers("--concurrency=2")
    wait_for(lambda: TaskRecord.objects.filter(status="SUCCESSFUL").count() == 31,
             timeout=90, what="every task")
    for process in (first, second):
        process.signal(15)
        assert process.wait() == 0, process.output()
    effects = list(Effect.objects.filter(worker="chaos_task").values_list("item_id", flat=True))
    assert sorted(effects) == sorted([0, *(i.pk for i in items)])  # each once
    ended = dict(Execution.objects.filter(worker="touch").values_list("source_id",
                                                                      "finished_at"))
    lags = []
    for item, result in zip(items, singles, strict=True):
        started = record(result).started_at
        assert started >= ended[str(item.pk)]
        lags.append((started - ended[str(item.pk)]).total_seconds())
    assert record(every).started_at >= max(ended.values())
    assert max(lags) < 5, lags  # POLL_INTERVAL is 0.1 s here; the machine is shared


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
def test_the_release_query_reads_the_waiting_index_not_the_history(analyzed):
    """5,000 row edges resolved long ago and 5 still waiting: the supervisors' look goes
    through ``dbworker_dependency_waiting`` (its cost follows the waiting row edges), on
    every database, with and without the planner's statistics."""
    from django.db import connection

    from django_dbworker.models import DependencyState, TaskDependency
    from django_dbworker.workflows.rows import ended_rows

    TaskDependency.objects.bulk_create(
        [TaskDependency(dependent_id=uuid.uuid4(), row_worker="touch", row_source_id=str(n),
                        state=DependencyState.MET) for n in range(5_000)]
        + [TaskDependency(dependent_id=uuid.uuid4(), dependency_id=uuid.uuid4(),
                          state=DependencyState.WAITING) for _ in range(2_000)]
        + [TaskDependency(dependent_id=uuid.uuid4(), row_worker="touch",
                          row_source_id=str(n)) for n in range(5)], batch_size=1000)
    table = TaskDependency._meta.db_table
    with connection.cursor() as cursor:
        if analyzed:
            cursor.execute(f"ANALYZE {table}" if connection.vendor != "mysql"
                           else f"ANALYZE TABLE {table}")
            if connection.vendor == "mysql":
                cursor.fetchall()
    qs = ended_rows("default")
    plan = qs.explain()
    assert "dbworker_dependency_waiting" in plan, plan
    assert list(qs) == []


def test_the_examples_of_docs_workflows_md_are_python():
    """Every ``python`` block of docs/workflows.md parses, and the names it imports from
    django_dbworker exist (a user copies them)."""
    import ast
    import re

    import django_dbworker
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "workflows.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) >= 8
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "django_dbworker":
                for alias in node.names:
                    assert getattr(django_dbworker, alias.name) is not None, alias.name
