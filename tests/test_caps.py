"""A worker's ``concurrency`` caps the units running at once, not those claimed ahead
(``supervisor/caps.py``): a capped worker's units still come in batches."""

from __future__ import annotations

import time
import uuid
from itertools import pairwise
from types import SimpleNamespace

import pytest
from django.utils import timezone

from django_dbworker.models import Execution, State
from django_dbworker.rows.registry import workers
from django_dbworker.rows.unit import RowUnit
from django_dbworker.supervisor.caps import Caps
from django_dbworker.tasks.unit import TaskUnit
from tests.testapp.models import Effect, Item


def unit(worker: str, n: int) -> RowUnit:
    return RowUnit(n, worker, str(n), uuid.uuid4(), 1, timezone.now())


def task(n: int) -> TaskUnit:
    now = timezone.now()
    return TaskUnit(uuid.uuid4(), "tests.testapp.tasks.noop", uuid.uuid4(), 1, now, now)


def child(slot: int, *held) -> SimpleNamespace:
    return SimpleNamespace(slot=slot, sent=dict(enumerate(held)))


def test_a_worker_at_its_cap_goes_only_to_the_children_that_hold_its_units():
    caps = Caps([workers["capped"], workers["touch"]], children=3)  # caps 1 and 4
    a, b, c = child(0, unit("capped", 1)), child(1), child(2)
    everyone = [a, b, c]
    assert caps.admit(a, everyone)(unit("capped", 2)), "a holds capped units: more may follow"
    allowed = caps.admit(b, everyone)
    assert not allowed(unit("capped", 3)), "capped is in one child already, its cap"
    assert allowed(unit("touch", 4)), "touch may use every child"
    assert allowed(task(5)), "tasks have no cap of their own"
    # Once a's units are reported, another child may take the capped worker's units, and
    # then only that one.
    a.sent.clear()
    assert caps.admit(b, everyone)(unit("capped", 6))
    b.sent[0] = unit("capped", 6)
    assert not caps.admit(a, everyone)(unit("capped", 7))
    assert not caps.admit(c, everyone)(unit("capped", 7))


def test_no_cap_binds_when_every_worker_may_use_every_child():
    caps = Caps([workers["touch"]], children=4)  # concurrency=4
    assert caps.admit(child(0), [child(0)]) is None
    assert not Caps([workers["capped"]], children=1).binding


def test_claims_stop_at_what_the_allowed_children_can_hold():
    capped = workers["capped"]
    caps = Caps([capped], children=2)
    assert caps.claimable(capped, held=0, depth=1) == 1, "one unit at a time: the cap"
    assert caps.claimable(capped, held=1, depth=1) == 0
    assert caps.claimable(capped, held=3, depth=5) == 7, "two batches of 5 in its child"


@pytest.mark.processes
def test_a_capped_worker_runs_one_unit_at_a_time_with_units_claimed_ahead(runworkers):
    items = [Item.objects.create(kind="capped") for _ in range(120)]
    # Units kept ahead whatever the machine's load (tests/testapp/apps.py).
    p = runworkers("--worker", "capped", "--concurrency", "2", "--burst",
                   extra_env={"DBWORKER_TEST_PREFETCH_KEEP": "1"})
    most = 0
    while p.process.poll() is None:
        most = max(most, Execution.objects.filter(worker="capped",
                                                  state=State.WORKING).count())
        time.sleep(0.005)
    assert p.wait(30) == 0, p.output()
    effects = list(Effect.objects.filter(worker="capped"))
    assert sorted(e.item_id for e in effects) == [i.pk for i in items], "each ran once"
    spans = sorted(tuple(map(float, e.note.split())) for e in effects)
    overlaps = [(x, y) for x, y in pairwise(spans) if y[0] < x[1]]
    assert not overlaps, f"two units of a concurrency=1 worker ran at once: {overlaps[:3]}"
    assert most > 1, "units of the capped worker were claimed ahead of the one running"
