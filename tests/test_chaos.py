"""The chaos soak (issue 7, scenario 1): supervisors and children killed at random while rows
and tasks flow; at the end nothing is lost, nothing is committed twice, nothing is stuck.

Reduced size by default (2,000 units, about 30-60 s). Full size, from the repository root:

    DBWORKER_SOAK_UNITS=20000 DBWORKER_SOAK_SECONDS=120 DBWORKER_TEST_DB=postgres \\
        .venv/bin/pytest tests/test_chaos.py -q -s

Half the units are source rows of the transactional ``touch`` worker, which writes one
``Effect`` in its transaction: exactly one Effect per row proves "committed exactly once".
The other half are ``chaos_effect`` tasks; tasks run at least once (they are not wrapped in
a transaction with their status), so their Effects are counted against their attempts.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import threading
import time

import pytest
from django.db import connection
from django.db.models import Count
from django.utils import timezone

from django_dbworker import conf, workers
from django_dbworker.models import Execution, Failure, State, TaskRecord, TaskStatus
from django_dbworker.models import Supervisor as SupervisorRow
from django_dbworker.rows.sweep import Sweeper
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

UNITS = int(os.environ.get("DBWORKER_SOAK_UNITS", "2000"))
#: Seconds the killer keeps killing (it also stops once nearly everything is done).
KILL_SECONDS = float(os.environ.get("DBWORKER_SOAK_SECONDS", "20"))

# Longer than pyproject's 180 s at full size (10 units/s on a busy machine): being stuck is
# what _wait_until_done reports.
pytestmark = [pytest.mark.processes, pytest.mark.timeout(120 + KILL_SECONDS + UNITS / 10)]
SUPERVISORS, CHILDREN, LEASE = 3, 2, 3
#: Seconds without any unit done after the kills that count as stuck.
STALL = 60
#: Random kills may hit one unit several times; MAX_CRASHES must not fail it.
CHAOS_ENV = {"DBWORKER_TEST_MAX_CRASHES": "50"}


def _remaining() -> int:
    rows = Execution.objects.filter(worker="touch").exclude(state=State.FINISHED).count()
    pending_rows = Item.objects.count() - Execution.objects.filter(worker="touch").count()
    return rows + pending_rows + TaskRecord.objects.exclude(status=TaskStatus.SUCCESSFUL).count()


def _wait_until_done(supervisors) -> None:
    """Until every unit is done; fail if none was done for ``STALL`` seconds (a stuck unit
    is taken back within a few leases), however slow the (shared) machine is."""
    left, progress_at = _remaining(), time.monotonic()
    while left:
        time.sleep(0.5)  # the counts read the whole tables: not every 50 ms
        now_left = _remaining()
        if now_left < left:
            left, progress_at = now_left, time.monotonic()
        elif time.monotonic() - progress_at > STALL:
            rows = (Execution.objects.filter(worker="touch").exclude(state=State.FINISHED)
                    .values_list("state", "attempts", "crashes", "lease_expires_at")[:10])
            waiting = (TaskRecord.objects.exclude(status=TaskStatus.SUCCESSFUL)
                       .values_list("status", "attempts", "crashes", "lease_expires_at")[:10])
            failures = (Failure.objects.filter(execution__worker="touch")
                        .values_list("exception_class", "message")[:5])
            raise AssertionError(
                f"no unit done for {STALL}s, {left} left: rows {list(rows)}, tasks "
                f"{list(waiting)}, failures {list(failures)}, now {timezone.now()}\n"
                + "\n".join(rw.output()[-2000:] for rw in supervisors))


def _terminator():
    """A function that terminates every other connection to the test database (on a
    connection of its own: the killer runs in a thread): PostgreSQL's
    ``pg_terminate_backend``, MariaDB's ``KILL CONNECTION``; None on SQLite."""
    if connection.vendor == "mysql":
        return _mariadb_terminator()
    if connection.vendor != "postgresql":
        return None
    import psycopg

    connection.ensure_connection()
    ours = connection.connection.info.backend_pid  # the test's own connection stays
    params = connection.get_connection_params()
    params = {k: params[k] for k in ("host", "port", "user", "password", "dbname")
              if params.get(k)}

    def terminate() -> int:
        with psycopg.connect(**params, autocommit=True) as own:
            return own.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), %s) "
                "AND backend_type = 'client backend'", (ours,)
            ).fetchone()[0]

    return terminate


def _mariadb_terminator():
    import MySQLdb

    connection.ensure_connection()
    with connection.cursor() as cursor:
        cursor.execute("SELECT CONNECTION_ID()")
        (ours,) = cursor.fetchone()
    s = connection.settings_dict

    def terminate() -> int:
        own = MySQLdb.connect(host=s["HOST"] or "127.0.0.1", port=int(s["PORT"] or 3306),
                              user=s["USER"], password=s["PASSWORD"], database=s["NAME"])
        try:
            cursor = own.cursor()
            cursor.execute("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                           "AND ID NOT IN (CONNECTION_ID(), %s)", (ours,))
            killed = 0
            for (thread,) in cursor.fetchall():
                with contextlib.suppress(MySQLdb.OperationalError):  # 1094: ended meanwhile
                    cursor.execute(f"KILL CONNECTION {int(thread)}")
                    killed += 1
            return killed
        finally:
            own.close()

    return terminate


class Killer(threading.Thread):
    """Every 1-2 s: kill -9 a random child, or a supervisor (alone or with its children)
    and start a new one in its place, or (PostgreSQL, MariaDB) terminate every connection."""

    def __init__(self, start_supervisor, supervisors, seed: int,
                 terminate=None) -> None:
        super().__init__(daemon=True)
        self.start_supervisor = start_supervisor
        self.supervisors = supervisors
        self.rng = random.Random(seed)
        self.halt = threading.Event()
        self.terminate = terminate
        self.kills = {"child": 0, "supervisor": 0, "supervisor_group": 0,
                      "connection_drops": 0}
        self.terminated = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.halt.wait(self.rng.uniform(1.0, 2.0)):
                self.strike()
        except BaseException as exc:  # reported by the test
            self.error = exc

    def strike(self) -> None:
        slot = self.rng.randrange(len(self.supervisors))
        victim = self.supervisors[slot]
        roll = self.rng.random()
        if self.terminate is not None and roll < 0.15:  # every dbworker connection dropped
            self.terminated += self.terminate()
            self.kills["connection_drops"] += 1
            return
        if roll < 0.6:
            children = victim.children()
            if children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.rng.choice(children), signal.SIGKILL)
                self.kills["child"] += 1
            return
        if roll < 0.8:  # the supervisor alone: its children die with it (PDEATHSIG)
            with contextlib.suppress(ProcessLookupError):
                os.kill(victim.pid, signal.SIGKILL)
            self.kills["supervisor"] += 1
        else:
            victim.signal_group(signal.SIGKILL)
            self.kills["supervisor_group"] += 1
        victim.process.wait(10)
        self.supervisors[slot] = self.start_supervisor()


def test_chaos_soak_exactly_one_effect_per_unit(runworkers):
    rows = UNITS // 2
    # Some handlers take 0.2 s so that kills land mid-transaction. SQLite runs one write
    # transaction at a time, so there fewer of them are slow.
    slow_pct = 5 if connection.vendor == "sqlite" else 30
    Item.objects.bulk_create(Item(action=f"sleep_pct:{slow_pct}") for _ in range(rows))
    for start in range(0, UNITS - rows, 1000):
        tasks.chaos_effect.enqueue_many(
            [((n,), {}) for n in range(start, min(start + 1000, UNITS - rows))])

    if connection.vendor == "postgresql":
        # Statistics for the tables just filled (autovacuum may be off or late, as on the
        # shared test server): without them the sweep's anti-join is planned as a nested
        # loop taking seconds per chunk at full size, in the supervisors' loops.
        Sweeper(workers["touch"], conf.get().SWEEP_BATCH).sweep_all()
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE testapp_item, django_dbworker_execution, "
                           "django_dbworker_taskrecord")

    def start_supervisor():
        # Only the units counted here: the testapp's other workers add work (after_touch
        # depends on every touched row) whose sweeps slow the supervisors' loops.
        return runworkers("--worker", "touch", "--queue", "default", "--concurrency",
                          str(CHILDREN), lease=LEASE, extra_env=CHAOS_ENV)

    supervisors = [start_supervisor() for _ in range(SUPERVISORS)]
    started = time.monotonic()
    killer = Killer(start_supervisor, supervisors, seed=int(os.environ.get("SOAK_SEED", "7")),
                    terminate=_terminator())
    killer.start()
    try:
        deadline = started + KILL_SECONDS
        while time.monotonic() < deadline and _remaining() >= UNITS // 20:
            time.sleep(0.5)
    finally:
        killer.halt.set()
        killer.join(20)
    assert killer.error is None, repr(killer.error)
    _wait_until_done(supervisors)
    elapsed = time.monotonic() - started

    executions = Execution.objects.filter(worker="touch")
    assert executions.count() == rows
    assert set(executions.values_list("state", flat=True)) == {State.FINISHED}
    per_row = dict(Effect.objects.filter(worker="touch").values_list("item_id")
                   .annotate(n=Count("id")))
    lost_rows = rows - len(per_row)
    duplicated_rows = sum(n - 1 for n in per_row.values())

    assert set(TaskRecord.objects.values_list("status", flat=True)) == {TaskStatus.SUCCESSFUL}
    per_task = dict(Effect.objects.filter(worker="chaos_task").values_list("item_id")
                    .annotate(n=Count("id")))
    attempts = dict(TaskRecord.objects.values_list("return_value", "attempts"))
    lost_tasks = (UNITS - rows) - len(per_task)
    unexplained = sum(max(0, n - attempts[k]) for k, n in per_task.items())
    reruns = sum(n - 1 for n in per_task.values())

    outputs = [rw.output() for rw in supervisors]
    crashes = sum(executions.values_list("crashes", flat=True)) + sum(
        TaskRecord.objects.values_list("crashes", flat=True))
    print(
        f"\nchaos soak ({connection.vendor}): {rows} rows + {UNITS - rows} tasks, "
        f"{SUPERVISORS} supervisors x {CHILDREN} children, lease {LEASE}s, {elapsed:.1f}s; "
        f"kills injected {sum(killer.kills.values())} {killer.kills} "
        f"({killer.terminated} connections terminated); units crashed "
        f"{crashes}; reconnects {sum(o.count('database_error') for o in outputs)}; "
        f"lost units {lost_rows + lost_tasks}; duplicated row effects {duplicated_rows}; "
        f"task re-runs after a kill {reruns}, unexplained task effects {unexplained}"
    )
    assert lost_rows == 0 and lost_tasks == 0
    assert duplicated_rows == 0
    assert unexplained == 0
    assert sum(killer.kills.values()) >= min(5, KILL_SECONDS / 2 - 1)
    assert not TaskRecord.objects.filter(status=TaskStatus.RUNNING).exists()
    # The killer may have started a supervisor a moment ago: one still importing Django has
    # no handler yet, and SIGTERM ends it the default way (-15) before it claimed anything.
    # What is checked here is the graceful stop of running supervisors: wait until each is
    # up (its heartbeat row, written once its signal handlers are in place).
    try:
        wait_for(lambda: SupervisorRow.objects.filter(
            pid__in=[rw.pid for rw in supervisors], stopped_at__isnull=True,
        ).count() == len(supervisors), timeout=30, what="every supervisor running")
    except AssertionError:
        running = set(SupervisorRow.objects.filter(stopped_at__isnull=True)
                      .values_list("pid", flat=True))
        raise AssertionError("not running:\n" + "\n".join(
            f"pid {rw.pid}, exit code {rw.process.poll()}, supervisor rows "
            f"{list(SupervisorRow.objects.filter(pid=rw.pid).values('stopped_at', 'exit_code'))}"
            f":\n{rw.output()[-3000:]}" for rw in supervisors if rw.pid not in running)
        ) from None
    for rw in supervisors:
        assert rw.process.poll() is None, rw.output()[-3000:]
        rw.signal(signal.SIGTERM)
    for rw in supervisors:
        assert rw.wait(40) == 0, rw.output()[-3000:]


@pytest.mark.skipif(connection.vendor == "sqlite", reason="SQLite has no connections to drop")
def test_supervisors_come_up_while_connections_drop(runworkers):
    """runworkers started while every connection to the database is dropped again and again
    (a database failing over, a pooler restarting) retries its start-up instead of exiting:
    once the drops stop, each one is up and stops gracefully."""
    terminate = _terminator()
    halt = threading.Event()

    def drop_connections() -> None:
        while not halt.wait(0.15):
            with contextlib.suppress(Exception):  # racing the server's own clean-up
                terminate()

    dropper = threading.Thread(target=drop_connections, daemon=True)
    dropper.start()
    try:
        supervisors = [runworkers("--worker", "touch", "--queue", "default", lease=LEASE)
                       for _ in range(3)]
        time.sleep(8)
    finally:
        halt.set()
        dropper.join(10)
    for rw in supervisors:
        assert rw.process.poll() is None, rw.output()[-3000:]
    wait_for(lambda: SupervisorRow.objects.filter(
        pid__in=[rw.pid for rw in supervisors], stopped_at__isnull=True,
    ).count() == len(supervisors), timeout=30, what="every supervisor running")
    for rw in supervisors:
        rw.signal(signal.SIGTERM)
    for rw in supervisors:
        assert rw.wait(40) == 0, rw.output()[-3000:]
