"""The generic poison test (issue 16): one batch of tasks, one poison member of each kind.

A real ``runworkers --burst`` with one child gets every task in a few batches (claimed
ahead, ``PREFETCH``); the poison members are spread among innocent ones. Each innocent task
writes one ``Effect``: every one must run exactly once, each poison member must end FAILED
once with its real cause, no child may die, and the supervisor must finish the burst.
"""

from __future__ import annotations

from collections import Counter

import pytest
from django.db.models import Count

from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

#: kind -> (the stored exception class, words its message must contain)
POISON = {
    "nul_return": ("django_dbworker.exceptions.InvalidTaskArguments", "NUL"),
    "nul_raise": ("builtins.ValueError", "a\\x00b"),
    "unprintable": ("tests.testapp.workers.Unprintable", "unprintable"),
    "not_json": ("builtins.TypeError", "Unsupported type"),  # as Django records it
    "system_exit": ("builtins.SystemExit", "3"),
    "tampered_path": ("django_dbworker.exceptions.UnknownTask",
                      "tests.testapp.batch_sideeffect.boom"),
    # A stored field the task cannot be read back with: refused naming the field, not run.
    "tampered_errors": ("django_dbworker.tasks.results.InvalidTaskRow", "errors"),
}
INNOCENT = 40


#: kind -> how its task is enqueued (the tampered ones are changed afterwards)
ENQUEUE = {
    "nul_return": lambda: tasks.poison_return_nul.enqueue(False),
    "nul_raise": lambda: tasks.poison_raise_nul.enqueue(),
    "unprintable": lambda: tasks.poison_unprintable.enqueue(),
    "not_json": lambda: tasks.returns_object.enqueue(),
    "system_exit": lambda: tasks.poison_exit.enqueue(),
    "tampered_path": lambda: tasks.poison_fails.enqueue(),
    "tampered_errors": lambda: tasks.poison_fails.enqueue(),
}


def _enqueue() -> tuple[dict[str, str], list[str]]:
    """Innocent tasks with the poison members spread among them, in one enqueue order."""
    poison: dict[str, str] = {}
    innocent: list[str] = []
    kinds = list(POISON)
    every = INNOCENT // len(kinds)
    for n in range(INNOCENT):
        innocent.append(tasks.poison_innocent.enqueue(n).id)
        if n % every == every // 2 and kinds:
            kind = kinds.pop(0)
            poison[kind] = ENQUEUE[kind]().id
    assert not kinds
    # Rows changed behind the API's back, as a careless script or a hostile user would.
    TaskRecord.objects.filter(pk=poison["tampered_path"]).update(
        task_path="tests.testapp.batch_sideeffect.boom")
    TaskRecord.objects.filter(pk=poison["tampered_errors"]).update(errors={"not": "a list"})
    return poison, innocent


def test_one_poison_member_of_each_kind_fails_alone(runworkers, tmp_path):
    side_effect = tmp_path / "imported"
    poison, innocent = _enqueue()
    rw = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                    extra_env={"DBWORKER_TEST_SIDE_EFFECT": str(side_effect)})
    code = rw.wait(90)
    out = rw.output()
    assert code == 0, out
    assert "child_died" not in out and "child_exited" not in out, out

    rows = {str(r.pk): r for r in TaskRecord.objects.filter(pk__in=[*poison.values(), *innocent])}
    for kind, pk in poison.items():
        row = rows[str(pk)]
        exception_class, words = POISON[kind]
        assert row.status == TaskStatus.FAILED, (kind, row.status, row.errors)
        assert row.attempts == 1 and row.crashes == 0, (kind, row.attempts, row.crashes)
        assert isinstance(row.errors, list) and len(row.errors) >= 1, (kind, row.errors)
        last = row.errors[-1]
        assert last["exception_class_path"] == exception_class, (kind, last)
        assert words in last["message"], (kind, last)
        assert "\x00" not in last["message"] + last.get("traceback", ""), kind
    assert not side_effect.exists(), "a task row's path imported a module"

    assert all(rows[str(pk)].status == TaskStatus.SUCCESSFUL for pk in innocent), Counter(
        rows[str(pk)].status for pk in innocent)
    counts = dict(Effect.objects.filter(worker="poison_innocent")
                  .values_list("item_id").annotate(n=Count("id")))
    assert counts == {n: 1 for n in range(INNOCENT)}, counts


#: row action -> (the stored exception class, words its message must contain)
ROW_POISON = {
    "nul_raise": ("builtins.ValueError", "a\\x00b"),
    "unprintable": ("tests.testapp.workers.Unprintable", "unprintable"),
    "return_str": ("django_dbworker.exceptions.InvalidOutcome", "returned 'done'"),
    "exit": ("builtins.SystemExit", "3"),
    "nan_delay": ("builtins.ValueError", "Unfinished(delay=nan)"),
}
INNOCENT_ROWS = 30


def test_one_poison_row_of_each_kind_fails_alone(runworkers):
    """The same for a row worker: rows bulk-created, poison rows among them."""
    actions = ["ok"] * INNOCENT_ROWS
    every = INNOCENT_ROWS // len(ROW_POISON)
    for i, kind in enumerate(ROW_POISON):
        actions.insert(i * (every + 1) + every // 2, kind)
    items = Item.objects.bulk_create([Item(kind="poison", action=a) for a in actions])
    rw = runworkers("--burst", "--concurrency", "1", "--worker", "poison_rows")
    code = rw.wait(90)
    out = rw.output()
    assert code == 0, out
    assert "child_died" not in out and "child_exited" not in out, out

    units = {e.source_id: e for e in Execution.objects.filter(worker="poison_rows")}
    assert len(units) == len(items)
    for item in items:
        unit = units[str(item.pk)]
        if item.action == "ok":
            assert unit.state == State.FINISHED, (item.pk, unit.state)
            continue
        exception_class, words = ROW_POISON[item.action]
        assert unit.state == State.FAILED, (item.action, unit.state)
        assert (unit.attempts, unit.crashes) == (1, 0), (item.action, unit.attempts)
        failures = list(unit.failures.all())
        assert len(failures) == 1, (item.action, failures)
        assert failures[0].exception_class == exception_class, (item.action, failures[0])
        assert words in failures[0].message, (item.action, failures[0].message)
        assert "\x00" not in failures[0].message + failures[0].traceback
    # Innocent rows committed exactly once; a poison row's writes rolled back with it.
    counts = dict(Effect.objects.filter(worker="poison_rows")
                  .values_list("item_id").annotate(n=Count("id")))
    assert counts == {i.pk: 1 for i in items if i.action == "ok"}, counts
