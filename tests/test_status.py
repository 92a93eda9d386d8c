"""Execution status singly and as an expression inside ordinary querysets."""

import pytest
from django.db.models import Q

from django_dbworker import ExecutionStatus, execution_status, has_execution_status, workers
from django_dbworker.exceptions import UnknownWorker
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Document, Effect, Item, Tag

pytestmark = pytest.mark.django_db(transaction=True)
FINISHED, FAILED = ExecutionStatus.FINISHED, ExecutionStatus.FAILED


@pytest.fixture
def mixed():
    ok, bad, fresh = Item.objects.create(), Item.objects.create(action="raise"), None
    run_until_idle(["touch"])
    fresh = Item.objects.create()
    return ok, bad, fresh


def pks(qs):
    return sorted(qs.values_list("pk", flat=True))


def test_filter_exclude_and_q(mixed):
    ok, bad, fresh = mixed
    done = has_execution_status(worker="touch", statuses=[FINISHED])
    failed = has_execution_status(worker="touch", statuses=[FAILED])
    assert pks(Item.objects.filter(done)) == [ok.pk]
    assert pks(Item.objects.exclude(done)) == [bad.pk, fresh.pk]
    assert pks(Item.objects.filter(done | failed)) == [ok.pk, bad.pk]
    assert pks(Item.objects.filter(~Q(done) & ~Q(failed))) == [fresh.pk]
    assert pks(Item.objects.filter(has_execution_status(worker="touch"))) == [ok.pk, bad.pk]


def test_annotate_many_rows_in_one_query(mixed, django_assert_num_queries):
    with django_assert_num_queries(1):
        rows = list(
            Item.objects.annotate(done=has_execution_status(worker="touch", statuses=[FINISHED]))
            .order_by("pk").values_list("pk", "done")
        )
    assert [done for _, done in rows] == [True, False, False]


def test_string_statuses_and_literal_source_id(mixed):
    ok, bad, _ = mixed
    expr = has_execution_status(worker="touch", statuses=["FAILED"], source_id=bad.pk)
    assert Item.objects.filter(expr).count() == 3  # a constant condition: true for every row
    assert not Item.objects.filter(
        has_execution_status(worker="touch", statuses=["FAILED"], source_id=ok.pk)
    ).exists()


def test_single_status(mixed):
    ok, bad, fresh = mixed
    assert execution_status(worker="touch", source_id=ok.pk) == FINISHED
    assert execution_status(worker="touch", source_id=bad.pk) == FAILED
    assert execution_status(worker="touch", source_id=fresh.pk) is None
    assert execution_status(worker=workers["touch"], source_id=123456) is None


def test_unknown_worker_names_it():
    with pytest.raises(UnknownWorker, match="'nope'"):
        execution_status(worker="nope", source_id=1)
    with pytest.raises(UnknownWorker, match="'nope'"):
        has_execution_status(worker="nope")
    with pytest.raises(UnknownWorker, match="'nope'"):
        workers["nope"].state(1)


def test_bad_statuses_are_named():
    with pytest.raises(ValueError, match="'DONE' is not an execution status"):
        has_execution_status(worker="touch", statuses=["DONE"])
    with pytest.raises(ValueError, match="'PENDING' is not an execution status"):
        has_execution_status(worker="touch", statuses=["PENDING"])
    with pytest.raises(ValueError, match="empty"):
        has_execution_status(worker="touch", statuses=[])


def test_dependent_worker_waits_for_the_other():
    item = Item.objects.create(action="raise")
    other = Item.objects.create()
    run_until_idle(["after_touch"])
    assert not Effect.objects.filter(worker="after_touch").exists(), "touch has not run yet"
    run_until_idle(["touch", "after_touch"])
    assert list(Effect.objects.filter(worker="after_touch").values_list("item_id", flat=True)) \
        == [other.pk], "only the row whose touch FINISHED"
    assert execution_status(worker="after_touch", source_id=item.pk) is None


def test_uuid_primary_keys():
    good, bad = Document.objects.create(title="a"), Document.objects.create(title="bad")
    assert run_until_idle(["read_document"]) == {"finished": 1, "unfinished": 1}
    assert execution_status(worker="read_document", source_id=good.pk) == FINISHED
    assert execution_status(worker="read_document", source_id=str(good.pk)) == FINISHED
    assert execution_status(worker="read_document", source_id=bad.pk) == "UNFINISHED"
    assert list(Document.objects.filter(
        has_execution_status(worker="read_document", statuses=[FINISHED])
    )) == [good]


def test_char_primary_keys_claimed_in_eligible_order():
    for code in ["b", "c", "a"]:
        Tag.objects.create(code=code)
    from django_dbworker.rows import planner
    from django_dbworker.units.claimant import Claimant

    claims = planner.claim(workers["tag"], 3, Claimant(), lease=30)
    assert sorted(c.source_key for c in claims) == ["a", "b", "c"]
    assert list(Tag.objects.filter(
        has_execution_status(worker="tag", statuses=["WORKING"])
    ).order_by("code").values_list("code", flat=True)) == ["a", "b", "c"]


def test_claim_order_follows_eligible_ordering():
    from django_dbworker.rows import planner
    from django_dbworker.units.claimant import Claimant

    ranks = [5, 1, 9, 3]
    items = [Item.objects.create(kind="ranked", rank=r) for r in ranks]
    order = []
    while claims := planner.claim(workers["ranked"], 1, Claimant(), lease=30):
        order.append(int(claims[0].source_key))
    assert order == [i.pk for i in sorted(items, key=lambda i: -i.rank)]

    tags = ["m", "z", "a"]
    for code in tags:
        Tag.objects.create(code=code)
    order = []
    while claims := planner.claim(workers["tag"], 1, Claimant(), lease=30):
        order.append(claims[0].source_key)
    assert order == ["z", "m", "a"], "tag is ordered by -code"


def test_pk_order_by_default_and_batches():
    from django_dbworker.rows import planner
    from django_dbworker.units.claimant import Claimant

    items = [Item.objects.create() for _ in range(5)]
    first = planner.claim(workers["touch"], 3, Claimant(), lease=30)
    assert sorted(int(c.source_key) for c in first) == [i.pk for i in items[:3]]
    assert len({c.token for c in first}) == 1
    rest = planner.claim(workers["touch"], 3, Claimant(), lease=30)
    assert sorted(int(c.source_key) for c in rest) == [i.pk for i in items[3:]]
    assert planner.claim(workers["touch"], 3, Claimant(), lease=30) == []


def test_ineligible_rows_wait_until_they_become_eligible():
    item = Item.objects.create(enabled=False)
    assert run_until_idle(["touch"]) == {}
    Item.objects.filter(pk=item.pk).update(enabled=True)  # no signal: still pending
    assert run_until_idle(["touch"]) == {"finished": 1}


def test_rows_written_without_save_are_found_by_the_sweep():
    Item.objects.bulk_create([Item() for _ in range(30)])
    from django_dbworker.models import Execution

    assert not Execution.objects.filter(worker="touch").exists()
    assert run_until_idle(["touch"]) == {"finished": 30}


def test_orphaned_executions_are_removed_by_the_sweep():
    from django.db import connection

    from django_dbworker.models import Execution
    from django_dbworker.rows.sweep import Sweeper

    items = [Item.objects.create() for _ in range(3)]
    run_until_idle(["touch"])
    with connection.cursor() as cursor:  # deleted behind Django's back: no signal
        cursor.execute("DELETE FROM testapp_item WHERE id = %s", [items[0].pk])
    assert Execution.objects.filter(worker="touch").count() == 3
    Sweeper(workers["touch"], batch=2).sweep_all()
    assert sorted(Execution.objects.filter(worker="touch").values_list("source_id", flat=True)) \
        == sorted(str(i.pk) for i in items[1:])


def test_deleting_a_source_row_is_never_blocked():
    item = Item.objects.create()
    run_until_idle(["touch"])
    from django_dbworker.models import Execution

    item.delete()
    assert not Execution.objects.filter(source_id=str(item.pk)).exists()


def test_dependent_worker_sees_rows_written_without_save_at_once():
    Item.objects.bulk_create([Item() for _ in range(4)])
    assert run_until_idle(["touch", "after_touch"]) == {"finished": 8}
    from django_dbworker.rows import planner
    from django_dbworker.rows.sweep import Sweeper
    from django_dbworker.units.claimant import Claimant

    # and without any sweep: touch's completion makes the row pending for after_touch
    Item.objects.bulk_create([Item()])
    new = Item.objects.order_by("-pk").first()
    Sweeper(workers["touch"], 100).sweep_all()
    (c,) = planner.claim(workers["touch"], 1, Claimant(), lease=30)
    from django_dbworker.rows.runner import run

    run(c)
    (after,) = planner.claim(workers["after_touch"], 1, Claimant(), lease=30)
    assert int(after.source_key) == new.pk
