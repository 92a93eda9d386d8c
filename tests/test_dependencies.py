"""Dependencies between tasks: ``task.using(after=[...], run_on_failure=...)``, in-process."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker.djtasks import TaskResultStatus, default_task_backend
from django_dbworker.exceptions import InvalidDependency
from django_dbworker.models import DependencyState, TaskDependency, TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


def status(result) -> str:
    return TaskRecord.objects.get(pk=result.id).status


def row(result) -> TaskRecord:
    return TaskRecord.objects.get(pk=result.id)


def test_a_dependent_waits_and_runs_after_its_dependency_succeeded():
    a = tasks.add.enqueue(1, 2)
    b = tasks.add.using(after=[a]).enqueue(3, 4)
    assert b.status == TaskResultStatus.READY  # Django's status of WAITING
    assert b.dbworker_status == TaskStatus.WAITING
    stored = row(b)
    assert stored.status == TaskStatus.WAITING and stored.waiting_for == 1
    assert row(a).has_dependents and not stored.has_dependents
    edge = TaskDependency.objects.get(dependent_id=b.id)
    assert edge.dependency_id == uuid.UUID(a.id) and edge.state == DependencyState.WAITING
    assert run_until_idle() == {"successful": 2}
    assert status(b) == TaskStatus.SUCCESSFUL
    edge.refresh_from_db()
    assert edge.state == DependencyState.MET and edge.resolved_at is not None
    assert row(a).finished_at <= row(b).started_at


def test_a_waiting_task_is_never_claimed():
    a = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 2)
    tasks.add.using(after=[a]).enqueue(3, 4)
    assert run_until_idle() == {}


def test_the_last_of_several_dependencies_releases():
    a, b = tasks.add.enqueue(1, 1), tasks.add.using(run_after=timedelta(hours=1)).enqueue(2, 2)
    c = tasks.add.using(after=[a, b]).enqueue(3, 3)
    assert row(c).waiting_for == 2
    assert run_until_idle() == {"successful": 1}
    assert status(c) == TaskStatus.WAITING and row(c).waiting_for == 1
    TaskRecord.objects.filter(pk=b.id).update(available_at=timezone.now())
    assert run_until_idle() == {"successful": 2}
    assert status(c) == TaskStatus.SUCCESSFUL


def test_a_released_dependent_keeps_its_run_after():
    a = tasks.add.enqueue(1, 1)
    later = timezone.now() + timedelta(hours=1)
    b = tasks.add.using(after=[a], run_after=later).enqueue(2, 2)
    assert run_until_idle() == {"successful": 1}
    stored = row(b)
    assert stored.status == TaskStatus.READY and stored.available_at == later


def test_a_failed_dependency_cancels_its_dependents_and_theirs():
    a = tasks.always_fails.enqueue()
    b = tasks.add.using(after=[a]).enqueue(1, 1)
    c = tasks.add.using(after=[b]).enqueue(2, 2)
    run_until_idle()
    assert status(a) == TaskStatus.FAILED
    for dependent, named in ((b, a), (c, b)):
        stored = row(dependent)
        assert stored.status == TaskStatus.CANCELLED and stored.finished_at is not None
        (error,) = stored.failure_dicts()
        assert error["exception_class"] == "django_dbworker.exceptions.DependencyFailed"
        assert str(named.id) in error["message"]
        assert "tests.testapp.tasks." in error["message"]
        assert ("FAILED" if named is a else "CANCELLED") in error["message"]
    assert default_task_backend.get_result(c.id).status == TaskResultStatus.FAILED


def test_retries_do_not_release_early():
    a = tasks.flaky.enqueue(succeed_on=3)
    b = tasks.add.using(after=[a]).enqueue(1, 1)
    claimed = []
    while status(a) != TaskStatus.SUCCESSFUL:
        run_until_idle()  # one attempt each time: the retry waits 0 seconds
        claimed.append((status(a), status(b)))
        assert len(claimed) < 10
    assert all(s_b == TaskStatus.WAITING for s_a, s_b in claimed if s_a == TaskStatus.RETRYING)
    run_until_idle()
    assert status(b) == TaskStatus.SUCCESSFUL


def test_run_on_failure_runs_after_a_failed_dependency():
    a = tasks.always_fails.enqueue()
    b = tasks.add.using(after=[a], run_on_failure=True).enqueue(1, 1)
    run_until_idle()
    assert status(a) == TaskStatus.FAILED and status(b) == TaskStatus.SUCCESSFUL


def test_cancelling_a_dependency_cancels_its_dependents():
    a = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    b = tasks.add.using(after=[a]).enqueue(1, 1)
    assert default_task_backend.get_result(a.id).dbworker_status == TaskStatus.READY
    import django_dbworker

    assert django_dbworker.cancel(a.id)
    assert status(b) == TaskStatus.CANCELLED
    assert "CANCELLED" in row(b).failure_dicts()[0]["message"]


def test_cancelling_a_waiting_task():
    a = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    b = tasks.add.using(after=[a]).enqueue(1, 1)
    c = tasks.add.using(after=[b]).enqueue(1, 1)
    import django_dbworker

    assert django_dbworker.cancel(b.id)
    assert status(b) == TaskStatus.CANCELLED and status(c) == TaskStatus.CANCELLED
    TaskRecord.objects.filter(pk=a.id).update(available_at=timezone.now())
    assert run_until_idle() == {"successful": 1}
    assert status(b) == TaskStatus.CANCELLED


def test_enqueued_after_the_dependency_ended():
    a = tasks.add.enqueue(1, 1)
    f = tasks.always_fails.enqueue()
    run_until_idle()
    ok = tasks.add.using(after=[a]).enqueue(2, 2)
    assert ok.dbworker_status == TaskStatus.READY and row(ok).waiting_for == 0
    assert TaskDependency.objects.get(dependent_id=ok.id).state == DependencyState.MET
    broken = tasks.add.using(after=[a, f]).enqueue(2, 2)
    assert broken.dbworker_status == TaskStatus.CANCELLED
    assert broken.status == TaskResultStatus.FAILED
    assert "DependencyFailed" in broken.errors[0].exception_class_path
    states = dict(TaskDependency.objects.filter(dependent_id=broken.id)
                  .values_list("position", "state"))
    assert states == {0: DependencyState.MET, 1: DependencyState.BROKEN}
    anyway = tasks.add.using(after=[f], run_on_failure=True).enqueue(2, 2)
    assert anyway.dbworker_status == TaskStatus.READY
    assert run_until_idle() == {"successful": 2}


def test_enqueue_many_shares_the_dependencies():
    a = tasks.add.enqueue(1, 1)
    results = tasks.add.using(after=[a]).enqueue_many([((i, i), {}) for i in range(3)])
    assert {status(r) for r in results} == {TaskStatus.WAITING}
    assert TaskDependency.objects.filter(dependency_id=a.id).count() == 3
    assert run_until_idle() == {"successful": 4}


def test_ids_as_text_or_uuid():
    a = tasks.add.enqueue(1, 1)
    b = tasks.add.using(after=[a.id, uuid.UUID(a.id)]).enqueue(1, 1)
    assert row(b).waiting_for == 2
    run_until_idle()
    assert status(b) == TaskStatus.SUCCESSFUL


# ----- bad input -----------------------------------------------------------------------


def test_unknown_id_is_refused_and_nothing_is_stored():
    missing = uuid.uuid4()
    with pytest.raises(InvalidDependency, match=f"{missing}.*not in database 'default'"):
        tasks.add.using(after=[missing]).enqueue(1, 1)
    assert not TaskRecord.objects.exists() and not TaskDependency.objects.exists()


@pytest.mark.parametrize("bad, message", [
    ("not-a-uuid", "not a task id"),
    (42, r"after\[0\] is 42 \(int\)"),
    (None, r"after\[0\] is None"),
])
def test_bad_items_are_refused_by_name(bad, message):
    with pytest.raises(InvalidDependency, match=message):
        tasks.add.using(after=[bad])


def test_a_task_instead_of_its_result():
    with pytest.raises(InvalidDependency, match="enqueue it first"):
        tasks.add.using(after=[tasks.add])


def test_after_must_be_a_list():
    a = tasks.add.enqueue(1, 1)
    with pytest.raises(InvalidDependency, match="must be a list"):
        tasks.add.using(after=a)
    with pytest.raises(InvalidDependency, match="must be a list"):
        tasks.add.using(after=a.id)


def test_a_result_of_another_kind_of_backend():
    from django.tasks.backends.immediate import ImmediateBackend

    other = ImmediateBackend("djangos_immediate", {})
    result = other.enqueue(tasks.add, (1, 1), {})
    with pytest.raises(InvalidDependency, match="not a DBWorkerBackend"):
        tasks.add.using(after=[result])


def test_on_commit_is_refused():
    a = tasks.add.enqueue(1, 1)
    with pytest.raises(InvalidDependency, match="on commit"):
        tasks.add.using(after=[a], enqueue_on_commit=True).enqueue(1, 1)
    with pytest.raises(InvalidDependency, match="on commit"):
        tasks.committed.using(after=[a]).enqueue(1)


def test_run_on_failure_must_be_a_bool():
    from django_dbworker.djtasks import InvalidTask

    with pytest.raises(InvalidTask, match="run_on_failure"):
        tasks.add.using(run_on_failure="yes")


# ----- result passing -------------------------------------------------------------------


def test_a_dependent_reads_its_dependencies_results_in_after_order():
    a, b = tasks.add.enqueue(1, 2), tasks.add.enqueue(10, 20)
    f = tasks.always_fails.enqueue()
    join = tasks.join_effect.using(after=[b, a, f], run_on_failure=True).enqueue(1)
    assert join.dependencies == [None, None, None]  # none has succeeded yet
    run_until_idle()
    stored = default_task_backend.get_result(join.id)
    assert stored.return_value == [30, 3, None]  # a failed one gives None
    assert stored.dependencies == [30, 3, None]
    assert tasks.add.enqueue(0, 0).dependencies == []


def test_a_pruned_dependency_gives_none():
    from django_dbworker.tasks import store as taskstore

    a = tasks.add.enqueue(1, 2)
    join = tasks.join_effect.using(after=[a]).enqueue(1)
    run_until_idle()
    TaskRecord.objects.filter(pk=a.id).update(finished_at=timezone.now() - timedelta(days=9))
    assert taskstore.prune(timedelta(days=7), 100) == 1
    assert default_task_backend.get_result(join.id).dependencies == [None]
    assert default_task_backend.get_result(join.id).return_value == [3]  # kept as it ran


def test_dependency_results_outside_a_task():
    import django_dbworker

    with pytest.raises(RuntimeError, match="inside a running task"):
        django_dbworker.dependency_results()


# ----- exactly once -----------------------------------------------------------------------


def test_a_dependency_that_ends_again_counts_once():
    """A dependency that failed (met under run_on_failure), is retried by a person and then
    succeeds must not lower its dependent's count a second time: its edge was resolved
    once. (Without the edge's ``state = 'waiting'`` guard, the dependent is released while
    its other dependency still runs.)"""
    from django_dbworker.tasks import store as taskstore

    a = tasks.always_fails.enqueue()
    later = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    d = tasks.add.using(after=[a, later], run_on_failure=True).enqueue(1, 1)
    run_until_idle()
    assert status(a) == TaskStatus.FAILED and row(d).waiting_for == 1
    assert taskstore.retry([a.id]) == 1
    TaskRecord.objects.filter(pk=a.id).update(task_path=tasks.add.module_path,
                                              args=[1, 1])
    run_until_idle()
    assert status(a) == TaskStatus.SUCCESSFUL
    assert status(d) == TaskStatus.WAITING and row(d).waiting_for == 1


def test_a_dependent_enqueued_while_its_dependency_runs_is_released():
    """The claim said the dependency had no dependents; the completion's one statement
    (``has_dependents = false``) leaves it, and the transactional path records it with the
    release."""
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.tasks import store as taskstore
    from django_dbworker.units.claimant import Claimant

    a = tasks.add.enqueue(1, 1)
    (claim,) = taskplanner.claim(None, 1, Claimant(), 30)
    b = tasks.add.using(after=[a]).enqueue(2, 2)
    assert taskstore.succeed_many([(claim, 2, timezone.now())]) == {uuid.UUID(a.id)}
    assert status(a) == TaskStatus.SUCCESSFUL and status(b) == TaskStatus.READY


def test_operators_retry_of_a_failed_dependency_leaves_its_dependents_cancelled():
    from django_dbworker.tasks import store as taskstore

    a = tasks.always_fails.enqueue()
    b = tasks.add.using(after=[a]).enqueue(1, 1)
    run_until_idle()
    assert status(b) == TaskStatus.CANCELLED
    taskstore.retry([a.id])
    TaskRecord.objects.filter(pk=a.id).update(task_path=tasks.add.module_path, args=[1, 1])
    run_until_idle()
    assert status(a) == TaskStatus.SUCCESSFUL and status(b) == TaskStatus.CANCELLED
    assert taskstore.retry([b.id]) == 1  # retried itself, it runs (its edges stay broken)
    assert run_until_idle() == {"successful": 1}


def test_purge_cancels_the_dependents_of_what_it_deletes():
    from django_dbworker.tasks import store as taskstore

    a = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 1)
    b = tasks.add.using(after=[a], queue_name="emails").enqueue(1, 1)
    c = tasks.add.using(after=[a]).enqueue(1, 1)
    assert taskstore.purge(["default"]) == 2  # a and c
    assert status(b) == TaskStatus.CANCELLED
    assert not TaskRecord.objects.filter(pk__in=[a.id, c.id]).exists()


def test_idempotency_key_returns_the_holder_without_new_edges():
    a = tasks.add.enqueue(1, 1)
    first = tasks.add.using(after=[a], idempotency_key="k1").enqueue(1, 1)
    again = tasks.add.using(after=[a], idempotency_key="k1").enqueue(1, 1)
    assert again.id == first.id
    assert TaskDependency.objects.filter(dependent_id=first.id).count() == 1
    assert row(first).waiting_for == 1
    run_until_idle()
    assert status(first) == TaskStatus.SUCCESSFUL


# ----- every end releases --------------------------------------------------------------


def test_a_running_dependency_cancelled_by_its_supervisor_cancels_its_dependents():
    """The supervisor's record of a cancel (and of a timeout) is ``fail_attempt`` with the
    claim's token: the dependents are resolved in its transaction."""
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.tasks import store as taskstore
    from django_dbworker.units.claimant import Claimant
    from django_dbworker.units.failures import FailureInfo

    a = tasks.add.enqueue(1, 1)
    (claim,) = taskplanner.claim(None, 1, Claimant(), 30)
    b = tasks.add.using(after=[a]).enqueue(2, 2)
    import django_dbworker

    assert django_dbworker.cancel(a.id)  # asks the supervisor to stop it
    assert status(b) == TaskStatus.WAITING
    assert taskstore.fail_attempt(claim, FailureInfo("x.TaskCancelled", "stopped"),
                                  retry_at=None, status=TaskStatus.CANCELLED) == 1
    assert status(b) == TaskStatus.CANCELLED


def test_a_dependency_that_crashed_too_often_cancels_its_dependents():
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.tasks import store as taskstore
    from django_dbworker.units.claimant import Claimant
    from django_dbworker.units.failures import FailureInfo

    a = tasks.add.enqueue(1, 1)
    b = tasks.add.using(after=[a]).enqueue(2, 2)
    (claim,) = taskplanner.claim(None, 1, Claimant(), 30)
    assert taskstore.release(claim, crashed=FailureInfo("x.ChildProcessDied", "killed"),
                             max_crashes=1) == 1
    assert status(a) == TaskStatus.FAILED and status(b) == TaskStatus.CANCELLED
    assert TaskRecord.objects.get(pk=a.id).crashes == 1  # the last crash counts too


def test_a_dependency_given_back_after_a_crash_releases_nothing():
    from django_dbworker.tasks import planner as taskplanner
    from django_dbworker.tasks import store as taskstore
    from django_dbworker.units.claimant import Claimant
    from django_dbworker.units.failures import FailureInfo

    a = tasks.add.enqueue(1, 1)
    b = tasks.add.using(after=[a]).enqueue(2, 2)
    (claim,) = taskplanner.claim(None, 1, Claimant(), 30)
    taskstore.release(claim, crashed=FailureInfo("x.ChildProcessDied", "killed"),
                      max_crashes=3)
    assert status(a) == TaskStatus.READY and status(b) == TaskStatus.WAITING
    run_until_idle()
    assert status(b) == TaskStatus.SUCCESSFUL


def test_an_unknown_task_path_fails_and_cancels_its_dependents():
    a = tasks.add.enqueue(1, 1)
    b = tasks.add.using(after=[a]).enqueue(2, 2)
    TaskRecord.objects.filter(pk=a.id).update(task_path="tests.testapp.tasks.gone")
    run_until_idle()
    assert status(a) == TaskStatus.FAILED and status(b) == TaskStatus.CANCELLED


def test_a_uniqueness_key_and_a_concurrency_limit_with_dependencies():
    from tests.testapp.concurrency_tasks import conc_account

    a = tasks.add.enqueue(1, 1)
    keyed = conc_account.using(after=[a]).enqueue_many([(("acme", i), {}) for i in range(3)])
    assert {status(r) for r in keyed} == {TaskStatus.WAITING}
    assert all(row(r).concurrency_key for r in keyed)
    first = tasks.add.using(after=[a], unique_key="u1").enqueue(1, 1)
    again = tasks.add.using(after=[a], unique_key="u1").enqueue(1, 1)
    assert again.id == first.id and status(first) == TaskStatus.WAITING
    assert TaskDependency.objects.filter(dependent_id=first.id).count() == 1
    run_until_idle()
    assert status(first) == TaskStatus.SUCCESSFUL
    assert {status(r) for r in keyed} == {TaskStatus.SUCCESSFUL}


# ----- row dependencies (their release is the row side's: workflows.rows) -----------------


class RowDependency:
    """The shape of ``django_dbworker.workflows.rows.RowDependency`` the enqueue side reads:
    a worker name and a source row's key."""

    def __init__(self, worker, source_id):
        self.worker, self.source_id = worker, source_id


def test_a_row_dependency_is_stored_as_an_edge_on_the_row():
    from django_dbworker.models import Execution, State
    from tests.testapp.models import Item

    waiting_row, done_row, failed_row = (Item.objects.create(action="ok") for _ in range(3))
    Execution.objects.update_or_create(worker="touch", source_id=str(done_row.pk),
                                       defaults={"state": State.FINISHED})
    Execution.objects.update_or_create(worker="touch", source_id=str(failed_row.pk),
                                       defaults={"state": State.FAILED})
    a = tasks.add.enqueue(1, 1)
    d = tasks.add.using(after=[a, RowDependency("touch", waiting_row.pk),
                               RowDependency("touch", done_row.pk)]).enqueue(1, 1)
    assert row(d).waiting_for == 2
    edges = list(TaskDependency.objects.filter(dependent_id=d.id).order_by("position")
                 .values_list("row_worker", "row_source_id", "state"))
    assert edges == [("", None, DependencyState.WAITING),
                     ("touch", str(waiting_row.pk), DependencyState.WAITING),
                     ("touch", str(done_row.pk), DependencyState.MET)]
    assert d.dependencies == [None, None, None]
    broken = tasks.add.using(after=[RowDependency("touch", failed_row.pk)]).enqueue(1, 1)
    assert broken.dbworker_status == TaskStatus.CANCELLED
    message = row(broken).failure_dicts()[0]["message"]
    assert f"row touch[{failed_row.pk}] ended FAILED" in message


def test_a_fan_out_and_fan_in_of_more_than_a_chunk(monkeypatch):
    """One root, many dependents released by one end (statements of ``CHUNK`` ids), and
    one join after all of them."""
    from django_dbworker.tasks import dependents as release

    monkeypatch.setattr(release, "CHUNK", 7)
    root = tasks.add.enqueue(0, 0)
    later = timezone.now() + timedelta(hours=1)
    fan = tasks.add.using(after=[root]).enqueue_many([((i, 0), {}) for i in range(20)])
    delayed = tasks.add.using(after=[root], run_after=later).enqueue(1, 1)
    join = tasks.join_effect.using(after=fan).enqueue(99)
    assert row(join).waiting_for == 20
    run_until_idle()
    assert status(join) == TaskStatus.SUCCESSFUL
    assert row(join).return_value == list(range(20))
    stored = row(delayed)
    assert stored.status == TaskStatus.READY and stored.available_at == later
