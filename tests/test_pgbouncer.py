"""Real ``runworkers`` processes behind a real PgBouncer in transaction pooling mode.

A private ``pgbouncer`` (``tests/pgbouncer.py``) listens on a free port in front of the test
server; the supervisors and their children connect through it (``PGPORT`` of their
settings), while the test itself reads and writes the database directly. The process and
fault tests imported below run here again, unchanged, through it: claims of two
supervisors at once, fencing of a paused supervisor, transactional handlers, kill -9 of a
child and of a supervisor, retries, timeouts, cancellation, rate limits, cron; the tests
written here add lost server connections.
They run with the settings docs/operations.md advises behind such a pooler
(``DBWORKER_TEST_POOLER_SETTINGS``: ``NOTIFY`` and ``PREPARED_STATEMENTS`` off, Django's
``DISABLE_SERVER_SIDE_CURSORS``); the tests written here also try the defaults, and the
pooler's detection and system check.

PostgreSQL only. Without ``pgbouncer`` installed they are skipped with a banner (a failure
under CI=true); ``scripts/test`` installs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from django.db import connection

from django_dbworker.db.postgresql import PostgreSQL
from django_dbworker.models import Failure, State, TaskRecord, TaskStatus
from tests.conftest import ROOT, wait_for
from tests.pgbouncer import POOL_SIZE, PgBouncer, require
from tests.test_faults import (  # noqa: F401  (collected here again, through PgBouncer)
    row_effects_exactly_once,
    rows_settled,
    settled,
    stop,
    terminate_other_backends,
    test_stale_task_copy_cannot_record_after_its_rerun,
)
from tests.test_processes import (  # noqa: F401
    ONE_CHILD,
    effects,
    has_state,
    test_killed_child_is_released_at_once_and_rerun,
    test_killed_supervisor_leases_expire_and_another_takes_over,
    test_paused_supervisor_loses_its_lease_and_cannot_commit,
)
from tests.test_task_processes import (  # noqa: F401
    status_of,
    test_cancel_a_running_task,
    test_cron_ticks_once_across_two_supervisors,
    test_rate_limit_across_two_supervisors,
    test_tasks_and_rows_in_one_burst_with_retries,
    test_timeout_stops_the_process_and_retries,
)
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.processes


@pytest.fixture(scope="module")
def pgbouncer():
    if os.environ.get("DBWORKER_TEST_DB", "sqlite") != "postgres":
        pytest.skip("PgBouncer is PostgreSQL's pooler (DBWORKER_TEST_DB=postgres)")
    bouncer = PgBouncer(require()).start()
    yield bouncer
    bouncer.remove()


@pytest.fixture
def runworkers(runworkers, pgbouncer):
    """``runworkers`` (tests/conftest.py) connecting through PgBouncer, with the settings
    advised behind it unless ``extra_env`` says otherwise."""

    def start(*args, extra_env=None, **kwargs):
        env = {"PGHOST": pgbouncer.host, "PGPORT": str(pgbouncer.port),
               "DBWORKER_TEST_POOLER_SETTINGS": "1", **(extra_env or {})}
        return runworkers(*args, extra_env=env, **kwargs)

    return start



def through(bouncer: PgBouncer, **options):
    """A psycopg connection to the test database through ``bouncer``."""
    import psycopg

    return psycopg.connect(host=bouncer.host, port=bouncer.port, user=bouncer.server[2],
                           dbname=connection.settings_dict["NAME"], **options)


def test_the_processes_really_go_through_pgbouncer_in_transaction_mode(runworkers,
                                                                       pgbouncer):
    """The tests above cannot pass by talking to PostgreSQL directly: the supervisor's
    transactions are counted by PgBouncer, whose pool for the test database is in
    transaction mode."""
    name = connection.settings_dict["NAME"]

    def transactions() -> int:
        stats = {row["database"]: row for row in pgbouncer.admin("SHOW STATS")}
        return int(stats[name]["total_xact_count"]) if name in stats else 0

    before = transactions()
    items = [Item.objects.create() for _ in range(5)]
    rw = runworkers("--worker", "touch", "--burst")
    assert rw.wait(60) == 0, rw.output()
    assert all(len(effects(i)) == 1 for i in items)
    assert transactions() >= before + 5
    [pool] = [p for p in pgbouncer.admin("SHOW POOLS") if p["database"] == name]
    assert pool["pool_mode"] == "transaction"


def every_server_connection(bouncer: PgBouncer, sql: str) -> list[object]:
    """``sql``'s answer on every server connection of the test database's pool: as many
    clients as the pool may have servers, each holding a transaction open (which pins a
    server connection to it) while it asks."""
    clients = [through(bouncer) for _ in range(POOL_SIZE)]
    try:
        return [client.execute(sql).fetchone()[0] for client in clients]
    finally:
        for client in clients:
            client.close()


def test_no_session_setting_is_left_on_the_pools_server_connections(runworkers, pgbouncer):
    """The renewer bounds its lock waits with ``lock_timeout``. Set for the session, it
    stayed on whichever server connection ran the SET, for the next client of the pool (a
    handler waiting for a row lock then failed after a second), and the renewer's own
    statements ran without it. Now it is set for each of its transactions."""
    item = Item.objects.create(action="sleep_first:2")
    rw = runworkers(*ONE_CHILD, lease=1.5)  # a renewal round every 0.5 s
    wait_for(lambda: has_state(item, State.FINISHED), timeout=30, what="the unit")
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
    assert "renewal" not in rw.output(), rw.output()
    assert every_server_connection(pgbouncer, "SHOW lock_timeout") == ["0"] * POOL_SIZE


# ----- detection (django_dbworker/db/pooler.py) and check W005 -----------------------------


def wrapper(port: int):
    """A Django connection to the test database on ``port`` (nothing opened yet)."""
    from django.db.backends.postgresql.base import DatabaseWrapper

    return DatabaseWrapper({**connection.settings_dict, "PORT": str(port)}, alias="probe")


def test_a_transaction_pooler_is_detected_and_a_direct_connection_is_not(pgbouncer):
    engine = PostgreSQL()
    assert engine.transaction_pooled(wrapper(pgbouncer.port)) is True
    assert engine.transaction_pooled(wrapper(int(connection.settings_dict["PORT"]))) is False


def test_a_session_pooler_is_not_taken_for_a_transaction_pooler(pgbouncer):
    """Its limit: a session pooler is a pooler (its key is not the backend's), but it pins
    one backend to each client: unknown, and nothing changes."""
    session = PgBouncer(require(), pool_mode="session").start()
    try:
        assert PostgreSQL().transaction_pooled(wrapper(session.port)) is None
    finally:
        session.remove()


def check(tmp_path, port: int, pooler_settings: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PGHOST": "127.0.0.1", "PGPORT": str(port), "PYTHONPATH": str(ROOT),
           "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
           "DBWORKER_TEST_POOLER_SETTINGS": "1" if pooler_settings else ""}
    return subprocess.run(
        [sys.executable, "-m", "django", "check", "--database", "default",
         "--settings=tests.settings"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=60)


def test_check_w005_warns_behind_a_transaction_pooler_with_session_settings(pgbouncer,
                                                                            transactional_db,
                                                                            tmp_path):
    behind = check(tmp_path, pgbouncer.port, pooler_settings=False)
    assert behind.returncode == 0, behind.stderr  # a warning: check still passes
    out = behind.stdout + behind.stderr
    assert "django_dbworker.W005" in out, out
    for key in ("DBWORKER['NOTIFY'] = False", "DBWORKER['PREPARED_STATEMENTS'] = False",
                "DATABASES['default']['DISABLE_SERVER_SIDE_CURSORS'] = True"):
        assert key in out, out
    advised = check(tmp_path, pgbouncer.port, pooler_settings=True)
    assert "W005" not in advised.stdout + advised.stderr, advised.stderr
    # (directly: test_check_w005_is_silent_on_a_direct_connection_on_every_database)


def test_check_w005_is_silent_when_the_database_cannot_be_reached(pgbouncer,
                                                                  transactional_db, tmp_path):
    from tests.pgbouncer import free_port

    gone = check(tmp_path, free_port(), pooler_settings=False)
    assert "W005" not in gone.stdout + gone.stderr
    assert "Traceback" not in gone.stderr, gone.stderr


# ----- the defaults behind PgBouncer -------------------------------------------------------


def test_with_the_defaults_runworkers_neither_listens_nor_prepares_behind_it(runworkers,
                                                                            pgbouncer):
    """NOTIFY and PREPARED_STATEMENTS left on: runworkers finds the pooler at start-up and
    does without both (a LISTEN would stay on a server connection of the pool, and every
    client given it next would collect our notifications; a prepared statement would be
    missing from the next transaction's server connection). Every unit runs once."""
    items = [Item.objects.create() for _ in range(30)]
    added = tasks.add.enqueue_many([((i, 1), {}) for i in range(30)])
    rw = runworkers("--concurrency", "2", extra_env={"DBWORKER_TEST_POOLER_SETTINGS": ""})
    wait_for(lambda: Effect.objects.filter(worker="touch").count() >= 30
             and all(status_of(r.id) == TaskStatus.SUCCESSFUL for r in added), timeout=60,
             what="every row and task")
    later = Item.objects.create()  # found by polling (POLL_INTERVAL 0.1 s here)
    wait_for(lambda: len(effects(later)) == 1, timeout=10, what="a row saved later")
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
    out = rw.output()
    assert "transaction_pooler" in out and "listen=off" in out, out
    assert "prepared on this database connection is gone" not in out, out
    assert all(len(effects(i)) == 1 for i in items)
    assert every_server_connection(
        pgbouncer, "SELECT count(*) FROM pg_listening_channels()") == [0] * POOL_SIZE
    assert every_server_connection(
        pgbouncer, "SELECT count(*) FROM pg_prepared_statements") == [0] * POOL_SIZE


def test_lost_server_connections_lose_and_repeat_nothing(runworkers):
    """``pg_terminate_backend`` of every server connection PgBouncer holds, twice, while
    rows and tasks run: a client whose server connection died mid-transaction is
    disconnected by PgBouncer and reconnects; every row commits once, every task succeeds.
    (A smaller cousin of test_faults' connection loss test, which takes a minute.)"""
    Item.objects.bulk_create(Item(action="sleep:0.02") for _ in range(60))
    items = list(Item.objects.all())
    results = tasks.chaos_effect.enqueue_many([((i, 0.02), {}) for i in range(20)])
    rw = runworkers("--concurrency", "2")
    wait_for(lambda: Effect.objects.count() > 20, what="work to be under way")
    terminated = 0
    for _ in range(2):
        terminated += terminate_other_backends()
        done = Effect.objects.count()
        wait_for(lambda done=done: Effect.objects.count() > done + 10, timeout=30,
                 what="work to go on after the connections were lost")
    wait_for(lambda: rows_settled(items) and settled(results), timeout=60,
             what="every unit to be done after the connection losses")
    assert terminated > 0
    assert not Failure.objects.exists(), list(Failure.objects.values("message"))[:3]
    row_effects_exactly_once(items)
    assert TaskRecord.objects.exclude(status=TaskStatus.SUCCESSFUL).count() == 0
    stop(rw)


def test_check_w005_is_silent_on_a_direct_connection_on_every_database(db):
    """Without a pooler (the test database, directly; SQLite and MariaDB have none to
    detect) W005 says nothing, and without ``--database`` it asks nothing."""
    from django_dbworker.checks import check_pooler

    assert check_pooler(databases=["default"]) == []
    assert check_pooler(databases=None) == []
