"""A poison unit among others sent in the same batches, through real ``runworkers --burst``
(#16 items 1, 2 and the per-child memory limit): the poison ends FAILED once with its real
cause, every other unit runs exactly once, no child dies and ``--burst`` exits 0.

One child (``--concurrency 1``) and units claimed ahead (``PREFETCH``): the poison's
batch-mates are in its child's pipe when it runs, so a child that died would run them
again (``test_batches.py``, ``test_prefetch.py``)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

BATCHES = {"DBWORKER_TEST_PREFETCH": "8"}
ONE_CHILD = ("--burst", "--concurrency", "1", "--verbosity", "2")


def _tamper(**change: object) -> Callable[[], object]:
    def make() -> object:
        result = tasks.poison_innocent.enqueue(999)
        TaskRecord.objects.filter(pk=result.id).update(**change)
        return result.id
    return make


def _enqueue(task: object, *args: object) -> Callable[[], object]:
    return lambda: task.enqueue(*args).id  # type: ignore[attr-defined]


def _overflowing() -> object:
    result = tasks.poison_retry_overflow.enqueue()
    TaskRecord.objects.filter(pk=result.id).update(attempts=5000)
    return result.id


POISONS: dict[str, tuple[Callable[[], object], str]] = {
    "nul_return": (_enqueue(tasks.poison_return_nul, True),
                   "returned a value that contains a NUL character (U+0000) at ['outer'][1]"),
    "nul_raise": (_enqueue(tasks.poison_raise_nul), "a\\x00b"),
    "unprintable": (_enqueue(tasks.poison_unprintable),
                    "<unprintable Unprintable: str() raised TypeError"),
    "tampered_errors": (_tamper(errors={"not": "a list"}), "its stored errors value"),
    "tampered_priority": (_tamper(priority=1000), "cannot be run as stored"),
    "tampered_queue": (_tamper(queue_name="nowhere"), "cannot be run as stored"),
    "raising_import": (_tamper(task_path="tests.testapp.poison_boom.anything"),
                       "tests.testapp.poison_boom.anything"),
    "overflowing_retry": (_overflowing, "poison: fails again"),
}


def innocent_runs() -> dict[int, int]:
    return dict(Effect.objects.filter(worker="poison_innocent").values_list("item_id")
                .annotate(n=Count("id")).values_list("item_id", "n"))


@pytest.mark.parametrize("kind", list(POISONS))
def test_a_poison_task_fails_once_and_its_batch_mates_run_once(runworkers, kind):
    make, cause = POISONS[kind]
    with transaction.atomic():
        tasks.poison_innocent.enqueue_many([((n,), {}) for n in range(12)])
        poison = make()
        tasks.poison_innocent.enqueue_many([((n,), {}) for n in range(12, 24)])
    rw = runworkers(*ONE_CHILD, extra_env=BATCHES)
    assert rw.wait(90) == 0, rw.output()[-3000:]
    out = rw.output()
    assert "child_died" not in out and "child_exited" not in out, out[-3000:]
    assert innocent_runs() == dict.fromkeys(range(24), 1), innocent_runs()
    row = TaskRecord.objects.get(pk=poison)
    if kind == "overflowing_retry":  # capped at retry_max_delay (600 s): not an overflow
        assert row.status == TaskStatus.RETRYING, (row.status, row.errors)
        assert row.available_at > timezone.now() + timedelta(seconds=500)
    else:
        assert row.status == TaskStatus.FAILED, (row.status, row.errors)
        assert row.attempts == 1 and row.crashes == 0
    assert len(row.errors) == 1, row.errors
    assert cause in row.errors[0]["message"], row.errors[0]
    assert "ChildProcessDied" not in row.errors[0]["exception_class_path"]


@pytest.mark.parametrize("action,cause", [
    ("nul_raise", "a\\x00b"),
    ("unprintable", "<unprintable Unprintable: str() raised TypeError"),
])
def test_a_poison_row_fails_once_and_its_batch_mates_run_once(runworkers, action, cause):
    with transaction.atomic():
        before = [Item.objects.create(kind="poison") for _ in range(12)]
        poison = Item.objects.create(kind="poison", action=action)
        after = [Item.objects.create(kind="poison") for _ in range(12)]
    rw = runworkers(*ONE_CHILD, "--worker", "poison_rows", extra_env=BATCHES)
    assert rw.wait(90) == 0, rw.output()[-3000:]
    out = rw.output()
    assert "child_died" not in out and "child_exited" not in out, out[-3000:]
    runs = dict(Effect.objects.filter(worker="poison_rows").values_list("item_id")
                .annotate(n=Count("id")).values_list("item_id", "n"))
    assert runs == {i.pk: 1 for i in [*before, *after]}, runs
    execution = Execution.objects.get(worker="poison_rows", source_id=str(poison.pk))
    assert execution.state == State.FAILED and execution.attempts == 1
    (failure,) = Failure.objects.filter(execution=execution)
    assert cause in failure.message, failure.message


def test_a_child_over_its_memory_limit_is_replaced_and_every_unit_runs_once(runworkers):
    """CHILD_MAX_MEMORY_MB: each "hog" unit keeps 80 MiB in its child; over 200 MiB the
    child retires once its unit is through and the supervisor starts another."""
    with transaction.atomic():
        items = [Item.objects.create(kind="poison", action="hog:80" if n % 2 else "ok")
                 for n in range(12)]
    rw = runworkers(*ONE_CHILD, "--worker", "poison_rows",
                    extra_env={**BATCHES, "DBWORKER_TEST_CHILD_MAX_MEMORY_MB": "200"})
    assert rw.wait(120) == 0, rw.output()[-3000:]
    out = rw.output()
    assert "child_memory_limit" in out, out[-3000:]
    assert "DBWORKER['CHILD_MAX_MEMORY_MB']=200" in out
    assert "child_died" not in out and "child_exited" not in out, out[-3000:]
    runs = dict(Effect.objects.filter(worker="poison_rows").values_list("item_id")
                .annotate(n=Count("id")).values_list("item_id", "n"))
    assert runs == {i.pk: 1 for i in items}, runs
    pids = set(Effect.objects.filter(worker="poison_rows").values_list("pid", flat=True))
    assert len(pids) >= 3, f"the child was not replaced: {pids}"
    assert set(Execution.objects.filter(worker="poison_rows")
               .values_list("state", flat=True)) == {State.FINISHED}
