"""Units claimed ahead (``supervisor/prefetch.py``) with real ``runworkers`` and signals.

A supervisor claims ahead only once units are known to be short, so each test first lets
a few quick units run, then holds its only child with a slow one: the units claimed ahead
meanwhile are WORKING in the database but run by nobody. They must go back at once when
the supervisor stops, not count as crashes, and still run exactly once.

The worker, ``ahead``, is not transactional: while its slow handler sleeps it holds no
transaction, so the supervisor can claim ahead on SQLite too. (A transactional handler
holds SQLite's only write lock for its whole run: nothing is claimed meanwhile, and
whether any unit waits then depends on where the claims' batches happened to end.)
"""

from __future__ import annotations

import signal

import pytest
from django.db import connection
from django.db.models import Count

from django_dbworker.models import Execution, State
from tests.conftest import wait_for
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

WORKER = "ahead"
ONE_CHILD = ("--worker", WORKER, "--concurrency", "1")
#: Four units ahead per child, and units kept waiting whatever the machine's load
#: (``tests/testapp/apps.py``): the tests wait for units claimed ahead, not for the
#: heuristics that decide how many.
PREFETCH = {"DBWORKER_TEST_PREFETCH": "4", "DBWORKER_TEST_PREFETCH_KEEP": "1"}


def queue(quick: int, after: int) -> tuple[Item, list[Item]]:
    """``quick`` short units, one slow (8 s) unit, ``after`` short units: in claim order.
    The slow unit must outlast the checks made while it runs, on a loaded machine too."""
    first = [Item.objects.create(kind=WORKER) for _ in range(quick)]
    slow = Item.objects.create(kind=WORKER, action="sleep:8")
    return slow, first + [Item.objects.create(kind=WORKER) for _ in range(after)]


def running(item: Item) -> bool:
    """The handler of ``item`` is mid-run: claimed, and it wrote its Effect (the handlers
    write it first, then sleep)."""
    return (Execution.objects.filter(worker=WORKER, source_id=str(item.pk),
                                     state=State.WORKING).exists()
            and Effect.objects.filter(worker=WORKER, item_id=item.pk).exists())


def waiting_ahead(slow: Item) -> int:
    """Units claimed (WORKING) that no handler runs: all but the slow one."""
    return Execution.objects.filter(worker=WORKER, state=State.WORKING).exclude(
        source_id=str(slow.pk)).count()


def runs(items: list[Item]) -> dict[int, int]:
    """How many times each item's handler started (its Effects)."""
    counts = dict(Effect.objects.filter(worker=WORKER).values_list("item_id")
                  .annotate(n=Count("id")).values_list("item_id", "n"))
    return {item.pk: counts.get(item.pk, 0) for item in items}


def test_sigterm_gives_back_units_claimed_ahead_at_once(runworkers):
    slow, rest = queue(quick=18, after=10)
    rw = runworkers(*ONE_CHILD, "--verbosity", "2", extra_env=PREFETCH)
    wait_for(lambda: running(slow), what="the slow handler to be running")
    wait_for(lambda: waiting_ahead(slow), what="units claimed ahead")

    rw.signal(signal.SIGTERM)
    if connection.vendor == "postgresql":
        # Given back while the slow handler still runs, not after it. (On SQLite the
        # supervisor writes nothing while a unit runs, as a handler may hold the only write
        # lock: they go back when it is through.)
        wait_for(lambda: not waiting_ahead(slow), timeout=60,
                 what="the units to be given back")  # then: while the slow one runs
        assert running(slow)
    assert rw.wait(30) == 0, rw.output()
    assert "gave_back" in rw.output()
    # (Which unit the child held when the signal came is not certain: a batch claimed
    # ahead may be dispatched out of pk order. Exactly-once is checked below for all.)

    given_back = Execution.objects.filter(worker=WORKER, state=State.PENDING)
    assert given_back.exists()
    assert all(e.attempts == 0 and e.crashes == 0 and e.token is None for e in given_back), (
        "unclaimed, not crashed: no attempt and no crash is counted")
    assert not Effect.objects.filter(item_id__in=[e.source_id for e in given_back]).exists()

    assert runworkers(*ONE_CHILD, "--burst").wait(60) == 0
    assert runs([slow, *rest]) == {item.pk: 1 for item in [slow, *rest]}
    assert set(Execution.objects.filter(worker=WORKER).values_list("attempts", flat=True)) \
        == {1}


def test_killed_supervisor_leaves_units_claimed_ahead_to_the_reaper(runworkers):
    slow, rest = queue(quick=18, after=10)
    doomed = runworkers(*ONE_CHILD, extra_env=PREFETCH)
    wait_for(lambda: running(slow), what="the slow handler to be running")
    wait_for(lambda: waiting_ahead(slow), what="units claimed ahead")
    doomed.signal_group(signal.SIGKILL)
    doomed.wait(10)

    heir = runworkers(*ONE_CHILD)
    everything = [slow, *rest]
    wait_for(lambda: not Execution.objects.filter(worker=WORKER).exclude(
        state=State.FINISHED).exists(), timeout=60,
        what="the heir to take the killed supervisor's units back and run everything")
    heir.signal(signal.SIGTERM)
    assert heir.wait(30) == 0, heir.output()
    # The slow unit's first run was killed after it wrote its Effect (the handler holds no
    # transaction that could take it back), so it ran twice; the units claimed ahead never
    # ran in the killed supervisor: once each.
    assert runs(everything) == {item.pk: 2 if item == slow else 1 for item in everything}


def test_prefetch_zero_claims_only_for_free_children(runworkers):
    slow, _rest = queue(quick=18, after=10)
    rw = runworkers(*ONE_CHILD, extra_env={"DBWORKER_TEST_PREFETCH": "0"})
    wait_for(lambda: running(slow), what="the slow handler to be running")
    assert waiting_ahead(slow) == 0
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
