"""``eligible`` decides which rows run and in what order, in batches too (issue #23, item 1):
with one child, handlers start in eligible's order exactly; claims of several units come
back in their candidates' order; tasks keep priority order the same way."""

from __future__ import annotations

import pytest
from django.utils import timezone

from django_dbworker.models import Execution
from django_dbworker.rows import planner
from django_dbworker.rows.registry import workers
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Effect, Ranked
from tests.testapp.tasks import add

pytestmark = pytest.mark.django_db(transaction=True)

#: The ranks of the issue's example, then ties.
RANKS = [5, 42, 17, 8, 99, 23, 61, 3, 70, 12, 17, 42, 5]


def expected(rows: list[Ranked], worker: str) -> list[int]:
    """eligible's order; ties (same rank) in primary-key order, the claim's tie-breaker."""
    key = {"rank_pk": lambda r: r.pk, "rank_up": lambda r: (r.rank, r.pk),
           "rank_down": lambda r: (-r.rank, r.pk)}[worker]
    return [r.pk for r in sorted(rows, key=key)]


def load(how: str) -> list[Ranked]:
    if how == "bulk_create":  # no post_save: the sweep finds them
        Ranked.objects.bulk_create(Ranked(rank=rank) for rank in RANKS)
        return list(Ranked.objects.order_by("pk"))
    return [Ranked.objects.create(rank=rank) for rank in RANKS]


@pytest.mark.parametrize("worker", ["rank_pk", "rank_up", "rank_down"])
@pytest.mark.parametrize("limit", [3, 32])
def test_a_batch_claim_comes_back_in_eligibles_order(worker, limit):
    rows = load("save")
    claimed: list[int] = []
    while batch := planner.claim(workers[worker], limit, Claimant(), 30):
        claimed += [int(c.source_key) for c in batch]
    assert claimed == expected(rows, worker)


def test_a_batch_of_tasks_comes_back_in_priority_order_ties_in_enqueue_order():
    results = []
    for i, priority in enumerate([0, 10, -5, 10, 0, 50, -5, 10]):
        results.append((priority, i, add.using(priority=priority).enqueue(i, i).id))
    claims = taskplanner.claim(None, 20, Claimant(), 30)
    order = {str(task_id): (priority, i) for priority, i, task_id in results}
    got = [order[str(c.task_id)] for c in claims]
    # higher priority first; the same priority in the order they became available
    assert got == sorted(got, key=lambda pi: (-pi[0], pi[1]))


@pytest.mark.processes
@pytest.mark.parametrize("worker", ["rank_pk", "rank_up", "rank_down"])
@pytest.mark.parametrize("how", ["save", "bulk_create"])
def test_one_child_starts_handlers_in_eligibles_order(runworkers, worker, how):
    rows = load(how)
    rw = runworkers("--worker", worker, "--concurrency", "1", "--burst")
    assert rw.wait(120) == 0, rw.output()
    ran = list(Effect.objects.filter(worker=worker).order_by("id")
               .values_list("item_id", flat=True))
    assert ran == expected(rows, worker), rw.output()
    assert Execution.objects.filter(worker=worker, finished_at__lte=timezone.now()).count() \
        == len(RANKS)
