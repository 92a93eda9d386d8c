"""Real ``runworkers`` processes, real signals, against the test database (SQLite,
PostgreSQL or MariaDB).

Each test starts supervisors with the ``runworkers`` fixture and waits on conditions it polls
in the database (``wait_for``), never on fixed sleeps. Handlers are driven by ``Item.action``
(see ``tests/testapp/workers.py``); every committed run of ``touch`` writes one ``Effect``
row in the handler's transaction, so "exactly one Effect" means "committed exactly once".
"""

from __future__ import annotations

import os
import signal
import sqlite3
import time

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from django_dbworker.models import Execution, Failure, State
from django_dbworker.supervisor.supervisor import CHILD_DIED
from tests.conftest import wait_for
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes

ONE_CHILD = ("--worker", "touch", "--concurrency", "1")


def execution(item: Item, worker: str = "touch") -> Execution:
    return Execution.objects.get(worker=worker, source_id=str(item.pk))


def effects(item: Item) -> list[Effect]:
    return list(Effect.objects.filter(item_id=item.pk, worker="touch"))


def handler_in_transaction() -> bool:
    """True while some process holds an open write transaction: a handler mid-run.

    The handlers write their Effect first, then sleep, so this says the handler is running
    and has written something that must not survive if its process dies or loses its lease.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state = 'idle in transaction' "
                "AND backend_xid IS NOT NULL"
            )
            return cursor.fetchone()[0] > 0
    if connection.vendor == "mysql":
        # MariaDB serves INNODB_TRX from a cache it refreshes only when the last read is
        # 100 ms old: polled every 50 ms (wait_for), it would show the first, empty answer
        # for ever.
        time.sleep(0.15)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.INNODB_TRX t "
                "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
                "WHERE p.DB = DATABASE() AND p.ID <> CONNECTION_ID() "
                "AND p.COMMAND = 'Sleep' AND t.trx_rows_modified > 0")
            return cursor.fetchone()[0] > 0
    probe = sqlite3.connect(connection.settings_dict["NAME"], timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
    except sqlite3.OperationalError:  # "database is locked": a writer holds the lock
        return True
    finally:
        if probe.in_transaction:
            probe.execute("ROLLBACK")
        probe.close()
    return False


def running(item: Item) -> bool:
    return execution(item).state == State.WORKING and handler_in_transaction()


def has_state(item: Item, state: str) -> bool:
    return execution(item).state == state


def test_supervisors_share_rows_and_run_each_exactly_once(runworkers):
    Item.objects.bulk_create(Item() for _ in range(2000))  # no post_save: the sweep finds them
    supervisors = [
        runworkers("--worker", "touch", "--concurrency", "2", "--burst") for _ in range(3)
    ]
    for rw in supervisors:
        assert rw.wait(120) == 0, rw.output()

    units = Execution.objects.filter(worker="touch")
    assert units.count() == 2000
    assert set(units.values_list("state", flat=True)) == {State.FINISHED}
    # One attempt each, but a unit whose transaction the database rolled back (MariaDB's
    # deadlock 1213 between a child's completion and another supervisor's renewal or
    # claim) goes back and runs again: one more attempt, still one effect.
    given_back = sum(rw.output().count("child_database_error") for rw in supervisors)
    assert units.filter(attempts=1).count() >= 2000 - given_back
    assert not units.filter(attempts__gt=2).exists()
    if connection.vendor != "mysql":
        assert given_back == 0
    assert Effect.objects.filter(worker="touch").count() == 2000
    twice = Effect.objects.values("item_id").annotate(n=Count("id")).filter(n__gt=1)
    assert not twice.exists()
    # The work really was shared (all three usually take part; two is the safe floor).
    assert units.values("supervisor_id").distinct().count() >= 2


def test_killed_child_is_released_at_once_and_rerun(runworkers):
    item = Item.objects.create(action="sleep_first:30")
    rw = runworkers(*ONE_CHILD, lease=3600)  # the lease is no way back within the test
    wait_for(lambda: running(item), what="the handler to be running")
    [child] = rw.children()

    os.kill(child, signal.SIGKILL)
    wait_for(lambda: has_state(item, State.FINISHED), timeout=120,
             what="the re-run (released at once: the lease is an hour)")

    assert rw.process.poll() is None, rw.output()
    unit = execution(item)
    assert (unit.attempts, unit.crashes) == (2, 1)
    [effect] = effects(item)  # the killed run's Effect was rolled back
    assert effect.pid != child
    assert child not in rw.children()
    assert not Failure.objects.exists()
    assert "child_died" in rw.output()


def test_unit_that_keeps_killing_its_process_ends_failed(runworkers):
    bad = Item.objects.create(action="kill")
    good = [Item.objects.create() for _ in range(5)]
    rw = runworkers("--worker", "touch", "--concurrency", "2")

    wait_for(lambda: has_state(bad, State.FAILED), timeout=30, what="the unit to fail")
    unit = execution(bad)
    assert (unit.attempts, unit.crashes) == (3, 3)  # MAX_CRASHES
    [failure] = Failure.objects.filter(execution=unit)
    assert failure.exception_class == CHILD_DIED
    assert "died" in failure.message and "SIGKILL" in failure.message
    assert "MAX_CRASHES" in failure.message

    # Other units keep flowing, before and after; the failed unit is not offered again.
    later = [Item.objects.create() for _ in range(5)]
    wait_for(
        lambda: all(has_state(i, State.FINISHED) for i in good + later),
        what="the other units to finish",
    )
    assert all(len(effects(i)) == 1 for i in good + later)
    assert execution(bad).attempts == 3 and not effects(bad)
    assert rw.process.poll() is None, rw.output()
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()


def test_killed_supervisor_leases_expire_and_another_takes_over(runworkers):
    item = Item.objects.create(action="sleep_first:30")
    first = runworkers(*ONE_CHILD, lease=2)
    wait_for(lambda: running(item), what="the handler to be running")
    [first_child] = first.children()
    second = runworkers(*ONE_CHILD, "-v", "2", lease=2)
    wait_for(lambda: "supervisor_started" in second.output(), what="the second supervisor")

    first.signal_group(signal.SIGKILL)  # the supervisor and its children
    first.wait(10)
    wait_for(lambda: has_state(item, State.FINISHED), timeout=20, what="the takeover")

    unit = execution(item)
    assert unit.claimed_pid == second.pid
    assert (unit.attempts, unit.crashes) == (2, 1)
    [effect] = effects(item)
    assert effect.pid != first_child
    assert "reaped" in second.output()
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()


def test_paused_supervisor_loses_its_lease_and_cannot_commit(runworkers):
    if connection.vendor == "sqlite":
        pytest.skip(
            "SQLite: the paused handler holds the database's only write lock, so nobody can "
            "take its unit over while it is paused (see the SQLite test below)"
        )
    item = Item.objects.create(action="sleep_first:4")
    stale = runworkers(*ONE_CHILD, lease=1.5)
    wait_for(lambda: running(item), what="the handler to be running")
    [stale_child] = stale.children()

    stale.signal_group(signal.SIGSTOP)
    try:
        fresh = runworkers(*ONE_CHILD, lease=1.5)
        wait_for(lambda: has_state(item, State.FINISHED), timeout=20, what="the takeover")
        assert execution(item).claimed_pid == fresh.pid
    finally:
        stale.signal_group(signal.SIGCONT)

    wait_for(lambda: "lease_lost" in stale.output(), timeout=15, what="the stale child's log")
    unit = execution(item)
    assert unit.state == State.FINISHED and unit.attempts == 2
    [effect] = effects(item)  # the stale child's Effect rolled back with its status
    assert effect.pid != stale_child
    for rw in (stale, fresh):
        assert rw.process.poll() is None, rw.output()
        rw.signal(signal.SIGTERM)
        assert rw.wait(30) == 0, rw.output()


def test_paused_supervisor_on_sqlite_keeps_its_unit(runworkers):
    """On SQLite a running handler holds the write lock: nobody can take over, nobody runs
    the unit twice; when the paused process resumes it commits, and the waiting reaper's
    release (fenced by the old token) changes nothing."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite's single write lock only")
    item = Item.objects.create(action="sleep_first:2")
    paused = runworkers(*ONE_CHILD, lease=1)
    wait_for(lambda: running(item), what="the handler to be running")
    [paused_child] = paused.children()

    paused.signal_group(signal.SIGSTOP)
    try:
        other = runworkers(*ONE_CHILD, "-v", "2", lease=1)
        wait_for(lambda: "supervisor_started" in other.output(), what="the other supervisor")
        deadline = time.monotonic() + 2  # well past the lease
        wait_for(lambda: time.monotonic() > deadline or not has_state(item, State.WORKING))
        assert has_state(item, State.WORKING)
    finally:
        paused.signal_group(signal.SIGCONT)

    wait_for(lambda: has_state(item, State.FINISHED), timeout=20, what="the resumed handler")
    unit = execution(item)
    assert (unit.attempts, unit.claimed_pid) == (1, paused.pid)
    [effect] = effects(item)
    assert effect.pid == paused_child
    for rw in (paused, other):
        rw.signal(signal.SIGTERM)
        assert rw.wait(30) == 0, rw.output()


def test_sigterm_lets_the_running_handler_finish_and_claims_nothing(runworkers):
    slow = Item.objects.create(action="sleep:3")
    rest = [Item.objects.create() for _ in range(3)]
    rw = runworkers(*ONE_CHILD)
    wait_for(lambda: running(slow), what="the handler to be running")

    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
    assert has_state(slow, State.FINISHED)
    assert len(effects(slow)) == 1
    assert all(has_state(i, State.PENDING) and not effects(i) for i in rest)


def test_second_signal_cuts_off_and_releases_the_unit(runworkers):
    item = Item.objects.create(action="sleep_first:30")
    rw = runworkers(*ONE_CHILD)
    wait_for(lambda: running(item), what="the handler to be running")

    rw.signal(signal.SIGTERM)
    wait_for(lambda: "stopping" in rw.output(), what="the first signal to be taken")
    rw.signal(signal.SIGTERM)
    assert rw.wait(60) > 0, rw.output()  # it exits by itself, with an error status
    assert "cut_off" in rw.output()

    unit = execution(item)
    assert unit.state == State.UNFINISHED
    assert unit.crashes == 0 and unit.token is None and unit.lease_expires_at is None
    assert unit.available_at <= timezone.now()
    assert not effects(item) and not Failure.objects.exists()
    # Claimable again: a burst run picks it up (a re-run finishes at once).
    again = runworkers("--worker", "touch", "--burst")
    assert again.wait(30) == 0, again.output()
    assert has_state(item, State.FINISHED) and len(effects(item)) == 1


def test_worker_option_limits_the_workers_run(runworkers):
    touch = [Item.objects.create() for _ in range(3)]
    ranked = [Item.objects.create(kind="ranked", rank=i) for i in range(3)]
    rw = runworkers("--worker", "ranked", "--burst")
    assert rw.wait(30) == 0, rw.output()
    assert {execution(i, "ranked").state for i in ranked} == {State.FINISHED}
    assert Effect.objects.filter(worker="ranked").count() == 3
    assert {execution(i).state for i in touch} == {State.PENDING}
    assert not Effect.objects.exclude(worker="ranked").exists()


def test_unknown_worker_name_is_an_error_naming_it(runworkers):
    item = Item.objects.create()
    rw = runworkers("--worker", "touch", "--worker", "no_such_worker")
    assert rw.wait(30) != 0
    assert "No worker named 'no_such_worker'" in rw.output()
    assert execution(item).state == State.PENDING and not effects(item)


def test_max_tasks_per_child_replaces_children_without_losing_units(runworkers):
    items = [Item.objects.create() for _ in range(8)]
    rw = runworkers(*ONE_CHILD, "--max-tasks-per-child", "2", "--burst")
    assert rw.wait(30) == 0, rw.output()
    units = [execution(i) for i in items]
    assert {u.state for u in units} == {State.FINISHED}
    assert {(u.attempts, u.crashes) for u in units} == {(1, 0)}
    assert all(len(effects(i)) == 1 for i in items)
    assert Effect.objects.values("pid").distinct().count() == 4
    assert "child_died" not in rw.output()


def test_burst_exits_zero_when_nothing_is_claimable(runworkers):
    Item.objects.create(action="wait", enabled=False)  # not eligible: nothing to claim
    rw = runworkers("--burst")
    assert rw.wait(30) == 0, rw.output()
    assert not Effect.objects.exists()


@pytest.mark.processes
def test_runworkers_says_at_start_what_it_serves(runworkers):
    """At the default verbosity a person sees which workers, queues and database a
    supervisor serves, before any unit runs (it printed nothing until the first count)."""
    from django.db import connection

    p = runworkers("--burst", "--concurrency", "1", "--worker", "touch")
    assert p.wait() == 0, p.output()
    first = p.output().splitlines()[0]
    assert first.startswith("runworkers: 1 child process(es) on database 'default' "
                            f"({connection.vendor}); workers: touch; task queues: none"), first
    assert "(--burst: stops when nothing is left)" in first
