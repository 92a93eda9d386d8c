"""``purge`` in batches (issue 39): a transaction per batch of waiting tasks, each found
through the index of its statuses, so a purge of a million never holds a claim, an enqueue
or a renewal up for long; the purge's own dependents go with what they wait for (deleted,
never cancelled first), the others are cancelled; tasks enqueued meanwhile stay; the
command says how far it is. The plans of each batch's statement are checked on a
never-analyzed PostgreSQL table."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import connection
from django.test.utils import CaptureQueriesContext

from django_dbworker.cli import changes
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.tasks import store as taskstore
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

LATER = timedelta(hours=1)


def status(result) -> str | None:
    found = TaskRecord.objects.filter(pk=result.id).values_list("status", flat=True)
    return found[0] if found else None


def waiting_backlog(n: int, queue: str = "default") -> list:
    """``n`` READY tasks (due in an hour: nothing claims them) of ``queue``, a tenth of
    them RETRYING, and for every tenth one a WAITING dependent."""
    ready = tasks.add.using(queue_name=queue, run_after=LATER).enqueue_many(
        [((i, i), {}) for i in range(n)])
    TaskRecord.objects.filter(pk__in=[r.id for r in ready[::10]]).update(
        status=TaskStatus.RETRYING)
    waiting = [tasks.add.using(queue_name=queue, after=[r]).enqueue(0, 0) for r in ready[::10]]
    return ready + waiting


def test_purge_deletes_in_batches_and_says_how_far_it_is():
    doomed = waiting_backlog(250)  # 250 READY or RETRYING, 25 WAITING
    kept = waiting_backlog(30, queue="emails")
    totals: list[int] = []
    assert taskstore.purge(["default"], batch=70, progress=totals.append) == len(doomed)
    assert len(totals) >= 4 and totals == sorted(totals) and totals[-1] == len(doomed)
    assert not TaskRecord.objects.filter(queue_name="default").exists()
    assert TaskRecord.objects.filter(queue_name="emails").count() == len(kept)


def test_a_chain_of_dependents_goes_with_its_head_across_batches():
    a = tasks.add.using(run_after=LATER).enqueue(1, 1)
    c = tasks.add.using(after=[a]).enqueue(1, 1)
    d = tasks.add.using(after=[c]).enqueue(1, 1)
    e = tasks.add.using(after=[d]).enqueue(1, 1)
    other = tasks.add.using(after=[d], queue_name="emails").enqueue(1, 1)
    assert taskstore.purge(["default"], batch=1) == 4  # a, c, d, e: none cancelled first
    assert [status(t) for t in (a, c, d, e)] == [None] * 4
    assert status(other) == TaskStatus.CANCELLED  # not purged: its dependency is gone


def test_tasks_enqueued_during_the_purge_stay():
    waiting_backlog(40)
    late: list = []

    def enqueue_one(total: int) -> None:
        late.append(tasks.add.using(run_after=LATER).enqueue(total, 0))

    deleted = taskstore.purge(None, batch=10, progress=enqueue_one)
    assert deleted == 44 and len(late) >= 4
    assert all(status(r) == TaskStatus.READY for r in late)


def test_the_command_reports_progress_on_stderr(monkeypatch):
    monkeypatch.setattr(changes, "BATCH", 7)
    waiting_backlog(30)  # 33 tasks
    out, err = StringIO(), StringIO()
    call_command("dbworker", "purge", "--yes", stdout=out, stderr=err)
    assert "Changed 33." in out.getvalue()
    lines = err.getvalue().splitlines()
    # Batches of 7 keys, each with the WAITING dependents that go with them.
    done = [int(line.split()[1]) for line in lines]
    assert all(line == f"purge: {n} of 33 done" for line, n in zip(lines, done, strict=True))
    assert len(done) >= 4 and done == sorted(done) and 7 <= done[0] < 33 and done[-1] == 33
    assert not TaskRecord.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="EXPLAIN plans of PostgreSQL")
def test_each_batch_reads_through_an_index_on_a_fresh_table():
    from tests.test_admin_plans import insert

    insert(TaskRecord, 20_000, id="gen_random_uuid()", task_path=f"'{tasks.add.module_path}'",
           status=f"'{TaskStatus.SUCCESSFUL}'", finished_at="now()", attempts="1")
    waiting_backlog(30)
    with CaptureQueriesContext(connection) as captured:
        assert taskstore.purge(None, batch=10) == 33
    selects = [q["sql"] for q in captured.captured_queries
               if q["sql"].startswith("SELECT") and "FOR UPDATE" in q["sql"]]
    assert selects
    with connection.cursor() as cursor:
        for sql in selects:
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Seq Scan on django_dbworker_taskrecord" not in plan, (sql, plan)
