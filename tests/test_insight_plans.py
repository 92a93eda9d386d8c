"""The health view, the metrics and ``dbworker stats`` read a bounded part of the units
tables (issue 39), on fresh tables without statistics and after ANALYZE.

Each surface's statements are captured; their number must not grow with the rows, and on
PostgreSQL ``EXPLAIN`` of each must scan no units table (no ``Seq Scan`` on the executions
or the tasks).
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from django_dbworker.insight import counts, deadline, health, metrics
from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)

UNITS = (Execution._meta.db_table, TaskRecord._meta.db_table)


def load(n: int) -> None:
    """``n`` touch rows with an execution each (mostly FINISHED, some of every state) and
    ``n`` tasks of the default queue (mostly SUCCESSFUL), by bulk_create."""
    now = timezone.now()
    items = Item.objects.bulk_create(Item(kind="touch", action="ok") for _ in range(n))
    states = [State.FINISHED] * 16 + [State.PENDING, State.UNFINISHED, State.FAILED,
                                      State.FINISHED]
    Execution.objects.bulk_create(
        Execution(worker="touch", source_id=str(item.pk), sort_key=item.pk,
                  state=states[i % len(states)], available_at=now - timedelta(seconds=5),
                  started_at=now - timedelta(seconds=2), finished_at=now - timedelta(hours=1))
        for i, item in enumerate(items))
    statuses = [TaskStatus.SUCCESSFUL] * 16 + [TaskStatus.READY, TaskStatus.RETRYING,
                                               TaskStatus.FAILED, TaskStatus.CANCELLED]
    TaskRecord.objects.bulk_create(
        TaskRecord(task_path="tests.tasks.noop", status=statuses[i % len(statuses)],
                   available_at=now - timedelta(seconds=5), finished_at=now - timedelta(hours=1),
                   last_attempted_at=now - timedelta(hours=1, seconds=2))
        for i in range(n))


def forget_or_analyze(analyzed: bool) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if analyzed:
            for table in UNITS:
                cursor.execute(f"ANALYZE {connection.ops.quote_name(table)}")
            return
        cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
        if cursor.fetchone()[0]:
            cursor.execute("DELETE FROM pg_statistic WHERE starelid IN (%s::regclass, "
                           "%s::regclass)", list(UNITS))


def stats() -> None:
    call_command("dbworker", "stats", "--json", stdout=StringIO())


SURFACES = {
    "health": health.verdict,
    "metrics": lambda: metrics.render(process=False),
    "stats": stats,
}


def captured(surface: str) -> list[str]:
    SURFACES[surface]()  # once before: what an engine reads once per process (collations)
    with CaptureQueriesContext(connection) as queries:
        SURFACES[surface]()
    return [q["sql"] for q in queries.captured_queries]


#: Statements served by indexes of the admin's migration (0011: ``dbworker_task_status``,
#: ``dbworker_execution_state``): WAITING tasks, and the FAILED executions grouped by their
#: last exception class. Allowed to scan only where those indexes do not exist yet.
ADMIN_INDEXED = re.compile(r"""status" = 'WAITING'|AS "exception_class", COUNT""")


def admin_indexes() -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_indexes WHERE indexname IN "
                       "('dbworker_task_status', 'dbworker_execution_state')")
        return cursor.fetchone()[0] == 2


def scans(sql: str) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return [t for t in UNITS if re.search(rf"Seq Scan on {t}\b", plan)]


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
@pytest.mark.parametrize("surface", sorted(SURFACES))
def test_bounded(surface: str, analyzed: bool) -> None:
    load(200)
    forget_or_analyze(analyzed)
    few = captured(surface)
    load(4_000)
    forget_or_analyze(analyzed)
    many = captured(surface)
    assert len(many) == len(few), "the number of statements grows with the rows"
    if connection.vendor == "postgresql":
        indexed = admin_indexes()
        scanning = {sql: found for sql in many if sql.lstrip().upper().startswith("SELECT")
                    and (found := scans(sql))
                    and (indexed or not ADMIN_INDEXED.search(sql))}
        assert not scanning, json.dumps(scanning, indent=1)


def test_counts_stop_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    load(400)
    monkeypatch.setattr(counts, "CAP", 50)
    line = counts.worker_counts("touch", cap=50)
    assert line.counts[State.FINISHED] == 50
    assert line.at_least == {State.FINISHED}
    assert line.counts[State.FAILED] == 20  # 400 / 20: exact below the cap
    exact = counts.execution_counts()["touch"]
    assert exact[State.FINISHED] == 340


def test_stats_json_versions() -> None:
    load(100)
    out = StringIO()
    call_command("dbworker", "stats", "--json", stdout=out)
    doc = json.loads(out.getvalue())
    assert doc["version"] == 2
    assert {line["name"]: line["at_least"] for line in doc["workers"]}["touch"] == []
    out = StringIO()
    call_command("dbworker", "stats", "--json", "--exact", stdout=out)
    assert json.loads(out.getvalue())["version"] == 1


def test_durations_in_sql() -> None:
    """Run times come from the database's own arithmetic, on SQLite too (no Python
    function called per row)."""
    now = timezone.now()
    (item,) = Item.objects.bulk_create([Item(kind="touch", action="ok")])  # no signal
    Execution.objects.create(worker="touch", source_id=str(item.pk), sort_key=item.pk,
                             state=State.FINISHED, started_at=now - timedelta(seconds=3),
                             finished_at=now - timedelta(seconds=1))
    took = counts.execution_durations(now)["touch"]
    assert took["count"] == 1
    assert took["max_seconds"] == pytest.approx(2.0, abs=0.01)
    assert took["avg_seconds"] == pytest.approx(2.0, abs=0.01)
    with CaptureQueriesContext(connection) as queries:
        counts.execution_durations(now)
    assert not any("django_timestamp_diff" in q["sql"] for q in queries.captured_queries)


def test_durations_are_of_the_newest_completions_past_the_cap() -> None:
    """Past ``cap`` completions in the window, the run times are those of the newest
    ``cap`` (read newest first through the index): 5 units that took 1..5 s, finished
    oldest first, give the newest 3 (3, 4 and 5 s)."""
    now = timezone.now()
    items = Item.objects.bulk_create(Item(kind="touch", action="ok") for _ in range(5))
    Execution.objects.bulk_create(
        Execution(worker="touch", source_id=str(item.pk), sort_key=item.pk,
                  state=State.FINISHED, started_at=now - timedelta(seconds=60 - i),
                  finished_at=now - timedelta(seconds=60 - i - (i + 1)))
        for i, item in enumerate(items))  # took 1, 2, 3, 4, 5 s; the last finished last
    took = counts._durations(Execution.objects.all(), "worker", "started_at", now, cap=3)
    assert took["touch"]["count"] == 3
    assert took["touch"]["max_seconds"] == pytest.approx(5.0, abs=0.01)
    assert took["touch"]["avg_seconds"] == pytest.approx(4.0, abs=0.01)
    everything = counts.execution_durations(now)["touch"]
    assert everything["count"] == 5 and everything["avg_seconds"] == pytest.approx(3.0, abs=0.01)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's planner settings")
@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
def test_newest_first_reads_walk_the_index_backward(analyzed: bool) -> None:
    """The finished tasks' history and the windows' run times read newest first through
    their ``finished_at`` index and stop at the cap: no sort of every finished row (a
    planner without statistics chose a bitmap of the whole partial index, then a sort:
    0.2 s at 500,000 finished tasks)."""
    load(4_000)
    forget_or_analyze(analyzed)
    now = timezone.now()
    with CaptureQueriesContext(connection) as queries:
        counts.task_history()
        counts.execution_durations(now)
        counts.task_durations(now)
    sent = [q["sql"] for q in queries.captured_queries]
    reads = [sql for sql in sent if "ORDER BY" in sql]
    assert len(reads) == 3, reads
    for sql in reads:  # each sent right after the planner's settings (index_first)
        assert "enable_bitmapscan', 'off'" in sent[sent.index(sql) - 1], sent
    for sql in reads:
        with connection.cursor() as cursor, transaction.atomic():
            cursor.execute("SELECT set_config('enable_seqscan', 'off', true), "
                           "set_config('enable_bitmapscan', 'off', true)")
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
        below_limit = plan.split("Limit", 1)[-1]  # the GROUP BY above sorts <= cap rows
        assert "Limit" in plan and "Index Scan Backward" in below_limit \
            and "Sort" not in below_limit, f"{sql}\n{plan}"


SLOW = {
    "postgresql": "SELECT pg_sleep(2)",
    "sqlite": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
              "WHERE i < 100000000) SELECT count(*) FROM n",
    "mysql": "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
             "WHERE i < 100000000) SELECT count(*) FROM n",
}


def slow_verdict() -> dict:
    with connection.cursor() as cursor:
        cursor.execute(SLOW[connection.vendor])
    return {"healthy": True, "problems": []}


def test_a_slow_database_degrades_the_views(client, monkeypatch: pytest.MonkeyPatch,
                                            settings) -> None:
    """Past ``deadline.SECONDS`` the database's own limit stops the statement: 503 with a
    degraded answer, never a probe left hanging."""
    if connection.vendor == "mysql":
        settings.DBWORKER = {**settings.DBWORKER}  # same database; cte_max_recursion_depth
        with connection.cursor() as cursor:
            cursor.execute("SET SESSION cte_max_recursion_depth = 200000000"
                           if not connection.mysql_is_mariadb else
                           "SET SESSION max_recursive_iterations = 200000000")
    monkeypatch.setattr(deadline, "SECONDS", 0.2)
    monkeypatch.setattr(health, "verdict", slow_verdict)
    answer = client.get("/dbworker/health/")
    assert answer.status_code == 503
    assert answer.json()["status"] == "degraded"
    monkeypatch.setattr(metrics, "render", lambda process: slow_verdict())
    answer = client.get("/dbworker/metrics/")
    assert answer.status_code == 503
    assert b"too slow" in answer.content
    with connection.cursor() as cursor:  # the limit is gone afterwards
        cursor.execute("SELECT 1")


@pytest.mark.skipif(connection.vendor == "sqlite", reason="EXPLAIN of PostgreSQL and MariaDB")
@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
def test_a_workers_ended_counts_walk_their_own_index(analyzed: bool) -> None:
    """A worker's FINISHED and FAILED executions are counted through
    ``dbworker_execution_settled`` (state, worker, id), at most CAP entries: not by
    combining the indexes by state and by worker, which reads every ended execution and
    every execution of the worker (a bitmap AND: 222 ms at a million, found in bench)."""
    load(4_000)
    forget_or_analyze(analyzed)
    with CaptureQueriesContext(connection) as captured:
        counts.worker_counts("touch")
    ended = [q["sql"] for q in captured.captured_queries
             if "'FINISHED'" in q["sql"] or "'FAILED'" in q["sql"]]
    assert len(ended) == 2
    with connection.cursor() as cursor:
        for sql in ended:
            cursor.execute(f"EXPLAIN {sql}")
            if connection.vendor == "postgresql":
                plan = "\n".join(row[0] for row in cursor.fetchall())
                assert "Seq Scan" not in plan, plan
                # With statistics the planner picks by the counts it knows (the primary
                # key when the worker's ended rows are most of the table, the index by
                # state when they are few); without, it must walk the worker's own index.
                assert analyzed or ("dbworker_execution_settled" in plan
                                    and "Bitmap" not in plan), plan
            else:
                names = [c[0].lower() for c in cursor.description]
                keys = {dict(zip(names, row, strict=True))["key"] for row in cursor.fetchall()}
                assert "dbworker_execution_settled" in keys, (sql, keys)
