"""Discovery (``Sweeper``): rows written without ``save()`` get their PENDING unit, the
pass over new rows reads only above the watermark, gaps are looked at again, the full pass
is paced, resumable and removes executions whose row is gone."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker import workers
from django_dbworker.db import keys
from django_dbworker.models import Execution, State, SweepState
from django_dbworker.rows import planner, store
from django_dbworker.rows.sweep import FULL_SAVE_EVERY, GAP_WAIT, Sweeper
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Document, Item, Tag

pytestmark = pytest.mark.django_db(transaction=True)


def _units(worker):
    return sorted(Execution.objects.filter(worker=worker).values_list("source_id", flat=True))


def _raw_delete(table, pks):
    with connection.cursor() as cursor:  # behind Django's back: no signal
        cursor.execute(f"DELETE FROM {table} WHERE id IN ({', '.join(['%s'] * len(pks))})",
                       pks)


def _pass(sweeper, now=0.0):
    """One pass's urgent work, a chunk a step, as the Discovery duty drives it."""
    sweeper.restart()
    added = []
    while True:
        n, done = sweeper.step(now)
        added.append(n)
        if done:
            return added


def _full(sweeper, now=0.0):
    """Walk the background full pass the sweeper holds to its end."""
    added = 0
    while sweeper.full_phase:
        now += 1
        added += sweeper.background(now)
    return added


def _state(worker="touch"):
    return SweepState.objects.get(worker=worker)


def test_new_rows_are_swept_chunk_by_chunk_above_the_watermark():
    items = Item.objects.bulk_create(
        [Item(kind="touch" if i % 4 else "other", enabled=i != 5) for i in range(11)])
    _raw_delete("testapp_item", [items[2].pk, items[7].pk])  # gaps in the keys
    Item.objects.get(pk=items[3].pk).save()  # one already has its unit
    units_before = Execution.objects.get(worker="touch", source_id=str(items[3].pk))
    sweeper = Sweeper(workers["touch"], batch=3)
    added = _pass(sweeper)
    expected = [i for n, i in enumerate(items) if n % 4 and n != 5 and n not in (2, 7)]
    assert _units("touch") == sorted(str(i.pk) for i in expected)
    # 11 keys, 3 a chunk (2 of them deleted); the last step finds none and ends the pass
    assert len(added) == 5 and added[-1] == 0 and sum(added) == len(expected) - 1, added
    assert Execution.objects.get(pk=units_before.pk).state == units_before.state
    state = _state()
    assert state.watermark == items[-1].pk
    assert state.full_ended_at is not None, "the first pass walked every row: a full pass"
    assert sweeper.full_phase == "", "no full pass is due after it"
    assert _pass(Sweeper(workers["touch"], batch=3)) == [0]  # a second pass adds none


def test_a_pass_with_nothing_new_reads_only_above_the_watermark(
        django_assert_max_num_queries):
    Item.objects.bulk_create([Item() for _ in range(50)])
    _pass(Sweeper(workers["touch"], batch=20))
    Execution.objects.filter(worker="touch").delete()  # the history: never read again
    sweeper = Sweeper(workers["touch"], batch=20)
    seen = []

    def note(execute, sql, params, many, context):
        seen.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(note), django_assert_max_num_queries(2):
        assert _pass(sweeper) == [0]  # where it stands, then the rows above it: none
    assert all(len(params or ()) <= 6 for _, params in seen), seen
    assert not Execution.objects.filter(worker="touch").exists()
    new = Item.objects.bulk_create([Item() for _ in range(3)])
    assert sum(_pass(sweeper)) == 3
    assert _units("touch") == sorted(str(i.pk) for i in new)


def test_the_pass_over_new_rows_holds_its_plan_on_a_never_analyzed_table(vendor):
    """The new rows are read through the primary key index without statistics (none here:
    PostgreSQL runs with autovacuum off). PostgreSQL's planner sizes a never-analyzed table
    by its pages: below ~10,000 narrow rows it may scan and sort the whole table (a
    fraction of a millisecond there); from then on it reads the index, which is what keeps a
    pass over a large history at the cost of its new rows."""
    from django.test.utils import CaptureQueriesContext

    Item.objects.bulk_create([Item(kind="other") for _ in range(20_000)], batch_size=5000)
    sweeper = Sweeper(workers["touch"], batch=1000)
    _pass(sweeper)  # "other" rows are not eligible: a walk that adds nothing
    Item.objects.bulk_create([Item() for _ in range(5)])
    with CaptureQueriesContext(connection) as queries:
        _pass(sweeper)
    read = next(q["sql"] for q in queries if "testapp_item" in q["sql"]
                and "ORDER BY" in q["sql"])
    if vendor == "mysql":
        assert [(r["table"], r["type"], r["key"]) for r in _mysql_plan(read)] == [
            ("testapp_item", "range", "PRIMARY")]
        return
    plan = _plan(read, vendor)
    if vendor == "sqlite":
        assert "USING INTEGER PRIMARY KEY" in plan and "SCAN" not in plan, plan
    else:
        assert "Index" in plan and "testapp_item_pkey" in plan and "Seq Scan" not in plan, plan


def _plan(sql, vendor):
    """The plan of ``sql`` as text: SQLite's detail lines, PostgreSQL's plan lines."""
    with connection.cursor() as cursor:
        cursor.execute(("EXPLAIN QUERY PLAN " if vendor == "sqlite" else "EXPLAIN ") + sql)
        return " ".join(str(row[-1]) for row in cursor.fetchall())


def _mysql_plan(sql):
    """MariaDB's and MySQL's ``EXPLAIN`` of ``sql``: one dict a table access."""
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sql)
        names = [c[0].lower() for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def test_the_sweeps_statements_read_key_ranges_and_probe_per_row_on_mariadb(vendor):
    """MariaDB and MySQL: every statement of a pass over new rows and of a full pass's
    chunk reads the source table by a primary key range, and tells a row without a unit by
    one lookup of the unique index per row (``eq_ref``), never by materializing the
    worker's executions (its history) nor by a scan. The history here: 20,000 rows, each
    with a FINISHED execution. Checked with ``EXPLAIN``, INSERT IGNORE ... SELECT too."""
    if vendor != "mysql":
        pytest.skip("MariaDB/MySQL plans (the others: the tests above)")
    from django.test.utils import CaptureQueriesContext

    old = Item.objects.bulk_create([Item() for _ in range(20_000)], batch_size=5000)
    Execution.objects.bulk_create(
        [Execution(worker="touch", source_id=str(i.pk), sort_key=i.pk, state=State.FINISHED)
         for i in old], batch_size=5000)
    sweeper = Sweeper(workers["touch"], batch=1000)
    _pass(sweeper)
    Item.objects.bulk_create([Item() for _ in range(5)])
    with CaptureQueriesContext(connection) as queries:
        assert sum(_pass(sweeper)) == 5
        assert Sweeper(workers["touch"], batch=1000)._rows_chunk(old[5000].pk)[1] == 0
    statements = [q["sql"] for q in queries if "testapp_item" in q["sql"]]
    assert any(s.startswith("INSERT IGNORE") for s in statements), statements
    assert len([s for s in statements if "NOT EXISTS" in s]) >= 3, statements
    for sql in statements:
        for access in _mysql_plan(sql):
            table, how, key = access["table"], access["type"], access["key"]
            assert how not in ("ALL", "index") and "MATERIALIZED" not in \
                access["select_type"], (sql, access)
            if table == "testapp_item":
                assert (how, key) == ("range", "PRIMARY"), (sql, access)
            elif table in ("U0", "django_dbworker_execution"):
                assert (how, key) == ("eq_ref", "dbworker_execution_unique_unit"), (sql, access)


def test_a_gap_below_the_watermark_is_looked_at_again_until_its_wait_is_over():
    """Keys taken by a transaction that commits after a later one are a gap the pass
    remembers: it is looked at every pass for GAP_WAIT seconds."""
    first = Item.objects.bulk_create([Item(id=i) for i in (1, 2, 3, 6, 9)])
    sweeper = Sweeper(workers["touch"], batch=10)
    assert sum(_pass(sweeper, now=0.0)) == 5
    assert [(g.low, g.high) for g in sweeper.gaps] == [(4, 5), (7, 8)]
    Item.objects.bulk_create([Item(id=4), Item(id=8)])  # "committed late"
    assert sum(_pass(sweeper, now=10.0)) == 2
    assert [(g.low, g.high) for g in sweeper.gaps] == [(5, 5), (7, 7)]
    assert _units("touch") == sorted(str(i) for i in (*[r.pk for r in first], 4, 8))
    Item.objects.bulk_create([Item(id=5)])
    assert sum(_pass(sweeper, now=GAP_WAIT + 1.0)) == 0, "past its wait: the full pass's"
    assert sweeper.gaps == []
    state = _state()
    state.full_ended_at -= timedelta(hours=2)
    state.save()
    periodic = Sweeper(workers["touch"], batch=10, full_interval=3600.0)
    assert _pass(periodic) == [0] and periodic.full_phase == "rows"
    assert _full(periodic) == 1 and str(5) in _units("touch")
    assert _state().full_ended_at > state.full_ended_at


def test_a_row_committed_after_a_later_key_is_found_with_concurrent_writers(vendor):
    """Two writers (PostgreSQL, MariaDB/MySQL): the first takes its key, the second commits
    a later one, the pass moves the watermark past the first's key; it still finds its
    row."""
    if vendor == "sqlite":
        pytest.skip("concurrent writers (SQLite has one writer at a time)")
    import threading

    from django.db import connections, transaction

    Item.objects.bulk_create([Item() for _ in range(3)])
    sweeper = Sweeper(workers["touch"], batch=100)
    _pass(sweeper)
    inserted, release = threading.Event(), threading.Event()
    slow: list[int] = []

    def slow_writer():
        try:
            with transaction.atomic():
                slow.append(Item.objects.bulk_create([Item()])[0].pk)
                inserted.set()
                release.wait(10)
        finally:
            connections.close_all()

    thread = threading.Thread(target=slow_writer)
    thread.start()
    assert inserted.wait(10)
    later = Item.objects.bulk_create([Item()])[0]
    assert later.pk > slow[0]
    assert sum(_pass(sweeper, now=1.0)) == 1 and sweeper.watermark == later.pk
    release.set()
    thread.join()
    assert sum(_pass(sweeper, now=2.0)) == 1
    assert str(slow[0]) in _units("touch")


def test_a_full_pass_is_resumed_where_a_stopped_process_left_it(monkeypatch):
    from django_dbworker.rows import sweep

    items = Item.objects.bulk_create([Item() for _ in range(10)])
    _pass(Sweeper(workers["touch"], batch=3))  # the first pass: the watermark is set
    Execution.objects.filter(worker="touch").delete()  # rows the new-rows pass won't see
    SweepState.objects.filter(worker="touch").update(
        full_ended_at=timezone.now() - timedelta(hours=2))
    first = Sweeper(workers["touch"], batch=3, full_interval=3600.0)
    _pass(first)
    assert first.full_phase == "rows"
    # two chunks, the second after FULL_SAVE_EVERY: its position is kept; then it stops
    assert first.background(1.0) == 3 and first.background(1.0 + FULL_SAVE_EVERY) == 3
    assert _state().full_cursor == str(items[5].pk)
    second = Sweeper(workers["touch"], batch=3, full_interval=3600.0)
    _pass(second, now=3.0)
    assert second.full_phase == "", "the first one's pass is fresh: left to it"
    monkeypatch.setattr(sweep, "FULL_TAKEOVER", 0.0)
    _pass(second, now=4.0)
    assert second.full_phase == "rows" and second.cursor == items[5].pk
    assert _full(second, now=5.0) == 4, "resumed after the first one's chunks"
    assert len(_units("touch")) == 10
    state = _state()
    assert state.full_phase == "" and state.full_owner is None and state.full_cursor is None
    assert first.background(99.0) == 0 and first.full_phase == "", "it lost the pass"


def test_no_periodic_full_pass_without_an_interval_or_when_told_it_is_not_needed():
    Item.objects.bulk_create([Item() for _ in range(3)])
    _pass(Sweeper(workers["touch"], batch=3))
    SweepState.objects.filter(worker="touch").update(
        full_ended_at=timezone.now() - timedelta(days=30))
    never = Sweeper(workers["touch"], batch=3, full_interval=None)
    _pass(never)
    assert never.full_phase == ""
    triggered = Sweeper(workers["touch"], batch=3, full_interval=60.0,
                        periodic_full=lambda worker: False)
    _pass(triggered)
    assert triggered.full_phase == ""


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
    claims = planner.claim(workers["touch"], 10, Claimant(), 30)
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


def test_an_orphan_range_reads_its_ids_not_the_workers_history(vendor):
    """The orphan walk reads one range of execution ids a step; it must not combine it
    with the unique index's part for the worker (every execution the worker ever had)."""
    from django.test.utils import CaptureQueriesContext

    Execution.objects.bulk_create(
        [Execution(worker="touch", source_id=str(i), state=State.FINISHED)
         for i in range(1, 5001)], batch_size=2500)
    sweeper = Sweeper(workers["touch"], batch=100)
    with CaptureQueriesContext(connection) as queries:
        sweeper._orphans_chunk(0)
    probe = next(q["sql"] for q in queries if "NOT" in q["sql"] and "EXISTS" in q["sql"])
    if vendor == "mysql":
        plan = _mysql_plan(probe)
        assert [(r["table"], r["type"], r["key"]) for r in plan[:1]] == [
            ("django_dbworker_execution", "range", "PRIMARY")], plan
        assert not any(r["key"] == "dbworker_execution_unique_unit" for r in plan), plan
        return
    plan = _plan(probe, vendor)
    assert "unique_unit" not in plan, plan
    assert ("INTEGER PRIMARY KEY" in plan) if vendor == "sqlite" else ("execution_pkey" in plan)


def test_a_worker_whose_triggers_are_current_needs_no_periodic_full_pass():
    from django_dbworker.rows import triggers
    from django_dbworker.supervisor.supervisor import _without_triggers

    assert _without_triggers(workers["touch"])
    triggers.install(workers=["touch"])
    try:
        assert not _without_triggers(workers["touch"])
        assert _without_triggers(workers["tag"]), "only the workers with triggers"
    finally:
        triggers.remove(workers=["touch"])
