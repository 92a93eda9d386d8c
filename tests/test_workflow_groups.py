"""Workflows as units: the builder's shapes (chain, group, fan-out, fan-in), ``enqueue``
storing one Workflow row and every member, progress, cancel, ``get(id)``, the completion
callback, ``enqueue_many(..., workflow=...)`` batches, and ``dbworker workflow(s)``."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction

import django_dbworker
from django_dbworker import workflows
from django_dbworker.exceptions import InvalidTaskArguments, InvalidWorkflow, UnknownWorkflow
from django_dbworker.models import TaskDependency, TaskRecord, TaskStatus, Workflow
from django_dbworker.testing import run_until_idle
from django_dbworker.workflows import chain, group
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db


def after(shape):
    """Each step's task argument and the arguments of the steps it waits for."""
    nodes = shape.nodes()
    return [(n.step.args[0], sorted(nodes[i].step.args[0] for i in n.after)) for n in nodes]


# ----- shapes ---------------------------------------------------------------------------


def test_chain_waits_one_after_the_other():
    s = tasks.wf_step.step
    assert after(chain(s(1), s(2), s(3))) == [(1, []), (2, [1]), (3, [2])]


def test_group_fans_out_after_what_it_follows_and_fans_in_before_what_follows():
    s = tasks.wf_step.step
    assert after(chain(s(1), group(s(2), s(3)), s(4))) == [
        (1, []), (2, [1]), (3, [1]), (4, [2, 3])]
    assert after(chain(group(s(1), s(2), s(3)), s(4))) == [  # chord
        (1, []), (2, []), (3, []), (4, [1, 2, 3])]
    assert after(group(s(1), s(2))) == [(1, []), (2, [])]


def test_nested_chains_inside_a_group_keep_their_own_order():
    s = tasks.wf_step.step
    shape = chain(s(0), group(chain(s(1), s(2)), chain(s(3), group(s(4), s(5)))), s(6))
    assert after(shape) == [(0, []), (1, [0]), (2, [1]), (3, [0]), (4, [3]), (5, [3]),
                            (6, [2, 4, 5])]


def test_step_carries_the_tasks_options():
    step = tasks.wf_step.using(priority=7, queue_name="slow").step(1, fail=True)
    assert (step.task.priority, step.task.queue_name) == (7, "slow")
    assert step.args == (1,) and step.kwargs == {"fail": True}
    assert step.using(priority=3).task.priority == 3
    assert django_dbworker.chain is chain and django_dbworker.group is group


@pytest.mark.parametrize("build, message", [
    (lambda: chain(), "chain() needs at least one step"),
    (lambda: group(), "group() needs at least one step"),
    (lambda: chain(tasks.wf_step), "call task.step(...) to make a step of a task"),
    (lambda: group(tasks.wf_step.step(1), 42), "group() item 1 is 42"),
    (lambda: workflows.Step(tasks.wf_step.func), "is not a task of a DBWorkerBackend"),
])
def test_wrong_shapes_are_refused_naming_the_item(build, message):
    with pytest.raises(InvalidWorkflow, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace(".", r"\.")):
        build()


@pytest.mark.parametrize("options, message", [
    ({"name": 12}, "name=12 must be a string"),
    ({"name": "x" * 201}, "at most 200 characters"),
    ({"on_complete": "tests.testapp.tasks.wf_callback"}, "must be a task or task.step"),
])
def test_wrong_enqueue_options_store_nothing(options, message):
    with pytest.raises(InvalidWorkflow, match=message):
        group(tasks.wf_step.step(1)).enqueue(**options)
    assert not Workflow.objects.exists() and not TaskRecord.objects.exists()


def test_a_bad_argument_in_any_step_stores_nothing_at_all():
    shape = chain(tasks.wf_step.step(1), tasks.wf_step.step(object()))
    with pytest.raises(InvalidTaskArguments):
        shape.enqueue(name="bad")
    assert not Workflow.objects.exists() and not TaskRecord.objects.exists()


# ----- enqueue_many batches -------------------------------------------------------------


def test_enqueue_many_with_workflow_stores_a_batch_with_an_id():
    results = tasks.wf_step.enqueue_many([((i,), {}) for i in range(5)], workflow="nightly")
    batch = Workflow.objects.get()
    assert batch.name == "nightly"
    assert {r.workflow_id for r in results} == {str(batch.pk)}
    assert set(TaskRecord.objects.values_list("workflow_id", flat=True)) == {batch.pk}
    handle = workflows.get(results[0].workflow_id)
    assert handle.progress() == {**{s.value: 0 for s in TaskStatus}, "READY": 5, "total": 5}
    assert [r.args for r in handle.results] == [[i] for i in range(5)]
    assert not handle.done()


def test_plain_enqueue_many_and_enqueue_store_no_workflow():
    results = [*tasks.wf_step.enqueue_many([((1,), {})]), tasks.wf_step.enqueue(2)]
    assert [r.workflow_id for r in results] == [None, None]
    assert not Workflow.objects.exists()
    assert set(TaskRecord.objects.values_list("workflow_id", flat=True)) == {None}
    tasks.wf_step.enqueue_many([((3,), {})], workflow=True)
    assert Workflow.objects.get().name == ""


def test_a_batch_is_one_transaction_with_its_workflow():
    with pytest.raises(InvalidTaskArguments, match="call 1"):
        tasks.wf_step.enqueue_many([((1,), {}), ((object(),), {})], workflow="x")
    assert not Workflow.objects.exists() and not TaskRecord.objects.exists()
    with pytest.raises(InvalidWorkflow, match="workflow=5 must be True or a name"):
        tasks.wf_step.enqueue_many([((1,), {})], workflow=5)  # type: ignore[arg-type]


def test_cancel_a_batch_cancels_what_has_not_started_and_stops_what_runs():
    results = tasks.wf_step.enqueue_many([((i,), {}) for i in range(4)], workflow="b")
    running = results[0].id
    TaskRecord.objects.filter(pk=running).update(status=TaskStatus.RUNNING)
    TaskRecord.objects.filter(pk=results[1].id).update(status=TaskStatus.SUCCESSFUL)
    handle = workflows.get(results[0].workflow_id)
    assert handle.cancel() == {"cancelled": 2, "stopping": 1}
    assert handle.cancelled_at is not None
    statuses = dict(TaskRecord.objects.values_list("id", "status"))
    assert [statuses[uuid.UUID(r.id)] for r in results] == [
        TaskStatus.RUNNING, TaskStatus.SUCCESSFUL, TaskStatus.CANCELLED, TaskStatus.CANCELLED]
    assert TaskRecord.objects.get(pk=running).cancel_requested_at is not None
    first = handle.cancelled_at
    # again: nothing new is cancelled; the running member is still asked to stop
    assert workflows.get(handle.id).cancel() == {"cancelled": 0, "stopping": 1}
    assert Workflow.objects.get().cancelled_at == first
    assert handle.progress()["CANCELLED"] == 2


def test_cancel_keeps_the_errors_of_a_retrying_member_and_adds_its_own():
    results = tasks.wf_step.enqueue_many([((i,), {}) for i in range(3)], workflow="r")
    earlier = {"exception_class_path": "builtins.ValueError", "traceback": "tb",
               "message": "boom", "attempt": 1, "at": "2026-01-01T00:00:00+00:00"}
    TaskRecord.objects.filter(pk=results[0].id).update(
        status=TaskStatus.RETRYING, attempts=1, errors=[earlier])
    assert workflows.get(results[0].workflow_id).cancel() == {"cancelled": 3, "stopping": 0}
    retried = TaskRecord.objects.get(pk=results[0].id)
    assert [e["exception_class_path"] for e in retried.errors] == [
        "builtins.ValueError", "django_dbworker.exceptions.TaskCancelled"]
    assert retried.errors[-1]["attempt"] == 1
    others = TaskRecord.objects.filter(pk__in=[r.id for r in results[1:]])
    assert [len(t.errors) for t in others] == [1, 1]
    assert {t.errors[0]["message"] for t in others} == {
        "the workflow was cancelled before the task ran"}


def test_get_refuses_unknown_and_malformed_ids():
    with pytest.raises(UnknownWorkflow, match="not a workflow id"):
        workflows.get("nope")
    missing = uuid.uuid4()
    with pytest.raises(UnknownWorkflow, match=f"No workflow {missing}"):
        workflows.get(missing)


# ----- the CLI ----------------------------------------------------------------------------


def run(*args):
    out = StringIO()
    call_command("dbworker", *args, stdout=out)
    return out.getvalue()


def run_json(*args):
    doc = json.loads(run(*args, "--json"))
    assert doc["version"] == 1 and doc["command"] == args[0]
    return doc


def written_by_hand():
    """A batch of three and a dependency edge written directly: b waits for a (met), c
    for b (waiting)."""
    a, b, c = tasks.wf_step.enqueue_many([((i,), {}) for i in range(3)], workflow="hand")
    TaskRecord.objects.filter(pk=a.id).update(status=TaskStatus.SUCCESSFUL)
    TaskRecord.objects.filter(pk__in=[b.id, c.id]).update(status=TaskStatus.WAITING,
                                                          waiting_for=1)
    TaskDependency.objects.create(dependent_id=b.id, dependency_id=a.id, state="met")
    TaskDependency.objects.create(dependent_id=c.id, dependency_id=b.id, condition="ended")
    return a, b, c


def test_inspect_json_of_a_member_names_its_workflow_and_what_it_waits_for():
    s = tasks.wf_step.step
    handle = chain(group(s(1), s(2)), s(3)).enqueue(name="inspected")
    first, _, last = handle.results
    doc = {u["id"]: u for u in run_json("inspect", first.id, last.id)["units"]}
    assert doc[last.id]["workflow_id"] == doc[first.id]["workflow_id"] == str(handle.id)
    assert doc[last.id]["status"] == "WAITING" and doc[last.id]["waiting_for"] == 2
    assert doc[first.id]["waiting_for"] == 0
    (alone,) = run_json("inspect", tasks.add.enqueue(1, 2).id)["units"]
    assert alone["workflow_id"] is None and alone["waiting_for"] == 0


def test_dbworker_workflow_json_lists_members_their_dependencies_and_progress():
    a, b, c = written_by_hand()
    doc = run_json("workflow", a.workflow_id)
    assert doc["workflow"]["name"] == "hand" and doc["workflow"]["id"] == a.workflow_id
    assert doc["progress"]["SUCCESSFUL"] == 1 and doc["progress"]["WAITING"] == 2
    assert doc["progress"]["total"] == 3 and doc["done"] is False
    members = {m["id"]: m for m in doc["members"]}
    assert [members[r.id]["depth"] for r in (a, b, c)] == [0, 1, 2]
    assert members[b.id]["after"] == [{
        "position": 0, "dependency_id": a.id, "row_worker": None, "row_source_id": None,
        "condition": "succeeded", "state": "met"}]
    assert members[c.id]["after"][0]["condition"] == "ended"
    assert members[c.id]["status"] == "WAITING" and members[c.id]["kind"] == "task"
    assert doc["more"] == 0 and doc["callback"] is None
    assert run_json("workflow", a.workflow_id, "--limit", "1")["more"] == 2


def test_dbworker_workflow_text_indents_members_under_what_they_wait_for():
    a, b, c = written_by_hand()
    text = run("workflow", a.workflow_id)
    assert f"Workflow {a.workflow_id} (hand)" in text
    assert "3 members: waiting 2, successful 1" in text
    lines = {line.split()[1]: line for line in text.splitlines() if "wf_step" in line}
    assert lines[a.id].startswith("wf_step")
    assert lines[b.id].startswith("  wf_step") and f"{a.id[:8]}: met" in lines[b.id]
    assert lines[c.id].startswith("    wf_step") and f"{b.id[:8]} (ended): waiting" in \
        lines[c.id]


def test_dbworker_workflows_lists_recent_ones_with_progress():
    a, _, _ = written_by_hand()
    other = tasks.wf_step.enqueue_many([((9,), {})], workflow="second")[0]
    doc = run_json("workflows")
    assert [w["name"] for w in doc["workflows"]] == ["second", "hand"]
    assert doc["workflows"][1]["progress"]["WAITING"] == 2
    assert doc["workflows"][0]["id"] == other.workflow_id
    assert len(run_json("workflows", "--limit", "1")["workflows"]) == 1
    assert "second" in run("workflows") and a.workflow_id in run("workflows")


@pytest.mark.parametrize("args, message", [
    (["workflow", "nope"], "nope: 'nope' is not a workflow id"),
    (["workflow", "2b1f0c3e-0000-4000-8000-000000000000"], "No workflow 2b1f0c3e"),
    (["workflows", "--limit", "-1"], "--limit -1: give a whole number"),
])
def test_dbworker_workflow_refuses_unknown_ids(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)


def test_the_workflow_row_and_the_members_commit_together():
    with pytest.raises(RuntimeError), transaction.atomic():
        tasks.wf_step.enqueue_many([((1,), {})], workflow="rolled back")
        raise RuntimeError
    assert not Workflow.objects.exists() and not TaskRecord.objects.exists()


# ----- end to end (the dependency engine: .using(after=...)) -------------------------------


def effects(worker="wf_step"):
    return list(Effect.objects.filter(worker=worker).order_by("id").values_list(
        "item_id", flat=True))


def statuses(results):
    found = dict(TaskRecord.objects.filter(pk__in=[r.id for r in results])
                 .values_list("id", "status"))
    return [found[uuid.UUID(r.id)] for r in results]


def test_a_chain_runs_one_after_the_other():
    s = tasks.wf_step.step
    handle = chain(s(1), s(2), s(3)).enqueue(name="abc")
    assert statuses(handle.results) == [TaskStatus.READY, TaskStatus.WAITING,
                                        TaskStatus.WAITING]
    assert {r.workflow_id for r in handle.results} == {handle.id}
    run_until_idle(tasks=True, worker_names=[])
    assert effects() == [1, 2, 3]
    assert statuses(handle.results) == [TaskStatus.SUCCESSFUL] * 3
    assert handle.done() and handle.progress()["SUCCESSFUL"] == 3
    assert [r.args for r in workflows.get(handle.id).results] == [[1], [2], [3]]


def test_fan_out_then_fan_in():
    s = tasks.wf_step.step
    handle = chain(s(0), group(s(1), s(2), s(3)), s(4)).enqueue()
    assert handle.progress()["WAITING"] == 4 and handle.progress()["READY"] == 1
    run_until_idle(tasks=True, worker_names=[])
    ran = effects()
    assert ran[0] == 0 and ran[-1] == 4 and sorted(ran[1:4]) == [1, 2, 3]
    # the fan-in waits for each of the group's steps
    edges = TaskDependency.objects.filter(dependent_id=handle.results[4].id)
    assert sorted(str(e.dependency_id) for e in edges) == sorted(
        r.id for r in handle.results[1:4])


def test_a_failed_member_cancels_what_waits_for_it_and_the_callback_still_runs_once():
    s = tasks.wf_step.step
    handle = chain(group(s(1), s(2, fail=True)), s(3)).enqueue(
        name="failing", on_complete=tasks.wf_callback.step(label="report"))
    callback = handle.callback
    assert callback is not None and callback.dbworker_status == TaskStatus.WAITING
    assert callback.kwargs == {"label": "report", "workflow_id": handle.id}
    assert handle.progress()["total"] == 3  # the callback is not a member
    run_until_idle(tasks=True, worker_names=[])
    assert statuses(handle.results) == [TaskStatus.SUCCESSFUL, TaskStatus.FAILED,
                                        TaskStatus.CANCELLED]
    last = TaskRecord.objects.get(pk=handle.results[2].id)
    assert last.errors[-1]["exception_class_path"] == \
        "django_dbworker.exceptions.DependencyFailed"
    assert list(Effect.objects.filter(worker="wf_callback").values_list("note", flat=True)) \
        == [handle.id]
    handle.callback.refresh()
    assert handle.callback.dbworker_status == TaskStatus.SUCCESSFUL
    assert handle.callback.return_value == "report"
    doc = run_json("workflow", handle.id)
    assert doc["callback"]["id"] == handle.callback.id
    assert doc["callback"]["status"] == "SUCCESSFUL" and doc["done"] is True
    assert doc["progress"]["total"] == 3
    broken = [e for m in doc["members"] for e in m["after"] if e["state"] == "broken"]
    assert [e["dependency_id"] for e in broken] == [handle.results[1].id]
    text = run("workflow", handle.id)
    assert "(all ended)" in text and f"callback: tests.testapp.tasks.wf_callback " \
        f"{handle.callback.id} SUCCESSFUL" in text


def test_the_callback_waits_for_every_member_not_only_the_last_ones():
    s = tasks.wf_step.step
    # 3 waits for 1; 2 is beside them: the callback must wait for 2 as well
    handle = group(chain(s(1), s(3)), s(2)).enqueue(on_complete=tasks.wf_callback)
    waits_for = set(TaskDependency.objects.filter(dependent_id=handle.callback.id)
                    .values_list("dependency_id", "condition"))
    assert waits_for == {(uuid.UUID(r.id), "ended") for r in handle.results}
    run_until_idle(tasks=True, worker_names=[])
    assert Effect.objects.filter(worker="wf_callback").count() == 1
    assert Effect.objects.filter(worker="wf_callback").get().id > max(
        Effect.objects.filter(worker="wf_step").values_list("id", flat=True))


def test_cancel_a_workflow_cancels_waiting_members_and_the_callback_reports_it():
    s = tasks.wf_step.step
    handle = chain(s(1), group(s(2), s(3))).enqueue(on_complete=tasks.wf_callback)
    assert handle.cancel() == {"cancelled": 3, "stopping": 0}
    assert statuses(handle.results) == [TaskStatus.CANCELLED] * 3
    assert all(TaskRecord.objects.get(pk=r.id).errors[-1]["exception_class_path"]
               == "django_dbworker.exceptions.TaskCancelled" for r in handle.results)
    run_until_idle(tasks=True, worker_names=[])
    assert effects() == []
    assert Effect.objects.filter(worker="wf_callback").count() == 1
    assert handle.done() and handle.progress()["CANCELLED"] == 3


def test_a_group_of_one_task_is_enqueued_in_one_statement_per_thousand():
    handle = group(*[tasks.wf_step.step(i) for i in range(50)]).enqueue()
    stamps = set(TaskRecord.objects.filter(workflow_id=handle.id)
                 .values_list("enqueued_at", flat=True))
    assert len(stamps) == 1  # one enqueue_many call
    assert [r.args for r in workflows.get(handle.id).results] == [[i] for i in range(50)]


def test_a_workflow_is_stored_in_the_callers_transaction_even_on_an_on_commit_backend():
    with transaction.atomic():
        handle = chain(tasks.committed.step(1), tasks.committed.step(2)).enqueue()
        # stored now, inside the transaction: the second waits for the first
        assert statuses(handle.results) == [TaskStatus.READY, TaskStatus.WAITING]
    run_until_idle(tasks=True, worker_names=[])
    assert statuses(handle.results) == [TaskStatus.SUCCESSFUL] * 2
