"""Per-key concurrency limits (``@task(concurrency_limit=N, concurrency_key=...)``,
``tasks/concurrency.py``): claims in-process on real databases, bad input, and 200 tasks
over 5 keys under two real supervisors."""

from __future__ import annotations

import re
from collections import defaultdict
from datetime import timedelta

import pytest
from django.utils import timezone

from django_dbworker.djtasks import InvalidTask, task
from django_dbworker.exceptions import InvalidTaskArguments
from django_dbworker.models import ConcurrencySlot, TaskRecord, TaskStatus
from django_dbworker.tasks import concurrency
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.testing import run_until_idle
from django_dbworker.units import slots
from django_dbworker.units.claimant import Claimant
from django_dbworker.units.failures import FailureInfo
from tests.conftest import wait_for
from tests.testapp import concurrency_tasks as ct
from tests.testapp import tasks
from tests.testapp.models import Item

pytest_db = pytest.mark.django_db(transaction=True)
ACCOUNT = ct.conc_account.module_path


def claim(room: int, claimant: Claimant | None = None, **kwargs):
    return taskplanner.claim(None, room, claimant or Claimant(), 30, keyed=True, **kwargs)


def keys_of(claims) -> list[str | None]:
    found = dict(TaskRecord.objects.filter(pk__in=[c.task_id for c in claims])
                 .values_list("pk", "concurrency_key"))
    return [found[c.task_id] for c in claims]


def counts(claims) -> dict[str | None, int]:
    found: dict[str | None, int] = defaultdict(int)
    for key in keys_of(claims):
        found[key] += 1
    return dict(found)


# ----- enqueue ------------------------------------------------------------------------------


@pytest_db
def test_the_key_and_limit_are_stored_with_each_call_in_call_order():
    results = ct.conc_account.enqueue_many([((i % 3, i), {}) for i in range(7)])
    rows = {str(r.pk): r for r in TaskRecord.objects.all()}
    assert [rows[r.id].concurrency_key for r in results] == [
        f"account-{i % 3}" for i in range(7)], "grouped by key, results still in call order"
    assert [rows[r.id].args for r in results] == [[i % 3, i] for i in range(7)]
    assert {r.concurrency_limit for r in rows.values()} == {2}
    assert set(ConcurrencySlot.objects.values_list("key", flat=True)) == {
        "account-0", "account-1", "account-2"}
    single = ct.conc_single.enqueue(1)
    assert TaskRecord.objects.get(pk=single.id).concurrency_key == ct.conc_single.module_path
    given = ct.conc_account.using(concurrency_key="vip").enqueue(5, 1)
    assert TaskRecord.objects.get(pk=given.id).concurrency_key == "vip"
    plain = tasks.add.enqueue(1, 2)
    row = TaskRecord.objects.get(pk=plain.id)
    assert row.concurrency_key is None and row.concurrency_limit is None


@pytest_db
def test_keyed_enqueue_on_commit_and_with_an_idempotency_key():
    from django.db import transaction

    with transaction.atomic():
        ct.conc_account.using(enqueue_on_commit=True).enqueue(8, 1)
        assert not TaskRecord.objects.exists()
    assert TaskRecord.objects.get().concurrency_key == "account-8"
    first = ct.conc_account.using(idempotency_key="once").enqueue(9, 1)
    again = ct.conc_account.using(idempotency_key="once").enqueue(9, 2)
    assert first.id == again.id and TaskRecord.objects.filter(concurrency_key="account-9"
                                                              ).count() == 1


# ----- claims -------------------------------------------------------------------------------


@pytest_db
def test_a_key_never_runs_more_than_its_limit_across_claimants_and_claims():
    ct.conc_account.enqueue_many([((a, i), {}) for i in range(6) for a in (1, 2)])
    first = claim(10)
    assert counts(first) == {"account-1": 2, "account-2": 2}
    assert claim(10, Claimant()) == [], "another supervisor finds both keys full"
    assert claim(1) == []
    assert concurrency.running_counts(["account-1", "account-2"]) == {
        "account-1": 2, "account-2": 2}
    assert TaskRecord.objects.filter(status=TaskStatus.READY, attempts=0).count() == 8, \
        "the tasks left waiting used no attempt"
    taskstore.succeed(first[0], 1)
    (next_one,) = claim(10, Claimant())
    assert keys_of([next_one]) == keys_of([first[0]]), "the freed place goes to its key"


@pytest_db
def test_claims_keep_claim_order_within_and_across_keys():
    ct.conc_account.using(priority=5).enqueue_many([((1, i), {}) for i in range(3)])
    ct.conc_account.enqueue_many([((2, i), {}) for i in range(3)])
    early = tasks.add.using(priority=10).enqueue(0, 0)
    got = claim(10)
    assert str(got[0].task_id) == early.id, "priority first"
    assert keys_of(got)[1:] == [
        "account-1", "account-1", "account-2", "account-2"]


@pytest_db
def test_a_full_key_blocks_neither_other_keys_nor_plain_tasks_behind_it():
    ct.conc_account.enqueue_many([((1, i), {}) for i in range(120)])  # first in claim order
    ct.conc_account.enqueue_many([((2, i), {}) for i in range(3)])
    plain = tasks.add.enqueue_many([((i, i), {}) for i in range(3)])
    holder = claim(2)
    assert counts(holder) == {"account-1": 2}
    got = claim(4, Claimant())
    assert counts(got) == {"account-2": 2, None: 2}, "past 120 tasks of a full key"
    got_more = claim(4, Claimant())
    assert counts(got_more) == {None: 1}
    assert {str(c.task_id) for c in got + got_more if c.task_path != ACCOUNT} == {
        r.id for r in plain}
    # A key that fills up within one claim: the page read after it skips its tasks.
    ct.conc_account.enqueue_many([((3, i), {}) for i in range(80)])
    ct.conc_account.enqueue_many([((4, i), {}) for i in range(2)])
    assert counts(claim(4)) == {"account-3": 2, "account-4": 2}


@pytest_db
def test_tasks_read_without_a_lock_are_claimed_only_while_they_wait_and_nobody_holds_them(
        vendor):
    """The pages a keyed claim reads past full keys without locks (MariaDB/MySQL:
    ``Engine.locks_rows_it_filters``): ``claim_ids(held=False)`` locks them ``SKIP
    LOCKED`` and takes only those still waiting, so a task another claim took or holds
    meanwhile is never claimed twice."""
    import threading

    from django.db import connections, transaction

    ids = {r.id for r in tasks.add.enqueue_many([((i, i), {}) for i in range(3)])}
    (first,) = taskplanner.claim(None, 1, Claimant(), 30)  # ties: in index order
    taken = str(first.task_id)
    locked, free = sorted(ids - {taken})
    holding, release = threading.Event(), threading.Event()

    def hold() -> None:  # another claim's transaction, holding one of the rows
        try:
            with transaction.atomic():
                list(TaskRecord.objects.select_for_update().filter(pk=locked))
                holding.set()
                release.wait(30)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold)
    if vendor != "sqlite":  # one writer at a time there: nothing can hold a row meanwhile
        holder.start()
        assert holding.wait(30)
    try:
        with transaction.atomic():
            got = taskstore.claim_ids([taken, locked, free], Claimant(), 30, timezone.now(),
                                      held=False)
    finally:
        release.set()
        if holder.is_alive():
            holder.join(30)
    expected = {free} if vendor != "sqlite" else {locked, free}
    assert {str(c.task_id) for c in got} == expected
    assert TaskRecord.objects.get(pk=taken).attempts == 1, "the claim taken before: untouched"


@pytest_db
def test_the_plain_claim_leaves_keyed_tasks_to_the_keyed_one():
    ct.conc_account.enqueue_many([((1, i), {}) for i in range(3)])
    plain = tasks.add.enqueue(1, 1)
    got = taskplanner.claim(None, 10, Claimant(), 30)
    assert [str(c.task_id) for c in got] == [plain.id]
    assert TaskRecord.objects.filter(status=TaskStatus.READY).count() == 3


@pytest_db
def test_a_released_or_reaped_holder_frees_its_place():
    ct.conc_single.enqueue_many([((i,), {}) for i in range(3)])
    (held,) = claim(5)
    assert claim(5) == []
    taskstore.release(held, crashed=FailureInfo("x.Boom", "child died"), max_crashes=3)
    (again,) = claim(5)
    assert claim(5) == []
    TaskRecord.objects.filter(pk=again.task_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert taskstore.reap(max_crashes=3) == 1
    (third,) = claim(5)
    assert claim(5) == []
    taskstore.unclaim([third])  # claimed ahead, given back before it ran
    assert len(claim(5)) == 1, "a task given back frees its place too"


@pytest_db
def test_each_row_is_held_to_its_own_limit_when_tasks_share_a_key():
    ct.conc_shared_one.enqueue_many([((i,), {}) for i in range(3)])
    ct.conc_shared_three.enqueue_many([((i,), {}) for i in range(3)])
    got = claim(10)
    paths = [c.task_path for c in got]
    assert paths.count(ct.conc_shared_one.module_path) == 1, "limit 1: one while none ran"
    assert paths.count(ct.conc_shared_three.module_path) == 2, "limit 3: while fewer than 3"
    assert claim(10) == []


@pytest_db
def test_rate_limits_and_concurrency_limits_together():
    ct.conc_rated.enqueue_many([((a, i), {}) for i in range(4) for a in (1, 2)])
    tasks.add.enqueue_many([((i, i), {}) for i in range(2)])
    got = taskplanner.claim_limited(None, 10, Claimant(), 30, global_limit=None,
                                  limits={ct.conc_rated.module_path: "1000/s"}, keyed=True)
    assert counts(got) == {"account-1": 2, "account-2": 2, None: 2}


@pytest_db
def test_a_deleted_slot_is_made_again_at_the_claim():
    ct.conc_single.enqueue(1)
    ConcurrencySlot.objects.all().delete()
    assert len(claim(2)) == 1 and ConcurrencySlot.objects.count() == 1


@pytest_db
def test_run_until_idle_runs_keyed_tasks():
    ct.conc_account.enqueue_many([((a, i), {}) for i in range(3) for a in (1, 2)])
    assert run_until_idle() == {"successful": 6}


@pytest_db
def test_claimants_racing_in_threads_never_pass_a_limit(vendor):
    """Four claimants claim and finish at once, over and over; every claim's view and a
    watcher's count stay within the limit, and every task runs once."""
    import threading

    from django.db import connections

    if vendor == "sqlite":
        pytest.skip("SQLite serialises writers; the process test covers it there")
    ct.conc_account.enqueue_many([((i % 3, i), {}) for i in range(150)])
    errors: list[BaseException] = []
    seen: list[int] = []
    done = threading.Event()

    def claimant() -> None:
        me = Claimant()
        try:
            while got := claim(3, me) or TaskRecord.objects.filter(
                    status__in=[TaskStatus.READY, TaskStatus.RUNNING]).exists():
                if got is True:
                    continue
                seen.append(max(concurrency.running_counts(
                    [f"account-{a}" for a in range(3)]).values()))
                taskstore.succeed_many([(c, None, timezone.now()) for c in got])
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def watcher() -> None:
        try:
            while not done.is_set():
                seen.append(max(concurrency.running_counts(
                    [f"account-{a}" for a in range(3)]).values()))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=claimant) for _ in range(4)]
    watching = threading.Thread(target=watcher)
    watching.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done.set()
    watching.join(10)
    assert not errors, errors
    assert seen and max(seen) <= 2, max(seen)
    assert TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL, attempts=1).count() == 150


# ----- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2", 10**7])
def test_a_bad_limit_is_refused_where_it_is_declared(limit):
    with pytest.raises(InvalidTask, match=rf"concurrency_limit={limit!r} must be a whole "
                                          "number from 1"):
        task(concurrency_limit=limit)(ct.conc_single.func)


@pytest.mark.parametrize("key", ["", 42, b"k", "x" * 256])
def test_a_bad_key_is_refused_where_it_is_declared(key):
    with pytest.raises(InvalidTask, match=r"concurrency_key=.* must be a non-empty string"):
        task(concurrency_limit=1, concurrency_key=key)(ct.conc_single.func)


def test_a_key_without_a_limit_is_refused():
    with pytest.raises(InvalidTask, match="without concurrency_limit; give both"):
        task(concurrency_key="k")(ct.conc_single.func)


@pytest_db
def test_a_bad_key_given_at_the_call_is_refused_and_nothing_is_written():
    with pytest.raises(InvalidTask, match=r"concurrency_key=7 must be a non-empty string"):
        ct.conc_account.using(concurrency_key=7).enqueue(1, 1)
    with pytest.raises(InvalidTask, match="without concurrency_limit"):
        tasks.add.using(concurrency_key="k").enqueue(1, 1)
    assert not TaskRecord.objects.exists() and not ConcurrencySlot.objects.exists()


@pytest_db
def test_a_key_function_that_fails_or_returns_no_string_names_the_call():
    bad = ct.conc_account.using()
    object.__setattr__(bad, "concurrency_key", lambda account, n, **kw: account)
    with pytest.raises(InvalidTaskArguments, match=r"returned 7 for call 1; it must return a "
                                                   "non-empty string.*Nothing was enqueued"):
        bad.enqueue_many([(("a", 1), {}), ((7, 2), {})])
    with pytest.raises(InvalidTaskArguments, match=r"raised TypeError.*call 0"):
        ct.conc_account.enqueue()
    assert not TaskRecord.objects.exists() and not ConcurrencySlot.objects.exists()


@pytest_db
def test_a_key_with_a_nul_character_is_refused_by_name_on_every_database():
    bad = ct.conc_account.using()
    object.__setattr__(bad, "concurrency_key", lambda account, n, **kw: f"a\x00{account}")
    with pytest.raises(InvalidTaskArguments, match=r"returned 'a\\x00x' for call 0.*without "
                                                   "NUL.*Nothing was enqueued"):
        bad.enqueue_many([(("x", 1), {}), (("y", 2), {})])
    with pytest.raises(InvalidTask, match=r"concurrency_key='k\\x00' must be .*without NUL"):
        ct.conc_account.using(concurrency_key="k\x00").enqueue(1, 1)
    assert not TaskRecord.objects.exists() and not ConcurrencySlot.objects.exists()


# ----- two supervisors ----------------------------------------------------------------------


@pytest.mark.processes
def test_200_tasks_over_5_keys_with_limit_2_under_two_supervisors(runworkers):
    from django_dbworker.models import Supervisor

    env = {"DBWORKER_TEST_CONCURRENCY": "1"}
    supervisors = [runworkers("--concurrency", "4", extra_env=env) for _ in range(2)]
    wait_for(lambda: Supervisor.objects.count() == 2, timeout=60,
             what="both supervisors to start")  # so that both take part
    results = ct.conc_account.enqueue_many(
        [((i % 5, i), {"sleep": 0.03}) for i in range(200)])
    ids = [r.id for r in results]
    done = TaskRecord.objects.filter(pk__in=ids, status=TaskStatus.SUCCESSFUL)
    wait_for(lambda: done.count() == 200, timeout=120, what="all 200 tasks to finish")
    spans: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for value in TaskRecord.objects.filter(pk__in=ids).values_list("return_value", flat=True):
        spans[value["account"]].append((value["start"], value["end"]))
    claimed_by = {worker for worker_ids in TaskRecord.objects.filter(pk__in=ids)
                  .values_list("worker_ids", flat=True) for worker in worker_ids}
    for account, runs in spans.items():
        events = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs],
                        key=lambda ev: (ev[0], ev[1]))  # an end before a start at a tie
        running = most = 0
        for _, step in events:
            running += step
            most = max(most, running)
        assert most <= 2, f"account {account}: {most} ran at once"
    assert len(spans) == 5 and sum(len(r) for r in spans.values()) == 200
    assert len(claimed_by) == 2, f"both supervisors claimed: {claimed_by}"
    for p in supervisors:
        assert "Traceback" not in p.output(), p.output()


# ----- plans --------------------------------------------------------------------------------


@pytest_db
def test_the_keyed_claim_walks_the_claim_index_and_counts_through_the_keyed_index(vendor):
    """The candidates in the claim index's order (no sort of what waits); the RUNNING
    tasks of the keys counted through ``dbworker_task_keyed_running``."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ct.conc_account.enqueue_many([((i % 40, i), {}) for i in range(3000)])
    ct.conc_account.using(priority=7).enqueue_many([((i % 4, i), {}) for i in range(100)])
    claim(4)  # some RUNNING, so that the count has rows to find
    analyze = "ANALYZE TABLE" if vendor == "mysql" else "ANALYZE"
    with connection.cursor() as cursor:
        cursor.execute(f"{analyze} {TaskRecord._meta.db_table}")
        if vendor == "mysql":
            cursor.fetchall()
    with CaptureQueriesContext(connection) as captured:
        claimed = claim(8)
    assert [c.row(connection.alias).priority for c in claimed] == [7] * 4 + [0] * 4, \
        "two of account-0 and account-1 run: two of each other key of priority 7, then 0"
    # On PostgreSQL the first statement goes with the transaction's BEGIN (one query)
    sqls = [re.sub(r"^BEGIN[^;]*; ", "", q["sql"]) for q in captured.captured_queries]
    candidates = next(s for s in sqls if "ORDER BY" in s and "concurrency_limit" in s)
    counts_sql = [s for s in sqls if "COUNT(" in s.upper()]
    assert counts_sql, sqls
    with connection.cursor() as cursor:
        # The count may read either index of the RUNNING tasks (both hold those only:
        # its cost follows what runs); the planner takes one or the other by statistics.
        for sql, indexes, sorted_ok in (
                (candidates, ("dbworker_task_claimable_any",), False),
                (counts_sql[0], ("dbworker_task_keyed_running", "dbworker_task_running"),
                 True)):
            if vendor == "postgresql":
                cursor.execute(f"EXPLAIN {sql}")
                plan = "\n".join(row[0] for row in cursor.fetchall())
                assert any(f"{index} " in plan for index in indexes), plan
                assert sorted_ok or "Sort" not in plan, plan
            elif vendor == "mysql":
                cursor.execute(f"EXPLAIN {sql}")
                names = [c[0].lower() for c in cursor.description]
                rows = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
                assert rows[0]["key"] in indexes, rows
                assert sorted_ok or "filesort" not in (rows[0]["extra"] or ""), rows
            else:
                cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
                plan = "\n".join(row[-1] for row in cursor.fetchall())
                assert any(f"INDEX {index}" in plan for index in indexes), plan
                assert sorted_ok or "TEMP B-TREE" not in plan, plan


@pytest_db
def test_a_keyed_claim_round_is_four_statements_and_five_on_mysql(vendor):
    """Candidates, slots, counts and the claim; the claim does not read again the ids the
    transaction holds (``Claim.ids``): one UPDATE ... RETURNING, and on MySQL the UPDATE
    and the SELECT of what it returns; the next round (compiled SQL, reused) as many."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    ct.conc_account.enqueue_many([((i % 5, i), {}) for i in range(40)])
    tables = (TaskRecord._meta.db_table, ConcurrencySlot._meta.db_table)
    rounds = []
    for _ in range(2):
        with CaptureQueriesContext(connection) as captured:
            claimed = claim(10)
        assert counts(claimed) == {f"account-{a}": 2 for a in range(5)}
        rounds.append([q["sql"] for q in captured.captured_queries
                       if any(t in q["sql"] for t in tables)])
        taskstore.succeed_many([(c, None, timezone.now()) for c in claimed])
    first, second = rounds
    assert len(first) == (5 if vendor == "mysql" else 4), first
    quote = connection.ops.quote_name
    again = f"SELECT {quote('id')} FROM {quote(TaskRecord._meta.db_table)} WHERE"
    assert not any(s.startswith(again) for s in first), first
    assert len(second) == len(first), second


@pytest_db
def test_compiled_slot_and_count_statements_serve_any_keys_of_their_number():
    """``_by_keys``: one compiled statement per kind and number of keys, the keys its
    only parameters; a query with other parameters is compiled at every call."""
    seen = []

    def build(keys):
        seen.append(keys)
        return ConcurrencySlot.objects.filter(key__in=keys).order_by("key").values_list("key")

    from django.db import connection

    ConcurrencySlot.objects.bulk_create([ConcurrencySlot(key=k) for k in "abcd"])
    using = connection.alias
    assert slots.by_keys(using, "test-slots", ["a", "b"], build) == [("a",), ("b",)]
    assert slots.by_keys(using, "test-slots", ["c", "d"], build) == [("c",), ("d",)]
    assert len(seen) == 1, "compiled once for two keys"
    assert slots.by_keys(using, "test-slots", ["a", "b", "x"], build) == [
        ("a",), ("b",)]
    assert len(seen) == 2, "and once for three"

    def other(keys):
        return ConcurrencySlot.objects.filter(key__in=keys).exclude(key="b").values_list("key")

    for keys in (["a", "b"], ["c", "x"]):
        assert slots.by_keys(using, "test-other", keys, other) == [
            (k,) for k in keys if k not in ("b", "x")]


# ----- row workers --------------------------------------------------------------------------


# ----- row workers --------------------------------------------------------------------------


@pytest.fixture
def row_worker():
    from django_dbworker import Finished
    from django_dbworker.rows.registry import worker, workers
    from django_dbworker.rows.sweep import Sweeper

    def conc_rows_inline(item):
        return Finished()

    made = worker(conc_rows_inline, source=Item, eligible=Item.objects.filter(kind="conc_rows"),
                  concurrency_limit=2, concurrency_key="action")

    def add(actions: list[str]) -> None:
        Item.objects.bulk_create([Item(kind="conc_rows", action=a) for a in actions])
        Sweeper(made, 5000).sweep_all()

    made.add = add  # type: ignore[attr-defined]
    yield made
    workers.remove("conc_rows_inline")


def row_keys(claims) -> dict[str, int]:
    from collections import Counter

    actions = dict(Item.objects.values_list("pk", "action"))
    return dict(Counter(actions[int(c.source_key)] for c in claims))


@pytest_db
def test_a_row_workers_key_never_works_more_than_its_limit(row_worker):
    from django_dbworker import Finished
    from django_dbworker.rows import planner
    from django_dbworker.rows import store as rowstore

    row_worker.add(["a"] * 60 + ["b"] * 3 + ["c"] * 3)  # "a" first in eligible's order
    first = planner.claim(row_worker, 10, Claimant(), 30)
    assert row_keys(first) == {"a": 2, "b": 2, "c": 2}, "a full key blocks no other"
    assert planner.claim(row_worker, 10, Claimant(), 30) == []
    assert rowstore.complete(first[0], Finished()) == 1
    (again,) = planner.claim(row_worker, 10, Claimant(), 30)
    assert row_keys([again]) == row_keys([first[0]])
    rowstore.unclaim([again])
    (given_back,) = planner.claim(row_worker, 10, Claimant(), 30)
    rowstore.release(given_back, crashed=FailureInfo("x.Boom", "died"), max_crashes=3)
    assert len(planner.claim(row_worker, 10, Claimant(), 30)) == 1, "released: its place too"


@pytest_db
def test_a_row_worker_without_a_key_field_has_one_key():
    from django_dbworker import Finished
    from django_dbworker.rows import planner
    from django_dbworker.rows.registry import worker, workers
    from django_dbworker.rows.sweep import Sweeper

    def conc_rows_one(item):
        return Finished()

    made = worker(conc_rows_one, source=Item, eligible=Item.objects.filter(kind="conc_rows"),
                  concurrency_limit=3)
    try:
        Item.objects.bulk_create([Item(kind="conc_rows", action=str(i)) for i in range(5)])
        Sweeper(made, 5000).sweep_all()
        assert len(planner.claim(made, 2, Claimant(), 30)) == 2
        assert len(planner.claim(made, 5, Claimant(), 30)) == 1
        assert planner.claim(made, 5, Claimant(), 30) == []
    finally:
        workers.remove("conc_rows_one")


@pytest.mark.parametrize(("options", "message"), [
    ({"concurrency_limit": 0}, r"concurrency_limit=0 must be a whole number from 1"),
    ({"concurrency_limit": -2}, r"concurrency_limit=-2 must be a whole number from 1"),
    ({"concurrency_limit": 1, "concurrency_key": "nope"},
     r"concurrency_key='nope' must name a field of testapp.Item \(one of action, "),
    ({"concurrency_limit": 1, "concurrency_key": 3}, r"concurrency_key=3 must name a field"),
    ({"concurrency_key": "action"}, r"without concurrency_limit; give both"),
])
def test_bad_row_worker_concurrency_options_are_refused_at_declaration(options, message):
    from django_dbworker.exceptions import InvalidWorker
    from django_dbworker.rows.registry import worker, workers

    def conc_rows_bad(item):
        return None

    with pytest.raises(InvalidWorker, match=message):
        worker(conc_rows_bad, source=Item, **options)
    assert "conc_rows_bad" not in workers


@pytest.mark.processes
def test_row_units_over_5_keys_with_limit_2_under_two_supervisors(runworkers):
    from django_dbworker.models import Supervisor
    from tests.testapp.models import Effect

    env = {"DBWORKER_TEST_CONCURRENCY": "1"}
    supervisors = [runworkers("--concurrency", "4", extra_env=env) for _ in range(2)]
    wait_for(lambda: Supervisor.objects.count() == 2, timeout=60,
             what="both supervisors to start")
    Item.objects.bulk_create([Item(kind="conc_rows", action=f"k{i % 5}") for i in range(100)])
    done = Effect.objects.filter(worker="conc_rows")
    wait_for(lambda: done.count() >= 100, timeout=120, what="all 100 rows to be worked")
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for note in done.values_list("note", flat=True):
        action, start, end = note.split()
        spans[action].append((float(start), float(end)))
    for action, runs in spans.items():
        events = sorted([(s, 1) for s, _ in runs] + [(e, -1) for _, e in runs])
        running = most = 0
        for _, step in events:
            running += step
            most = max(most, running)
        assert most <= 2, f"key {action}: {most} worked at once"
    assert done.count() == 100 and len(spans) == 5
    assert len(set(done.values_list("pid", flat=True))) > 1, "children of both supervisors"
    for p in supervisors:
        assert "Traceback" not in p.output(), p.output()
