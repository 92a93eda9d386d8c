"""The sweep (``pending.Sweeper``): rows written without ``save()`` get their PENDING unit,
executions whose row is gone are removed, a bounded range of keys at a time."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from django_dbworker import workers
from django_dbworker.models import Execution, State
from django_dbworker.rows import keys, store
from django_dbworker.rows.pending import Sweeper
from django_dbworker.rows.store import Claimant
from tests.testapp.models import Document, Item, Tag

pytestmark = pytest.mark.django_db(transaction=True)


def _units(worker):
    return sorted(Execution.objects.filter(worker=worker).values_list("source_id", flat=True))


def _raw_delete(table, pks):
    with connection.cursor() as cursor:  # behind Django's back: no signal
        cursor.execute(f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(pks))})",
                       pks)


def test_each_chunk_adds_the_eligible_rows_of_its_range_once():
    items = Item.objects.bulk_create(
        [Item(kind="touch" if i % 4 else "other", enabled=i != 5) for i in range(11)])
    _raw_delete("testapp_item", [items[2].pk, items[7].pk])  # gaps in the keys
    Item.objects.get(pk=items[3].pk).save()  # one already has its unit
    units_before = Execution.objects.get(worker="touch", source_id=str(items[3].pk))
    sweeper = Sweeper(workers["touch"], batch=3)
    added = []
    while sweeper.orphan_cursor is None:
        n, done = sweeper.step()
        assert not done
        added.append(n)
    expected = [i for n, i in enumerate(items) if n % 4 and n != 5 and n not in (2, 7)]
    assert _units("touch") == sorted(str(i.pk) for i in expected)
    # 9 rows left, 3 a chunk; the 4th step finds none after them and turns to orphans
    assert len(added) == 4 and added[3] == 0 and sum(added) == len(expected) - 1, added
    assert Execution.objects.get(pk=units_before.pk).state == units_before.state
    assert sweeper.step() == (0, False)  # the orphans' first range: nothing to remove
    while not sweeper.step()[1]:
        pass
    assert sweeper.cursor is None and sweeper.orphan_cursor is None
    assert Sweeper(workers["touch"], batch=3).sweep_all() == 0  # a second pass adds none


def test_a_chunk_is_two_queries_without_its_keys_in_them(django_assert_max_num_queries):
    Item.objects.bulk_create([Item() for _ in range(50)])
    Sweeper(workers["touch"], batch=20).sweep_all()
    sweeper = Sweeper(workers["touch"], batch=20)
    seen = []

    def note(execute, sql, params, many, context):
        seen.append(params)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note), django_assert_max_num_queries(2):
        assert sweeper.step() == (0, False)
    assert all(len(params or ()) <= 6 for params in seen), seen  # not the chunk's 20 keys


@pytest.mark.parametrize(("model", "worker", "make"), [
    (Document, "read_document", lambda i: Document(id=uuid.UUID(int=i), title="t")),
    (Tag, "tag", lambda i: Tag(code=f"code-{i:03}")),
])
def test_uuid_and_text_keys_are_swept_in_ranges(model, worker, make):
    rows = model.objects.bulk_create([make(i) for i in range(1, 8)])
    assert Sweeper(workers[worker], batch=2).sweep_all() == 7
    assert _units(worker) == sorted(keys.to_key(model, r.pk, "default") for r in rows)
    assert Sweeper(workers[worker], batch=2).sweep_all() == 0
    gone = rows.pop(3)
    model.objects.filter(pk=gone.pk).delete()  # its post_delete removes its unit ...
    unit = Execution.objects.create(worker=worker, source_id=keys.to_key(
        model, gone.pk, "default"), sort_key=0, state=State.FINISHED)  # ... put it back
    Sweeper(workers[worker], batch=2).sweep_all()  # the orphan goes, the others stay
    assert not Execution.objects.filter(pk=unit.pk).exists()
    assert _units(worker) == sorted(keys.to_key(model, r.pk, "default") for r in rows)


def test_orphans_go_range_by_range_and_running_units_stay():
    items = [Item.objects.create() for _ in range(9)]
    loose = Item.objects.create(kind="loose")
    claims = store.claim(workers["touch"], 10, Claimant(), 30)
    store.unclaim([c for c in claims if c.source_key != str(items[4].pk)])  # one runs
    _raw_delete("testapp_item", [items[i].pk for i in (0, 3, 4, 8)])
    sweeper = Sweeper(workers["touch"], batch=2)
    sweeper.sweep_all()
    # save() gave every worker of the model a unit (eligible or not): loose's row too
    kept = [str(items[i].pk) for i in (1, 2, 4, 5, 6, 7)] + [str(loose.pk)]
    assert _units("touch") == sorted(kept)
    assert Execution.objects.get(worker="touch", source_id=str(items[4].pk)).state \
        == State.WORKING  # its handler finds the row gone and forgets it
    assert len(_units("loose")) == 10  # another worker's orphans are left to its own sweep


def test_a_sweep_that_finds_nothing_never_waits_for_sqlites_write_lock(vendor, settings):
    """Children hold SQLite's only write lock while they run units: a sweep with nothing
    to add or remove must not queue for it (a delete of no rows would)."""
    if vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    import sqlite3

    from django_dbworker.db import connections as db

    Item.objects.bulk_create([Item() for _ in range(7)])
    Sweeper(workers["touch"], batch=3).sweep_all()
    settings.DBWORKER = {**settings.DBWORKER, "SQLITE_BUSY_TIMEOUT": 0.05}
    connection.close()
    db.own_process(connection.alias)
    connection.ensure_connection()
    other = sqlite3.connect(connection.settings_dict["NAME"], isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a unit runs elsewhere
    try:
        assert Sweeper(workers["touch"], batch=3).sweep_all() == 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert len(_units("touch")) == 7
