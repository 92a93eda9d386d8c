"""Discovery with real ``runworkers``: rows written without ``save()`` (``bulk_create``,
raw SQL) are found at the cost of the new rows; ``--burst`` does not wait for a full pass;
the full pass finds what the watermark cannot see."""

from __future__ import annotations

import pytest
from django.db import connection

from django_dbworker.models import Execution, State, SweepState
from tests.conftest import wait_for
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

ONE_CHILD = ("--worker", "touch", "--concurrency", "1")


def finished(items) -> int:
    return Execution.objects.filter(
        worker="touch", state=State.FINISHED,
        source_id__in=[str(i.pk) for i in items]).count()


def history(n: int) -> list[Item]:
    """``n`` rows whose units finished long ago, loaded the way a user loads rows."""
    rows = Item.objects.bulk_create([Item() for _ in range(n)], batch_size=5000)
    Execution.objects.bulk_create(
        [Execution(worker="touch", source_id=str(r.pk), sort_key=r.pk, state=State.FINISHED)
         for r in rows], batch_size=5000)
    return rows


def insert_raw(n: int) -> list[Item]:
    table = Item._meta.db_table
    with connection.cursor() as cursor:
        for _ in range(n):
            cursor.execute(f"INSERT INTO {table} (kind, action, enabled, rank, steps) "
                           "VALUES ('touch', 'ok', %s, 0, 0)",
                           [True])
    return list(Item.objects.order_by("-pk")[:n])


def test_rows_written_without_save_are_found_while_runworkers_runs(runworkers):
    runworkers(*ONE_CHILD)
    bulk = Item.objects.bulk_create([Item() for _ in range(30)])
    raw = insert_raw(3)
    wait_for(lambda: finished(bulk + raw) == 33, timeout=30, what="33 units finished")
    assert Effect.objects.filter(worker="touch").count() == 33
    state = SweepState.objects.get(worker="touch")
    assert state.watermark == max(r.pk for r in bulk + raw)


def test_a_burst_reads_the_new_rows_not_the_history(runworkers):
    old = history(5000)
    assert runworkers(*ONE_CHILD, "--burst").wait() == 0  # its first pass walks them once
    assert SweepState.objects.get(worker="touch").watermark == old[-1].pk
    # Units lost behind our back below the watermark: a burst does not walk the history
    # to find them (the full pass will), it reads only above the watermark.
    lost = old[100:110]
    Execution.objects.filter(worker="touch", source_id__in=[str(r.pk) for r in lost]).delete()
    new = Item.objects.bulk_create([Item() for _ in range(100)])
    process = runworkers(*ONE_CHILD, "--burst")
    assert process.wait() == 0, process.output()
    assert finished(new) == 100
    assert not Execution.objects.filter(
        worker="touch", source_id__in=[str(r.pk) for r in lost]).exists()
    assert Effect.objects.filter(worker="touch").count() == 100


def test_the_full_pass_finds_what_the_watermark_cannot_see(runworkers):
    old = history(300)
    assert runworkers(*ONE_CHILD, "--burst").wait() == 0
    lost = old[10:13]
    Execution.objects.filter(worker="touch", source_id__in=[str(r.pk) for r in lost]).delete()
    # a row made eligible by update() below the watermark, and one with an explicit key
    Item.objects.filter(pk=old[20].pk).update(kind="other")
    Execution.objects.filter(worker="touch", source_id=str(old[20].pk)).delete()
    Item.objects.filter(pk=old[20].pk).update(kind="touch")
    runworkers(*ONE_CHILD, extra_env={"DBWORKER_TEST_FULL_SWEEP": "1"})
    wait_for(lambda: finished([*lost, old[20]]) == 4, timeout=30,
             what="the full pass finds the rows below the watermark")
    wait_for(lambda: SweepState.objects.get(worker="touch").full_phase == "", timeout=30)
    assert SweepState.objects.get(worker="touch").full_ended_at is not None
