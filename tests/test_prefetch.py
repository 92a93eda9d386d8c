"""Units claimed ahead (``supervisor/prefetch.py``) with real ``runworkers`` and signals.

A supervisor claims ahead only once units are known to be short, so each test first lets
a few quick units run, then holds its only child with a slow one: the units claimed ahead
meanwhile are WORKING in the database but run by nobody. They must go back at once when
the supervisor stops, not count as crashes, and still run exactly once.
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection
from django.db.models import Count

from django_dbworker.models import Execution, State
from tests.conftest import wait_for
from tests.test_processes import ONE_CHILD, running
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

PREFETCH = {"DBWORKER_TEST_PREFETCH": "4"}


def queue(quick: int, after: int) -> tuple[Item, list[Item]]:
    """``quick`` short units, one slow (8 s) unit, ``after`` short units: in claim order.

    The slow unit must outlast the checks made while it runs, on a loaded machine too.
    On SQLite it must not end a batch: while its handler holds the only write lock, the
    supervisor cannot claim, so only units sent with it (in its batch, after it) are
    claimed ahead. The worker's concurrency (4) makes the batches [1], [2-5], [6-9], ...:
    with 18 quick units the slow one is the second of [18-21].
    """
    first = [Item.objects.create() for _ in range(quick)]
    slow = Item.objects.create(action="sleep:8")
    return slow, first + [Item.objects.create() for _ in range(after)]


def waiting_ahead(slow: Item) -> int:
    """Units claimed (WORKING) that no handler runs: all but the slow one."""
    return Execution.objects.filter(worker="touch", state=State.WORKING).exclude(
        source_id=str(slow.pk)).count()


def run_once_each(items: list[Item]) -> None:
    counts = dict(Effect.objects.filter(worker="touch").values_list("item_id")
                  .annotate(n=Count("id")).values_list("item_id", "n"))
    assert {item.pk: counts.get(item.pk, 0) for item in items} == {i.pk: 1 for i in items}


def test_sigterm_gives_back_units_claimed_ahead_at_once(runworkers):
    slow, rest = queue(quick=18, after=10)
    rw = runworkers(*ONE_CHILD, "--verbosity", "2", extra_env=PREFETCH)
    wait_for(lambda: running(slow), what="the slow handler to be running")
    wait_for(lambda: waiting_ahead(slow), timeout=5, what="units claimed ahead")

    rw.signal(signal.SIGTERM)
    if connection.vendor == "postgresql":
        # Given back while the slow handler still runs, not after it. (On SQLite the
        # running handler's transaction holds the only write lock until it commits.)
        wait_for(lambda: not waiting_ahead(slow), timeout=2, what="the units to be given back")
    assert rw.wait(30) == 0, rw.output()
    assert "gave_back" in rw.output()
    # (Which unit the child held when the signal came is not certain: a batch claimed
    # ahead may be dispatched out of pk order. Exactly-once is checked below for all.)

    given_back = Execution.objects.filter(worker="touch", state=State.PENDING)
    assert given_back.exists()
    assert all(e.attempts == 0 and e.crashes == 0 and e.token is None for e in given_back), (
        "unclaimed, not crashed: no attempt and no crash is counted")
    assert not Effect.objects.filter(item_id__in=[e.source_id for e in given_back]).exists()

    assert runworkers(*ONE_CHILD, "--burst").wait(60) == 0
    run_once_each([slow, *rest])
    assert set(Execution.objects.filter(worker="touch").values_list("attempts", flat=True)) \
        == {1}


def test_killed_supervisor_leaves_units_claimed_ahead_to_the_reaper(runworkers):
    slow, rest = queue(quick=18, after=10)
    doomed = runworkers(*ONE_CHILD, lease=3, extra_env=PREFETCH)
    wait_for(lambda: running(slow), what="the slow handler to be running")
    wait_for(lambda: waiting_ahead(slow), timeout=5, what="units claimed ahead")
    doomed.signal_group(signal.SIGKILL)
    doomed.wait(10)

    heir = runworkers(*ONE_CHILD, lease=3)
    everything = [slow, *rest]
    wait_for(lambda: Effect.objects.filter(worker="touch").count() >= len(everything),
             timeout=60, what="the heir to run everything once the leases expired")
    heir.signal(signal.SIGTERM)
    assert heir.wait(30) == 0, heir.output()
    run_once_each(everything)
    assert not Execution.objects.filter(worker="touch").exclude(state=State.FINISHED).exists()


def test_prefetch_zero_claims_only_for_free_children(runworkers):
    slow, _rest = queue(quick=18, after=10)
    rw = runworkers(*ONE_CHILD, extra_env={"DBWORKER_TEST_PREFETCH": "0"})
    wait_for(lambda: running(slow), what="the slow handler to be running")
    assert waiting_ahead(slow) == 0
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
