"""The per-unit shortcuts behave like the ORM they replace: compiled claims and rows, the
unclaim transition, transaction checks folded into statements, the bulk task insert."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from django_dbworker.db import compiled, sources
from django_dbworker.db.connections import TransactionCheck
from django_dbworker.djtasks import default_task_backend, task_finished
from django_dbworker.exceptions import InvalidTaskArguments
from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from django_dbworker.rows import planner, store
from django_dbworker.rows.registry import workers
from django_dbworker.supervisor.prefetch import Prefetch
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.testapp import tasks
from tests.testapp.models import Document, Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


# ----- compiled claims --------------------------------------------------------------------


def test_a_queryset_eligible_is_compiled_once_and_claims_the_same(monkeypatch):
    compiled.forget()
    loose = workers["loose"]  # eligible is a QuerySet: its SQL cannot change
    assert loose.static_eligible and not workers["touch"].static_eligible
    items = [Item.objects.create(kind="loose") for _ in range(3)]
    builds = []
    real = compiled.compile_query
    monkeypatch.setattr(compiled, "compile_query", lambda qs, using: (builds.append(1),
                                                                       real(qs, using))[1])
    first = planner.claim(loose, 1, Claimant(), 30)
    second = planner.claim(loose, 1, Claimant(), 30)
    third = planner.claim(loose, 1, Claimant(), 30)
    assert len(builds) == 2, "compiled once, with two probes for the slot of now"
    assert [int(c.source_key) for c in first + second + third] == [i.pk for i in items]


def test_a_callable_eligible_is_compiled_for_every_claim(monkeypatch):
    compiled.forget()
    Item.objects.create()
    builds = []
    real = compiled.compile_query
    monkeypatch.setattr(compiled, "compile_query", lambda qs, using: (builds.append(1),
                                                                       real(qs, using))[1])
    planner.claim(workers["touch"], 1, Claimant(), 30)
    planner.claim(workers["touch"], 1, Claimant(), 30)
    assert len(builds) == 2


def test_claims_of_a_compiled_query_respect_available_at():
    compiled.forget()
    item = Item.objects.create(kind="loose")
    Execution.objects.filter(source_id=str(item.pk)).update(
        available_at=timezone.now() + timedelta(hours=1))
    assert planner.claim(workers["loose"], 5, Claimant(), 30) == []
    Execution.objects.filter(source_id=str(item.pk)).update(available_at=timezone.now())
    assert len(planner.claim(workers["loose"], 5, Claimant(), 30)) == 1


# ----- source rows ------------------------------------------------------------------------


def test_source_rows_read_like_get():
    item = Item.objects.create(action="steps:3", rank=7)
    document = Document.objects.create(title="hello")
    for model, pk in ((Item, item.pk), (Document, document.pk), (Document, str(document.pk))):
        fast = sources.get(model, pk, "default")
        slow = model.objects.get(pk=pk)
        assert type(fast) is model
        assert {f.attname: getattr(fast, f.attname) for f in model._meta.concrete_fields} == {
            f.attname: getattr(slow, f.attname) for f in model._meta.concrete_fields}
        assert not fast._state.adding and fast._state.db == "default"
    with pytest.raises(Item.DoesNotExist):
        sources.get(Item, 999_999, "default")


def test_task_rows_read_like_get_json_included():
    result = tasks.add.using(priority=5).enqueue(2, 3)
    row = taskstore.get(result.id)
    assert row == TaskRecord.objects.get(pk=result.id)
    assert row.args == [2, 3] and row.kwargs == {} and row.priority == 5
    assert taskstore.get(uuid.uuid4()) is None


def test_annotations_come_back_as_attributes(vendor):
    item = Item.objects.create()
    check = TransactionCheck("default")
    row = sources.get(Item, item.pk, "default", check.annotations())
    assert (TransactionCheck.NAME in vars(row)) == (vendor == "postgresql")


# ----- transaction checks -------------------------------------------------------------------


def test_handler_that_rolls_back_through_a_cursor_is_detected():
    item = Item.objects.create(action="raw_rollback")
    assert run_until_idle(["touch"]) == {"failed": 1}
    error = workers["touch"].state(item.pk)["error"]
    assert error["exception_class"] == "django_dbworker.exceptions.HandlerTransactionError"
    assert "ended the transaction itself" in error["message"]
    assert not Effect.objects.exists()


def test_finished_units_record_their_status_with_the_marker_in_the_update():
    items = [Item.objects.create() for _ in range(3)]
    assert run_until_idle(["touch"]) == {"finished": 3}
    assert Effect.objects.filter(worker="touch").count() == 3
    for item in items:
        assert workers["touch"].state(item.pk)["execution_status"] == "FINISHED"


# ----- unclaim ------------------------------------------------------------------------------


def test_unclaim_puts_units_back_as_they_were_and_counts_nothing():
    again, done = Item.objects.create(), Item.objects.create()
    assert run_until_idle(["touch"]) == {"finished": 2}
    store.reprocess(workers["touch"], [again.pk])  # FINISHED -> UNFINISHED, attempts 1
    newest = Item.objects.create()
    claims = planner.claim(workers["touch"], 10, Claimant(), 30)
    assert sorted(int(c.source_key) for c in claims) == [again.pk, newest.pk]
    assert store.unclaim(claims) == 2
    by_pk = {int(e.source_id): e for e in Execution.objects.filter(worker="touch")}
    assert (by_pk[newest.pk].state, by_pk[newest.pk].attempts) == (State.PENDING, 0)
    assert by_pk[newest.pk].started_at is None
    assert (by_pk[again.pk].state, by_pk[again.pk].attempts) == (State.UNFINISHED, 1)
    assert by_pk[done.pk].state == State.FINISHED
    assert all(e.token is None and e.crashes == 0 for e in by_pk.values())
    assert store.unclaim(claims) == 0, "fenced by the tokens: only once"


def test_unclaim_leaves_a_unit_another_claim_took_alone():
    Item.objects.create()
    (old,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    store.unclaim([old])
    (new,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    assert store.unclaim([old]) == 0
    assert Execution.objects.get(pk=new.execution_id).state == State.WORKING


def test_task_unclaim_takes_back_the_attempt_and_worker_id():
    result = tasks.add.enqueue(1, 2)
    (c,) = taskplanner.claim(None, 1, Claimant(), 30)
    row = TaskRecord.objects.get(pk=result.id)
    assert (row.status, row.attempts, len(row.worker_ids)) == (TaskStatus.RUNNING, 1, 1)
    assert taskstore.unclaim([c]) == 1
    row.refresh_from_db()
    assert (row.status, row.attempts, row.worker_ids) == (TaskStatus.READY, 0, [])
    assert row.started_at is None and row.token is None and row.crashes == 0
    assert run_until_idle() == {"successful": 1}
    row.refresh_from_db()
    assert row.attempts == 1 and len(row.worker_ids) == 1


# ----- prefetch arithmetic ------------------------------------------------------------------


def test_nothing_is_claimed_ahead_until_units_are_known_to_be_short():
    p = Prefetch(per_child=2, concurrency=3, lease=30)
    assert p.ahead() == 0
    p.ran(0.001)
    assert p.ahead() == 6, "short units: up to PREFETCH per child"
    for _ in range(50):
        p.ran(0.2)
    assert p.ahead() == 0, "slow units: nothing waits"
    assert Prefetch(per_child=0, concurrency=3, lease=30).ahead() == 0


def test_units_waiting_too_long_are_taken_out_and_count_as_slow():
    p = Prefetch(per_child=2, concurrency=1, lease=30)
    p.ran(0.001)
    p.put(["a", "b"], now=100.0)  # type: ignore[list-item]
    assert p.expired(100.5) == []
    assert p.expired(101.0) == ["a", "b"]
    assert len(p) == 0 and p.ahead() == 0
    assert Prefetch(2, 1, lease=0.6).hold == pytest.approx(0.2), "a third of the lease"


# ----- enqueue_many -------------------------------------------------------------------------


def test_enqueue_many_stores_what_enqueue_stores():
    task = tasks.send_email.using(run_after=timedelta(hours=1))
    one = task.enqueue("a@example.com")
    many = task.enqueue_many([(["b@example.com"], {}), ([], {"address": "c@example.com"})])
    rows = {str(r.pk): r for r in TaskRecord.objects.all()}
    assert len(rows) == 3
    single = rows[one.id]
    for result, args, kwargs in ((many[0], ["b@example.com"], {}),
                                 (many[1], [], {"address": "c@example.com"})):
        row = rows[result.id]
        assert (row.args, row.kwargs) == (args, kwargs) == (result.args, result.kwargs)
        for name in ("task_path", "backend", "queue_name", "priority", "status", "attempts",
                     "errors", "worker_ids", "schedule", "idempotency_key", "progress"):
            assert getattr(row, name) == getattr(single, name), name
        assert row.run_after == row.available_at and row.run_after > timezone.now()
        assert result.enqueued_at == row.enqueued_at
    assert len({r.pk for r in rows.values()}) == 3 and all(
        r.pk.version == 4 for r in rows.values())


def test_enqueue_many_of_thousands_in_a_statement_per_batch(django_assert_max_num_queries):
    from django_dbworker.tasks import newtasks

    batches = 3
    count = newtasks.BATCH * (batches - 1) + 1
    with django_assert_max_num_queries(batches + 3) as captured:  # BEGIN/NOTIFY/COMMIT
        results = tasks.add.enqueue_many([([i, i], {}) for i in range(count)])
    inserts = [q for q in captured.captured_queries if "INSERT INTO" in q["sql"]]
    assert len(inserts) == batches
    assert TaskRecord.objects.count() == count
    assert TaskRecord.objects.get(pk=results[1234].id).args == [1234, 1234]


def test_task_claims_bring_the_row_as_get_reads_it():
    from django_dbworker.units.claimant import Claimant

    tasks.add.using(priority=3).enqueue_many([((i,), {"b": [i, {"x": None}]}) for i in range(3)])
    claims = taskplanner.claim(None, 3, Claimant(), 30)
    assert len(claims) == 3
    fields = [f.attname for f in TaskRecord._meta.concrete_fields]
    for c in claims:
        carried, stored = c.row(connection.alias), taskstore.get(c.task_id)
        assert {f: getattr(carried, f) for f in fields} == {f: getattr(stored, f) for f in fields}
        assert carried.status == TaskStatus.RUNNING and carried.token == c.token
        assert carried.attempts == c.attempt == 1 and len(carried.worker_ids) == 1
        assert not carried._state.adding and carried._state.db == connection.alias


def test_status_statements_do_not_wait_for_the_wal_flush_on_postgres(vendor, settings):
    from django.test.utils import CaptureQueriesContext

    tasks.add.enqueue_many([((i, i), {}) for i in range(4)])
    with CaptureQueriesContext(connection) as captured:
        (one,) = taskplanner.claim(None, 1, Claimant(), 30)
        assert taskstore.succeed(one, 2) == 1
    asynchronous = vendor == "postgresql"
    statements = [q["sql"] for q in captured.captured_queries if "UPDATE" in q["sql"]
                  and not q["sql"].startswith("SELECT")]  # MariaDB: the ids, locked
    assert len(statements) == 2, "the claim and the completion"
    assert all(q.startswith("SET LOCAL synchronous_commit = off; ") == asynchronous
               for q in statements), statements
    with connection.cursor() as cursor:  # the setting lasted only for those transactions
        if asynchronous:
            cursor.execute("SHOW synchronous_commit")
            assert cursor.fetchone() == ("on",)
    settings.DBWORKER = {**settings.DBWORKER, "ASYNC_COMMIT": False}
    with CaptureQueriesContext(connection) as captured:
        (two,) = taskplanner.claim(None, 1, Claimant(), 30)
        assert taskstore.succeed(two, 2) == 1
    assert not any("synchronous_commit" in q["sql"] for q in captured.captured_queries)
    assert TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count() == 2


def test_plain_normalises_like_django():
    from collections import OrderedDict, UserList

    from django_dbworker.djtasks import normalize_json
    from django_dbworker.tasks.newtasks import plain

    values = [
        1, 1.5, True, None, "x", (1, (2, 3)), [1, [2, {"a": (3,)}]], {"k": [1, 2]},
        {1: "int key"}, OrderedDict(b=1), UserList([1, 2]), b"bytes", [b"in", {"x": b"y"}],
        {"nested": {"deep": [(), {}]}},
    ]
    for value in values:
        assert plain(value) == normalize_json(value), value
        assert type(plain(value)) is type(normalize_json(value)), value
    for bad in (object(), [1, object()], {"a": {1, 2}}, b"\xff"):
        with pytest.raises((TypeError, ValueError)):
            normalize_json(bad)
        with pytest.raises((TypeError, ValueError)):
            plain(bad)


def test_new_ids_are_distinct_version_4_uuids():
    from django_dbworker.tasks import newtasks

    shared = newtasks.Shared.of(tasks.add)
    ids = newtasks.ids(shared, 5000)
    parsed = [uuid.UUID(i) for i in ids]
    assert [str(u) for u in parsed] == ids, "canonical text"
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in parsed)
    assert len(set(ids)) == 5000
    keyed = newtasks.Shared.of(tasks.add.using(idempotency_key="k"))
    assert newtasks.ids(keyed, 2) == [str(uuid.uuid5(newtasks.KEY_NAMESPACE, "k"))] * 2


def test_enqueue_many_results_are_separate_objects_like_get_result():
    from django_dbworker.tasks.results import DBWorkerTaskResult

    results = tasks.add.enqueue_many([((i,), {"b": i}) for i in range(3)] + [((), {})])
    assert all(type(r) is DBWorkerTaskResult for r in results)
    assert [r.args for r in results] == [[0], [1], [2], []]
    assert [r.kwargs for r in results] == [{"b": 0}, {"b": 1}, {"b": 2}, {}]
    fetched = [default_task_backend.get_result(r.id) for r in results]
    for made, got in zip(results, fetched, strict=True):
        for name in ("id", "status", "args", "kwargs", "backend", "errors", "worker_ids",
                     "enqueued_at", "started_at", "finished_at", "dbworker_status",
                     "progress", "progress_message", "idempotency_key"):
            assert getattr(made, name) == getattr(got, name), name
        assert made.task.name == got.task.name
    results[0].errors.append("mine")
    results[0].worker_ids.append("mine")
    assert results[1].errors == [] and results[1].worker_ids == [], "no list is shared"
    run_until_idle()
    results[2].refresh()
    results[3].refresh()
    assert results[2].return_value == 4 and results[3].status == "FAILED"


def test_enqueue_many_names_the_call_that_is_not_json_and_stores_nothing():
    calls = [((1, 1), {}), ((2, 2), {"x": float("nan")}), ((3, 3), {}), ((4, float("inf")), {})]
    with pytest.raises(InvalidTaskArguments,
                       match=r"call 1 cannot be stored as JSON.*not JSON compliant: nan"):
        tasks.add.enqueue_many(calls)
    with pytest.raises(InvalidTaskArguments, match=r"call 2 cannot be stored as JSON"):
        tasks.add.enqueue_many([((1, 1), {}), ((2, 2), {}), ((object(), 1), {})])
    with pytest.raises(InvalidTaskArguments, match=r"call 1 is 7; give \(args, kwargs\)"):
        tasks.add.enqueue_many([((1, 1), {}), 7])
    with pytest.raises(InvalidTaskArguments, match=r"call 0.*cannot be stored as JSON"):
        tasks.add.enqueue_many([(1, {})])  # args that are not a sequence
    assert not TaskRecord.objects.exists()
    assert tasks.add.enqueue_many([]) == []


def test_idempotency_keys_are_unique_only_where_set():
    from django.db import IntegrityError, transaction

    tasks.add.enqueue_many([((i, i), {}) for i in range(3)])
    first = tasks.add.using(idempotency_key="once").enqueue(1, 1)
    again = tasks.add.using(idempotency_key="once").enqueue(2, 2)
    assert again.id == first.id and again.args == [1, 1]
    assert TaskRecord.objects.filter(idempotency_key__isnull=True).count() == 3
    row = TaskRecord.objects.get(pk=first.id)
    row.pk = uuid.uuid4()
    with pytest.raises(IntegrityError), transaction.atomic():
        row.save(force_insert=True)


def test_postgres_tables_carry_the_storage_parameters_of_the_migration(vendor):
    if vendor != "postgresql":
        pytest.skip("storage parameters are PostgreSQL's")
    with connection.cursor() as cursor:
        cursor.execute("SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s)",
                       [["django_dbworker_execution", "django_dbworker_taskrecord"]])
        found = dict(cursor.fetchall())
    assert set(found) == {"django_dbworker_execution", "django_dbworker_taskrecord"}
    for options in found.values():
        assert "fillfactor=90" in options
        assert "autovacuum_vacuum_scale_factor=0.01" in options


def test_finished_signal_carries_the_progress_recorded_while_running():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append(task_result)

    task_finished.connect(receiver)
    try:
        result = tasks.with_progress.enqueue(0)
        assert run_until_idle() == {"successful": 1}
    finally:
        task_finished.disconnect(receiver)
    (finished,) = seen
    stored = TaskRecord.objects.get(pk=result.id)
    assert finished.progress == stored.progress == 50
    assert finished.progress_message == stored.progress_message == "half way"
    assert finished.finished_at == stored.finished_at and finished.return_value == "done"
    # Made from the running task's result, not read again: the same as reading it now.
    fresh = default_task_backend.get_result(result.id)
    for name in ("id", "status", "enqueued_at", "started_at", "finished_at",
                 "last_attempted_at", "args", "kwargs", "errors", "worker_ids",
                 "dbworker_status", "progress", "progress_message", "return_value"):
        assert getattr(finished, name) == getattr(fresh, name), name


# ----- SQLite plans -------------------------------------------------------------------------


def test_sqlite_claim_names_its_index_even_when_statistics_say_scan(vendor):
    if vendor != "sqlite":
        pytest.skip("SQLite's planner only")
    Item.objects.bulk_create(Item() for _ in range(2000))
    workers_touch = workers["touch"]
    from django_dbworker.rows.sweep import Sweeper

    Sweeper(workers_touch, 5000).sweep_all()  # every unit waiting
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
        now = timezone.now()
        sql, params = store.claim_sql(workers_touch, 1, Claimant(), token=uuid.uuid4(),
                                      now=now, expires=now)
        cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
        plan = [row[-1] for row in cursor.fetchall()]
    assert any("USING INDEX dbworker_execution_claimable" in line for line in plan), plan
    assert not any(line.startswith("SCAN django_dbworker_execution") for line in plan), plan


@pytest.mark.parametrize(("queues", "indexes"), [
    # runworkers --queue default: the queue's own index (the other one's guard is not
    # stated: models.ANY_QUEUE_GUARD)
    (["default"], ("dbworker_task_claimable",)),
    (None, ("dbworker_task_claimable_any",)),  # runworkers without --queue: every queue
])
def test_task_claims_walk_an_index_without_sorting(vendor, queues, indexes):
    from django.test.utils import CaptureQueriesContext

    tasks.add.enqueue_many([([i, i], {}) for i in range(3000)])
    tasks.add.using(priority=7).enqueue_many([([i, i], {}) for i in range(100)])
    analyze = "ANALYZE TABLE" if vendor == "mysql" else "ANALYZE"
    with connection.cursor() as cursor:
        cursor.execute(f"{analyze} {TaskRecord._meta.db_table}")
        if vendor == "mysql":
            cursor.fetchall()
    with CaptureQueriesContext(connection) as captured:
        claimed = taskplanner.claim(queues, 8, Claimant(), 30)
    assert [c.row(connection.alias).priority for c in claimed] == [7] * 8
    assert len(claimed) == 8
    # The statement that finds the candidates (Engine.claim): PostgreSQL's one statement,
    # after "SET LOCAL synchronous_commit = off; " (Engine.execute_status); elsewhere the
    # SELECT before the UPDATE of the ids it found.
    (sql,) = [q["sql"].rpartition("; ")[2] for q in captured.captured_queries
              if "ORDER BY" in q["sql"]]
    assert sql.startswith("WITH picked" if vendor == "postgresql" else "SELECT"), sql
    with connection.cursor() as cursor:
        if vendor == "postgresql":
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert any(f"{index} " in plan for index in indexes), plan
            assert "Sort" not in plan, plan
        elif vendor == "mysql":  # the flag-led index (db.partial), in order, no filesort
            # (no partial index there, so no guard: a claim of some queues names the
            # every-queue index it must not use, TaskRecordQuerySet.in_queues)
            cursor.execute(f"EXPLAIN {sql}")
            names = [c[0].lower() for c in cursor.description]
            rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            (scan,) = rows
            assert scan["key"] in indexes and scan["type"] in ("ref", "range"), rows
            assert "filesort" not in (scan["extra"] or ""), rows
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = "\n".join(row[-1] for row in cursor.fetchall())
            assert any(f"USING INDEX {index} " in plan for index in indexes), plan
            assert "TEMP B-TREE" not in plan, plan


@pytest.mark.parametrize("keyed", [False, True])
def test_a_claim_of_one_queue_never_walks_past_another_queues_older_tasks(vendor, keyed):
    """A paused queue's backlog (or any other queue's) older than the claimed queue's tasks
    is never read by the claim of that queue: on MariaDB/MySQL, whose optimizer took the
    every-queue index for it (when the claimed queue holds many of the waiting tasks) and
    read the 3,000 older rows first, the claim names that index as one it must not use
    (``db.hints``); elsewhere its guard keeps it out."""
    from django.test.utils import CaptureQueriesContext

    tasks.add.using(queue_name="emails").enqueue_many([([i, i], {}) for i in range(3000)])
    tasks.add.enqueue_many([([i, i], {}) for i in range(3000)])
    analyze = "ANALYZE TABLE" if vendor == "mysql" else "ANALYZE"
    with connection.cursor() as cursor:
        cursor.execute(f"{analyze} {TaskRecord._meta.db_table}")
        if vendor == "mysql":
            cursor.fetchall()
    with CaptureQueriesContext(connection) as captured:
        claimed = taskplanner.claim(["default"], 100, Claimant(), 30, keyed=keyed)
    assert len(claimed) == 100
    assert {c.row(connection.alias).queue_name for c in claimed} == {"default"}
    (sql,) = [q["sql"].rpartition("; ")[2] for q in captured.captured_queries
              if "ORDER BY" in q["sql"]]
    with connection.cursor() as cursor:
        if vendor == "mysql":
            cursor.execute("FLUSH STATUS")
            cursor.execute(sql.replace(" FOR UPDATE SKIP LOCKED", ""))
            cursor.fetchall()
            cursor.execute("SHOW SESSION STATUS WHERE Variable_name IN "
                           "('Handler_read_next', 'Handler_read_prev', 'Handler_read_rnd_next')")
            read = sum(int(value) for _, value in cursor.fetchall())
            assert read < 500, f"{read} rows read for 100 claimed (keyed: 400 read): {sql}"
            cursor.execute(f"EXPLAIN {sql}")
            names = [c[0].lower() for c in cursor.description]
            (scan,) = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
            assert scan["key"] == "dbworker_task_claimable", scan
        elif vendor == "postgresql":
            cursor.execute(f"EXPLAIN {sql}")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "dbworker_task_claimable " in plan and "Sort" not in plan, plan
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
            plan = "\n".join(row[-1] for row in cursor.fetchall())
            assert "USING INDEX dbworker_task_claimable " in plan, plan
            assert "TEMP B-TREE" not in plan, plan


def test_a_completion_commits_without_the_wal_flush_only_after_no_write(vendor, settings):
    """A row's completion on PostgreSQL: if nothing was written before it in its
    transaction, the commit does not wait for the WAL flush; after a write of the
    handler's, it does (ASYNC_COMMIT); never with ASYNC_COMMIT off."""
    from django.db import transaction

    from django_dbworker.outcomes import Finished

    def synchronous_after(write: bool) -> str:
        item = Item.objects.create()
        (c,) = [c for c in planner.claim(workers["touch"], 5, Claimant(), 30)
                if c.source_key == str(item.pk)]
        with transaction.atomic():
            if write:
                Effect.objects.create(item_id=item.pk, worker="touch")
            assert store.complete(c, Finished()) == 1
            if vendor != "postgresql":
                return "n/a"
            with connection.cursor() as cursor:
                cursor.execute("SHOW synchronous_commit")
                return cursor.fetchone()[0]

    if vendor != "postgresql":
        assert synchronous_after(write=False) == "n/a"
        return
    assert synchronous_after(write=False) == "off", "status only: no flush to wait for"
    assert synchronous_after(write=True) == "on", "the handler's writes wait for the flush"
    settings.DBWORKER = {**settings.DBWORKER, "ASYNC_COMMIT": False}
    assert synchronous_after(write=False) == "on"
    with connection.cursor() as cursor:  # SET LOCAL: it lasted only for the transaction
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone() == ("on",)
    assert Execution.objects.filter(worker="touch", state=State.FINISHED).count() == 3

