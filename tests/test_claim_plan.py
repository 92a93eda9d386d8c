"""The claim statement goes through the claim index, however long the history.

The table is realistic: 20,000 source rows, each with an execution, 99% of them FINISHED.
We ask the database how it would run the exact statement ``planner.claim()`` sends (plain
``EXPLAIN``: nothing is executed) and check that it finds its candidates in the partial
index ``dbworker_execution_claimable``, scans no table (source rows are fetched by primary
key, one candidate at a time), and, for the pk-ordered worker, walks the index in claim
order without a sort, so it stops after ``limit`` units. The reaper's query gets the same
check against its own index.

On MariaDB/MySQL (no partial indexes) the claim index leads with the generated flag column
``dbworker_claimable`` (``db.partial``): the claim must seek ``flag = 1`` in it
(``ref``/``range`` access, never ``ALL`` or a full ``index`` scan) and, for the pk-ordered
worker, read it in order (no ``Using filesort``); what the claim reads is counted with the
session's ``Handler_read_*`` counters.

Every database is checked before ``ANALYZE`` (Django never runs it; on PostgreSQL
autovacuum analyzes a table only after enough changes, so a new table's first thousands of
rows are planned without statistics: issue 23) and after. ``test_fresh_table_*`` claims from
5,000 units just made pending on never-analyzed tables, as after a ``bulk_create`` the sweep
found, and counts what the claim reads (``EXPLAIN (ANALYZE, BUFFERS)``).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker.db import engine
from django_dbworker.models import Execution, State
from django_dbworker.outcomes import Finished
from django_dbworker.rows import pending, planner, store
from django_dbworker.rows.registry import workers
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Item

INDEX = "dbworker_execution_claimable"
TABLE = Execution._meta.db_table
SOURCE = Item._meta.db_table
ROWS_PER_WORKER = 10_000
NEWEST_PENDING = 50
SCATTERED_PENDING = 50
ANALYZED = [False, True]

# Transactional, so every test starts from freshly created tables: what a rolled-back test
# leaves behind (dead rows, PostgreSQL's table size estimates) would change the next plan.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(params=ANALYZED, ids=lambda analyzed: "analyzed" if analyzed else "no-stats")
def history(request: pytest.FixtureRequest) -> dict[str, list[int]]:
    """Per worker ("touch", "ranked"): 10,000 Items with an execution; 100 of them pending.

    The pending ones are the newest rows (the worst case for anything that walks the
    history in pk order) plus some scattered through it. Returns their primary keys.
    """
    quote = connection.ops.quote_name
    now = timezone.now()
    waiting: dict[str, list[int]] = {}
    with connection.cursor() as cursor:
        for kind in ("touch", "ranked"):
            # Multi-row INSERTs, a thousand rows each: executemany() sends one statement
            # per row with some drivers (mysqlclient here: 4.4 s of the 4.6 s set-up).
            ranks = [(i * 7919) % 10_007 for i in range(ROWS_PER_WORKER)]
            for start in range(0, ROWS_PER_WORKER, 1_000):
                chunk = ranks[start:start + 1_000]
                cursor.execute(
                    f"INSERT INTO {quote(SOURCE)} (kind, action, enabled, {quote('rank')}, "
                    "steps) VALUES " + ", ".join(["(%s, 'ok', %s, %s, 0)"] * len(chunk)),
                    [value for rank in chunk for value in (kind, True, rank)],
                )
            pks = list(Item.objects.filter(kind=kind).order_by("pk").values_list("pk", flat=True))
            step = ROWS_PER_WORKER // SCATTERED_PENDING
            chosen = pks[step // 2 : -NEWEST_PENDING : step] + pks[-NEWEST_PENDING:]
            pending.add(workers[kind], chosen, connection.alias)
            # Everything else is history: one FINISHED execution per source row.
            finished = {"worker": kind, "state": State.FINISHED, "attempts": 1,
                        "available_at": now, "created_at": now, "started_at": now,
                        "finished_at": now}
            columns, values, params = [], [], []
            for field in Execution._meta.concrete_fields:
                if field.primary_key:
                    continue
                columns.append(quote(field.column))
                if field.name in ("source_id", "sort_key"):
                    values.append(engine().key_text("id") if field.name == "source_id"
                                  else "id")
                    continue
                values.append("%s")
                value = finished.get(field.name, field.get_default())
                params.append(field.get_db_prep_save(value, connection))
            cursor.execute(
                f"INSERT INTO {quote(TABLE)} ({', '.join(columns)}) "
                f"SELECT {', '.join(values)} FROM {quote(SOURCE)} WHERE kind = %s AND id NOT IN "
                f"({', '.join(str(pk) for pk in chosen)})",
                [*params, kind],
            )
            waiting[kind] = chosen
        if request.param:
            for table in (TABLE, SOURCE):
                analyze = "ANALYZE TABLE" if connection.vendor == "mysql" else "ANALYZE"
                cursor.execute(f"{analyze} {quote(table)}")
        else:
            forget_statistics()
    assert Execution.objects.count() == 2 * ROWS_PER_WORKER
    assert Execution.objects.filter(state=State.PENDING).count() == 200
    return waiting


def forget_statistics(tables: Sequence[str] = (TABLE, SOURCE)) -> None:
    """Make sure the planner has no statistics for ``tables`` (default: our two): a flush
    (TRUNCATE) resets their sizes but keeps the column statistics of an earlier test's
    ANALYZE, which only a superuser can remove (PostgreSQL 15 has no function for it)."""
    if connection.vendor != "postgresql":
        return  # SQLite keeps its statistics in sqlite_stat1, emptied with the tables' rows
    names = list(tables)
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stats WHERE tablename = ANY(%s)", [names])
        if cursor.fetchone()[0]:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            if not cursor.fetchone()[0]:
                pytest.skip("stale planner statistics, and no superuser to remove them")
            cursor.execute("DELETE FROM pg_statistic WHERE starelid = ANY(%s::regclass[])",
                           [names])
        cursor.execute("SELECT count(*) FROM pg_stats WHERE tablename = ANY(%s)", [names])
        assert cursor.fetchone()[0] == 0


def claim_statement(worker_name: str, limit: int) -> tuple[str, list[Any]]:
    """The statement ``planner.claim()`` would send now, with its parameters."""
    now = timezone.now()
    with transaction.atomic():  # the candidate subquery is SELECT ... FOR UPDATE
        return store.claim_sql(workers[worker_name], limit, Claimant(),
                               token=uuid.uuid4(), now=now, expires=now + timedelta(seconds=30))


def explain(worker_name: str, limit: int) -> Any:
    """PostgreSQL: the plan tree (JSON). SQLite: the EXPLAIN QUERY PLAN detail lines.
    MariaDB/MySQL: EXPLAIN's rows as dicts."""
    sql, params = claim_statement(worker_name, limit)
    return explain_sql(sql, params)


def explain_sql(sql: str, params: Any) -> Any:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            return cursor.fetchone()[0][0]["Plan"]
        if connection.vendor == "mysql":
            cursor.execute(f"EXPLAIN {sql}", params)
            names = [c[0].lower() for c in cursor.description]
            return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        return [row[-1] for row in cursor.fetchall()]


def mysql_rows(plan: Any, table: str) -> list[dict[str, Any]]:
    """EXPLAIN's rows that read ``table`` (the source table also under the aliases Django
    gives a subquery's tables: ``U0``...)."""
    def reads(name: str) -> bool:
        return name == table or (table == SOURCE and name[:1] == "U" and name[1:].isdigit())
    return [row for row in plan if reads(row["table"] or "")]


def walk(node: dict[str, Any], above: tuple[dict[str, Any], ...] = ()) -> Iterator[
    tuple[dict[str, Any], tuple[dict[str, Any], ...]]
]:
    """Every node of a PostgreSQL plan with the nodes above it (nearest last)."""
    yield node, above
    for child in node.get("Plans", []):
        yield from walk(child, (*above, node))


def claim_index_scans(plan: Any) -> list[tuple[dict[str, Any], tuple[dict[str, Any], ...]]]:
    return [(n, above) for n, above in walk(plan) if n.get("Index Name") == INDEX]


def describe(plan: Any) -> str:
    if isinstance(plan, list):
        return "\n".join(str(line) for line in plan)
    return "\n".join(
        "  " * len(above) + n["Node Type"] + (f" on {n['Relation Name']}"
                                              if "Relation Name" in n else "")
        + (f" using {n['Index Name']}" if "Index Name" in n else "")
        for n, above in walk(plan)
    )


def assert_reads_only_by_index(plan: Any) -> None:
    """The claim index finds the candidates; nothing is read in full, not even the source
    table: its rows are fetched by primary key, one candidate at a time."""
    if connection.vendor == "mysql":
        (execution,) = mysql_rows(plan, TABLE)
        assert execution["key"] == INDEX, describe(plan)
        assert execution["type"] in ("ref", "range"), describe(plan)
        # No table or index is read in full; the source table by primary key only.
        assert not any(row["type"] in ("ALL", "index") for row in plan), describe(plan)
        sources = mysql_rows(plan, SOURCE)
        assert sources, describe(plan)
        assert all(row["key"] == "PRIMARY" for row in sources), describe(plan)
    elif connection.vendor == "postgresql":
        assert claim_index_scans(plan), describe(plan)
        assert not any(n["Node Type"] == "Seq Scan" for n, _ in walk(plan)), describe(plan)
        source_scans = [n for n, _ in walk(plan) if n.get("Relation Name") == SOURCE]
        assert source_scans, describe(plan)
        assert all(n.get("Index Name") == f"{SOURCE}_pkey" for n in source_scans), describe(plan)
    else:
        assert any(f"USING INDEX {INDEX} " in line for line in plan), describe(plan)
        # "SCAN x" reads all of x (a table or one of its indexes); "SEARCH x" seeks in it.
        assert not any(line.startswith("SCAN ") for line in plan), describe(plan)
        assert not any("sqlite_autoindex" in line for line in plan), describe(plan)


@pytest.mark.parametrize("limit", [1, 10])
def test_pk_ordered_claim_walks_the_claim_index_in_order(history, limit):
    plan = explain("touch", limit)
    assert_reads_only_by_index(plan)
    if connection.vendor == "postgresql":
        ((scan, above),) = claim_index_scans(plan)
        assert scan["Node Type"] == "Index Scan", describe(plan)  # ordered, not a bitmap
        assert scan["Scan Direction"] == "Forward", describe(plan)
        # Between the Limit and the index scan nothing sorts or collects all candidates,
        # so the scan stops after ``limit`` eligible units.
        below_limit = above[max(i for i, n in enumerate(above) if n["Node Type"] == "Limit"):]
        assert {n["Node Type"] for n in below_limit} <= {"Limit", "LockRows", "Nested Loop"}, (
            describe(plan)
        )
        assert not any("Sort" in n["Node Type"] for n, _ in walk(plan)), describe(plan)
    elif connection.vendor == "mysql":
        assert not any("filesort" in (row["extra"] or "") for row in plan), describe(plan)
    else:
        assert not any("TEMP B-TREE" in line for line in plan), describe(plan)

    claims = planner.claim(workers["touch"], limit, Claimant(), 30)
    expected = sorted(history["touch"])[:limit]
    assert sorted(int(c.source_key) for c in claims) == expected


@pytest.mark.parametrize("limit", [1, 10])
def test_claim_in_another_order_reads_only_the_claim_index(history, limit):
    plan = explain("ranked", limit)
    # Ordered by a value of the source row, the claim must sort the worker's waiting units:
    # its cost follows the pending work (100 units here), never the 10,000-row history.
    assert_reads_only_by_index(plan)
    if connection.vendor == "postgresql":
        ((scan, _),) = claim_index_scans(plan)
        assert scan["Plan Rows"] <= 10 * (NEWEST_PENDING + SCATTERED_PENDING), describe(plan)

    claims = planner.claim(workers["ranked"], limit, Claimant(), 30)
    ranks = dict(Item.objects.filter(pk__in=history["ranked"]).values_list("pk", "rank"))
    by_rank = sorted(ranks, key=lambda pk: (-ranks[pk], pk))
    assert {int(c.source_key) for c in claims} == set(by_rank[:limit])


def test_reaper_reads_only_the_working_index(history):
    """The reaper (every few seconds, in every supervisor) must not read the history either;
    as the supervisor runs it, sparing its own units."""
    Execution.objects.filter(source_id__in=[str(pk) for pk in history["touch"][:5]]).update(
        state=State.WORKING, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    own = Claimant()
    sql, params = store.expired(timezone.now(), connection.alias, own).query.sql_with_params()
    _reads_only_the_working_index(sql, params)
    assert len(store.expired(timezone.now(), connection.alias, own)) == 5


FRESH = 5_000


@pytest.fixture
def fresh_units() -> list[int]:
    """5,000 Items written with bulk_create() and made pending for "touch" (what the sweep
    does for them) on tables nobody analyzed: the planner has no statistics; PostgreSQL
    still knows the tables' page counts."""
    forget_statistics()
    items = Item.objects.bulk_create([Item(kind="touch") for _ in range(FRESH)])
    pks = [item.pk for item in items]
    pending.add(workers["touch"], pks, connection.alias)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT reltuples FROM pg_class WHERE relname = %s", [TABLE])
            assert cursor.fetchone()[0] == -1  # never analyzed (nor vacuumed)
    return pks


def claimed_buffers(limit: int) -> tuple[int, Any]:
    """Run the claim statement under ``EXPLAIN (ANALYZE, BUFFERS)`` (rolled back): the
    shared buffers it read or hit, and its plan."""
    sql, params = claim_statement("touch", limit)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        plan = cursor.fetchone()[0][0]["Plan"]
        transaction.set_rollback(True)
    return plan["Shared Hit Blocks"] + plan["Shared Read Blocks"], plan


def rows_read(limit: int) -> int:
    """MariaDB/MySQL: the index entries and rows the claim's candidate statement reads (the
    session's ``Handler_read_*`` counters around it; rolled back)."""
    sql, params = claim_statement("touch", limit)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("FLUSH STATUS")
        cursor.execute(sql, params)
        assert len(cursor.fetchall()) == limit
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        reads = sum(int(value) for _, value in cursor.fetchall())
        transaction.set_rollback(True)
    return reads


@pytest.mark.parametrize("limit", [1, 33])
def test_fresh_table_claim_walks_the_claim_index(fresh_units, limit):
    """All 5,000 units pending, no statistics: the claim index in order, no sort, no
    sequential scan, and what the claim reads follows ``limit``, not the table."""
    plan = explain("touch", limit)
    assert_reads_only_by_index(plan)
    if connection.vendor == "sqlite":
        assert not any("TEMP B-TREE" in line for line in plan), describe(plan)
        return
    if connection.vendor == "mysql":
        assert not any("filesort" in (row["extra"] or "") for row in plan), describe(plan)
        reads = rows_read(limit)
        # Per unit: its claim index entry, its row, the source row by primary key; a
        # scan would read all 5,000.
        assert reads <= 10 + 5 * limit, reads
        return
    assert not any("Sort" in n["Node Type"] for n, _ in walk(plan)), describe(plan)
    buffers, analyzed = claimed_buffers(limit)
    # Per unit (~17 measured): its claim index entry and row, the source probe, the UPDATE's
    # new row and its index entries; a few pages more for the index roots. A scan of the
    # executions would read the whole table (~130 pages) at every claim.
    assert buffers <= 40 + 20 * limit, (buffers, describe(analyzed))


def test_fresh_table_claim_half_drained(fresh_units):
    """Halfway through the drain (2,500 FINISHED, their claim index entries dead, nothing
    vacuumed), still no statistics: a claim still reads only what it claims."""
    claimant = Claimant()
    done = 0
    while done < FRESH // 2:
        for c in planner.claim(workers["touch"], 50, claimant, 30):
            assert store.complete(c, Finished()) == 1
            done += 1
    plan = explain("touch", 33)
    assert_reads_only_by_index(plan)
    if connection.vendor == "postgresql":
        buffers, analyzed = claimed_buffers(33)
        assert buffers <= 40 + 20 * 33, (buffers, describe(analyzed))
    elif connection.vendor == "mysql":
        assert rows_read(33) <= 10 + 5 * 33
    claims = planner.claim(workers["touch"], 33, claimant, 30)
    assert [int(c.source_key) for c in claims] == fresh_units[done:done + 33]


def test_takeover_reads_only_the_working_index(history):
    """A dead supervisor's units (``supervisor/takeover.py``) are read by its id through the
    index of units in flight, as renewal reads them: never the history, and no index on
    ``supervisor_id`` is needed."""
    dead, alive = uuid.uuid4(), uuid.uuid4()
    for holder, pks in ((dead, history["touch"][:5]), (alive, history["touch"][5:10])):
        Execution.objects.filter(source_id__in=[str(pk) for pk in pks]).update(
            state=State.WORKING, supervisor_id=holder, token=uuid.uuid4(),
            lease_expires_at=timezone.now() + timedelta(seconds=30))
    sql, params = store.held_by([dead], connection.alias).query.sql_with_params()
    _reads_only_the_working_index(sql, params, whole=True)
    assert {row[3] for row in store.held_by([dead], connection.alias)} == {dead}
    assert len(store.held_by([dead], connection.alias)) == 5


def _reads_only_the_working_index(sql: str, params: Any, *, whole: bool = False) -> None:
    """The query reads the executions table through ``dbworker_execution_working`` only
    (the units in flight), on each database: never the history. ``whole``: SQLite may read
    all of that partial index (a SCAN of it), not only a range (a SEARCH)."""
    with connection.cursor() as cursor:
        if connection.vendor == "mysql":
            plan = explain_sql(sql, params)
            (scan,) = mysql_rows(plan, TABLE)
            assert scan["key"] == "dbworker_execution_working", describe(plan)
            assert scan["type"] in ("ref", "range"), describe(plan)
        elif connection.vendor == "postgresql":
            cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)
            plan = cursor.fetchone()[0][0]["Plan"]
            # An index scan, or (without statistics) a bitmap heap scan over a bitmap scan
            # of the same index: nothing else reads the table.
            scans = [n for n, _ in walk(plan) if n.get("Relation Name") == TABLE]
            indexes = {n["Index Name"] for n, _ in walk(plan) if "Index Name" in n}
            assert indexes == {"dbworker_execution_working"}, describe(plan)
            assert all(n["Node Type"] in ("Index Scan", "Bitmap Heap Scan") for n in scans), (
                describe(plan)
            )
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            lines = [row[-1] for row in cursor.fetchall()]
            assert any(re.search(r"USING INDEX dbworker_execution_working\b", line)
                       for line in lines), describe(lines)
            if not whole:
                assert not any(line.startswith("SCAN ") for line in lines), describe(lines)
