"""The admin's lists stay bounded at millions of units: every query each page sends (the
changelists with their filters, search and deep pages; ``WorkerStatusMixin``'s filter on a
source model's list) reads the units tables and the source table through an index, never
a sequential scan, on tables never analyzed (PostgreSQL autovacuum off, or fresh tables:
issue 39), and a page sends a fixed number of queries.

The tables are 20,000 units each (enough that PostgreSQL's planner prefers a sequential
scan wherever one would do); ``EXPLAIN`` (nothing executed) of each captured statement is
checked. The timings at 10k and 1M are in ``bench/operator_admin.py``.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from django_dbworker.admin import actions
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.rows.registry import workers
from tests.test_claim_plan import describe, explain_sql, forget_statistics, walk
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)
postgresql = pytest.mark.skipif(connection.vendor != "postgresql",
                                reason="EXPLAIN plans of PostgreSQL")

UNITS = 20_000
TABLES = {Execution._meta.db_table, TaskRecord._meta.db_table, Item._meta.db_table,
          Failure._meta.db_table}
EXECUTIONS = reverse("admin:django_dbworker_execution_changelist")
TASKS = reverse("admin:django_dbworker_taskrecord_changelist")
ITEMS = reverse("admin:testapp_item_changelist")
PATH = "tests.testapp.tasks.add"


def insert(model: Any, count: int, **values: str) -> None:
    """``count`` rows of ``model`` by one ``INSERT ... SELECT`` over ``generate_series``
    (``g``, from 1): SQL expressions in ``values``, the field defaults elsewhere."""
    quote = connection.ops.quote_name
    columns, selects, params = [], [], []
    for field in model._meta.concrete_fields:
        if field.primary_key and field.name not in values:
            continue
        columns.append(quote(field.column))
        if field.name in values:
            selects.append(values[field.name])
        else:
            selects.append("%s")
            params.append(field.get_db_prep_save(field.get_default(), connection))
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(model._meta.db_table)} ({', '.join(columns)}) "
            f"SELECT {', '.join(selects)} FROM generate_series(1, {count}) g", params)


@pytest.fixture
def units() -> None:
    """20,000 Items, each with a FINISHED ``touch`` execution but every 1,000th FAILED
    (with its Failure); 20,000 tasks, SUCCESSFUL but every 1,000th FAILED. No ANALYZE."""
    now = f"'{timezone.now().isoformat()}'::timestamptz"
    insert(Item, UNITS, kind="'touch'", action="'ok'", enabled="true", rank="g", steps="0")
    state = f"CASE WHEN g %% 1000 = 0 THEN '{State.FAILED}' ELSE '{State.FINISHED}' END"
    first = Item.objects.order_by("pk").values_list("pk", flat=True)[0] - 1
    insert(Execution, UNITS, worker="'touch'", source_id=f"(g + {first})::text",
           sort_key=f"g + {first}", state=state, attempts="1", started_at=now,
           finished_at=now)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {Failure._meta.db_table} (execution_id, attempt, exception_class, "
            "message, traceback, occurred_at) SELECT id, 1, 'builtins.ValueError', 'no', '', "
            f"{now} FROM {Execution._meta.db_table} WHERE state = %s", [State.FAILED])
    status = (f"CASE WHEN g %% 1000 = 0 THEN '{TaskStatus.FAILED}' "
              f"ELSE '{TaskStatus.SUCCESSFUL}' END")
    insert(TaskRecord, UNITS, id="gen_random_uuid()", task_path=f"'{PATH}'", status=status,
           enqueued_at=f"{now} - g * interval '1 second'", finished_at=now, attempts="1")
    # Never analyzed: not even the statistics an earlier test in this database left.
    forget_statistics(sorted(TABLES))


def scans(sql: str, settings: list[str]) -> list[str]:
    """The sequential scans of our tables in the statement's plan."""
    with transaction.atomic(), connection.cursor() as cursor:
        for setting in settings:
            cursor.execute(setting)
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0][0]["Plan"]
    return [describe(plan)] if any(
        n["Node Type"] == "Seq Scan" and n.get("Relation Name") in TABLES
        and not bounded(n, above) for n, above in walk(plan)) else []


def bounded(node: dict[str, Any], above: tuple[dict[str, Any], ...]) -> bool:
    """A scan that keeps every row it reads, under a LIMIT: it stops after that many (the
    bounded count of an unfiltered list)."""
    return "Filter" not in node and bool(above) and above[-1]["Node Type"] == "Limit"


def check(client: Any, url: str, query: dict[str, str], most: int) -> str:
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"{url}?{urlencode(query)}")
    assert response.status_code == 200, (url, query, response.status_code)
    # Django's captured SQL has its parameters in; EXPLAIN it as it was sent, with the
    # settings it was sent with.
    bad, settings = [], []
    for query in captured.captured_queries:
        sql = query["sql"].strip()
        if sql.startswith(("SET LOCAL", "SELECT set_config(")):  # index_first's
            settings.append(sql)
        elif sql in ("COMMIT", "ROLLBACK"):
            settings = []
        elif sql.startswith("SELECT"):
            bad += [(sql, plan) for plan in scans(sql, settings)]
    assert not bad, "\n\n".join(f"{sql}\n{plan}" for sql, plan in bad)
    assert len(captured.captured_queries) <= most, [q["sql"] for q in captured]
    return response.content.decode()


EXECUTION_PAGES = [
    {}, {"state__exact": State.FAILED}, {"worker": "touch"},
    {"worker": "touch", "state__exact": State.FAILED},
    {"worker": "touch", "state__exact": State.FAILED, "exception": "builtins.ValueError"},
    {"q": "777"}, {"p": "150"},
]
TASK_PAGES = [
    {}, {"status__exact": TaskStatus.FAILED}, {"task_path__exact": PATH},
    {"status__exact": TaskStatus.FAILED, "queue_name__exact": "default"},
    {"q": PATH}, {"q": "00000000-0000-0000-0000-000000000000"}, {"q": "some-key"},
    {"p": "150"},
]
ITEM_PAGES = [{"dbworker_touch": State.FAILED}, {"dbworker_touch": State.FINISHED}]


@postgresql
@pytest.mark.parametrize("query", EXECUTION_PAGES, ids=urlencode)
def test_executions_list_reads_by_index(admin_client, units, query):
    check(admin_client, EXECUTIONS, query, most=11)


@postgresql
@pytest.mark.parametrize("query", TASK_PAGES, ids=urlencode)
def test_tasks_list_reads_by_index(admin_client, units, query):
    check(admin_client, TASKS, query, most=11)


@postgresql
@pytest.mark.parametrize("query", ITEM_PAGES, ids=urlencode)
def test_worker_status_filter_reads_by_index(admin_client, units, query):
    check(admin_client, ITEMS, query, most=12)


@postgresql
def test_counts_stop_at_the_bound(admin_client, units):
    page = check(admin_client, TASKS, {}, most=11)
    assert "more than 10,300" in page, "no full count: the count says where it stopped"


@postgresql
def test_select_all_changes_in_batches(admin_client, units, monkeypatch):
    """"Select all" of the list: the confirmation lists some rows and carries no keys; the
    change runs in batches by key and says so."""
    monkeypatch.setattr(actions, "BATCH", 7)
    across = {"action": "retry_tasks", "index": "0", "select_across": "1",
              "_selected_action": ["x"]}
    url = f"{TASKS}?{urlencode({'status__exact': TaskStatus.FAILED})}"
    confirm = admin_client.post(url, across).content.decode()
    assert "changes <strong>20</strong> of the 20 selected" in confirm
    assert 'name="_selected_action"' not in confirm
    done = admin_client.post(url, {**across, "post": "yes"}, follow=True).content.decode()
    assert "Retry: 20 of 20 selected tasks changed, in 3 batches of up to 7." in done
    assert not TaskRecord.objects.filter(status=TaskStatus.FAILED).exists()


@postgresql
def test_dashboard_reads_by_index(admin_client, units):
    """The dashboard is ``insight.snapshot``'s (counts capped, lags at the head of each
    claim index): every statement it sends reads by index too. Its statements follow the
    registered workers (a line each: four counts and the head of its claim order), never
    the rows; the database's horizon is three more (the server's own views), and the
    three newest-first reads of the windows run in a transaction of their own each
    (BEGIN, the planner's settings, COMMIT: ``index_first``)."""
    check(admin_client, reverse("admin:django_dbworker_dashboard_changelist"), {},
          most=5 * len(workers) + 30 + 3 + 3 * 3)


@pytest.mark.skipif(connection.vendor != "mysql", reason="MariaDB/MySQL's flag columns")
@pytest.mark.parametrize(("url", "query", "index"), [
    (TASKS, {"status__exact": TaskStatus.FAILED}, "dbworker_task_status"),
    (TASKS, {"status__exact": TaskStatus.WAITING}, "dbworker_task_status"),
    (EXECUTIONS, {"state__exact": State.FAILED}, "dbworker_execution_state"),
    (EXECUTIONS, {"state__exact": State.FINISHED}, "dbworker_execution_state"),
])
def test_a_settled_status_filter_reads_its_index_on_mariadb(admin_client, url, query, index):
    """MariaDB/MySQL have no partial indexes: the index by a settled status leads with its
    flag column, and the admin's status filter names the flag (``StatusFilter``), so the
    count and the page read that index, not the table."""
    with CaptureQueriesContext(connection) as captured:
        assert admin_client.get(f"{url}?{urlencode(query)}").status_code == 200
    reads = [q["sql"] for q in captured.captured_queries if "dbworker_settled" in q["sql"]]
    assert len(reads) == 2, "the bounded count and the page's keys"
    for sql in reads:
        keys = {row["key"] for row in explain_sql(sql, ()) if row["table"] in TABLES}
        assert index in keys, (sql, keys)
