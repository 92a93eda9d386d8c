"""A PostgreSQL restart mid-run (issue 7, database connection loss).

The shared server must not be restarted, so this test starts a private cluster of its own
(``initdb`` into a temporary directory, a free port), migrates a database in it, and runs a
real ``runworkers`` against it while the server is stopped for a few seconds and started
again. Afterwards every row has committed exactly once, every task succeeded, the
supervisor and its children lived through it, and its log shows the database error and then
one ``reconnected`` line saying how long the database was gone.

The tests after it (issue 36) restart the server the ways an operator does, ``pg_ctl -m
fast`` and ``-m immediate``, while two supervisors drain rows, plain tasks and
transactional tasks (tests/restarts.py), once for a few seconds and once for longer than
the lease: no unit may be FAILED for it, nor (down for less than the lease) counted a
crash.

It runs with the PostgreSQL half of the suite (``DBWORKER_TEST_DB=postgres``) and skips,
saying why, where PostgreSQL's server programs are not installed.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import restarts
from tests.conftest import ROOT, Runworkers, wait_for

pytestmark = pytest.mark.processes

ROWS, TASKS = 200, 100
DATABASE = "dbworker_restart"
#: Seconds the server stays down between its stop and its start.
DOWN = 2.5

SEED = f"""
import django
django.setup()
from tests.testapp.models import Item
from tests.testapp.tasks import chaos_effect
Item.objects.bulk_create(Item(action="sleep:0.02") for _ in range({ROWS}))
chaos_effect.enqueue_many([((n, 0.02), {{}}) for n in range({TASKS})])
"""


def _server_programs() -> Path | None:
    """The directory of ``initdb`` and ``pg_ctl``, the newest version installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(Path(p).parent.parent.name))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A throw-away PostgreSQL cluster, run as ``postgres`` when we are root."""

    def __init__(self, programs: Path, folder: Path) -> None:
        self.programs = programs
        self.data = folder / "data"
        self.sockets = folder / "sockets"
        self.log = folder / "server.log"
        self.port = _free_port()
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # initdb refuses to run as root
            user = pwd.getpwnam("postgres")
            self.sockets.mkdir()
            for path in (folder, self.sockets):
                os.chown(path, user.pw_uid, user.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        else:
            self.sockets.mkdir()

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run([*self.as_user, str(self.programs / program), *args],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"{program} {' '.join(args)} failed:\n{done.stdout}"
                                 f"{done.stderr}\n{self.server_log()}")

    def server_log(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")[-3000:]
        return ""

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "--no-sync", "-E", "UTF8", "--locale=C")

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c full_page_writes=off -c max_connections=40")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "60", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def connect(self, dbname: str = DATABASE):
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname=dbname, autocommit=True, connect_timeout=10)


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    if os.environ.get("DBWORKER_TEST_DB") != "postgres":
        pytest.skip("runs with the PostgreSQL half of the suite (DBWORKER_TEST_DB=postgres)")
    programs = _server_programs()
    if programs is None or not (programs / "pg_ctl").exists():
        pytest.skip("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    if os.geteuid() == 0 and (shutil.which("runuser") is None or not _has_user("postgres")):
        pytest.skip("running as root, and there is no 'postgres' user to run initdb as")
    folder = Path(tempfile.mkdtemp(prefix="dbworker-pg-"))
    cluster = Cluster(programs, folder)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            cluster.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def _has_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _count(cluster: Cluster, sql: str) -> int:
    with cluster.connect() as conn:
        return conn.execute(sql).fetchone()[0]


def _all_done(cluster: Cluster) -> bool:
    try:
        finished = _count(cluster, "SELECT count(*) FROM django_dbworker_execution "
                                   "WHERE worker = 'touch' AND state = 'FINISHED'")
        successful = _count(cluster, "SELECT count(*) FROM django_dbworker_taskrecord "
                                     "WHERE status = 'SUCCESSFUL'")
    except Exception:  # the server is still starting
        return False
    return finished == ROWS and successful == TASKS


def test_postgresql_restart_mid_run_loses_and_repeats_nothing(cluster, tmp_path):
    env = {**os.environ, "DBWORKER_TEST_DB": "postgres", "PGHOST": "127.0.0.1",
           "PGPORT": str(cluster.port), "PGUSER": "postgres", "DBWORKER_TEST_DB_NAME": DATABASE,
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    with cluster.connect("postgres") as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    for command in ([sys.executable, "-m", "django", "migrate", "-v", "0"],
                    [sys.executable, "-c", SEED]):
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=180)
        assert done.returncode == 0, done.stderr[-3000:]

    rw = Runworkers(["--concurrency", "2"], env, tmp_path / "runworkers.log")
    try:
        wait_for(lambda: _count(cluster, "SELECT count(*) FROM testapp_effect") >= ROWS // 4,
                 timeout=60, what="work to be under way")
        children = sorted(rw.children())
        cluster.stop("fast")  # every connection is cut; new ones are refused
        time.sleep(DOWN)  # the outage itself
        cluster.start()
        wait_for(lambda: _all_done(cluster), timeout=90,
                 what="every unit to be done after the restart")

        log = rw.output()
        assert rw.process.poll() is None, log[-3000:]
        with cluster.connect() as conn:
            per_row = dict(conn.execute(
                "SELECT item_id, count(*) FROM testapp_effect WHERE worker = 'touch' "
                "GROUP BY item_id").fetchall())
            items = [pk for (pk,) in conn.execute("SELECT id FROM testapp_item").fetchall()]
            per_task = dict(conn.execute(
                "SELECT item_id, count(*) FROM testapp_effect WHERE worker = 'chaos_task' "
                "GROUP BY item_id").fetchall())
            attempts = dict(conn.execute(
                "SELECT (return_value #>> '{}')::int, attempts "
                "FROM django_dbworker_taskrecord").fetchall())
            failures = conn.execute("SELECT exception_class, message "
                                    "FROM django_dbworker_failure LIMIT 3").fetchall()
        assert not failures, failures
        lost = [pk for pk in items if pk not in per_row]
        twice = {pk: n for pk, n in per_row.items() if n != 1}
        assert len(items) == ROWS and not lost and not twice, (lost[:10], twice)
        # Tasks run at least once (not in a transaction with their status): every task
        # succeeded once, with no more Effects than attempts.
        assert set(attempts) == set(per_task) == set(range(TASKS))
        assert all(per_task[n] <= attempts[n] for n in per_task)

        # The supervisor backed off and reconnected; its children lived through it.
        # The supervisor's own lines (not its children's child_database_error).
        errors = len(re.findall(r"(?<!\w)database_error\b", log))
        assert errors >= 1, log[-3000:]
        assert errors <= 20, f"{errors} database_error lines: a crash loop?\n{log[-3000:]}"
        reconnected = re.findall(r"reconnected down_for=([\d.]+) attempts=(\d+)", log)
        assert reconnected, log[-3000:]
        assert log.index("database_error") < log.index("reconnected")
        down_for = float(reconnected[0][0])
        assert down_for > 0
        assert "child_died" not in log and "child_exited" not in log, log[-3000:]
        assert sorted(rw.children()) == children, "children were replaced"
        print(f"\npostgresql restart: down {DOWN}s; {errors} database_error lines, "
              f"reconnected {len(reconnected)}x (first: down_for={reconnected[0][0]}s, "
              f"attempts={reconnected[0][1]}); {ROWS} rows exactly once, "
              f"{TASKS} tasks successful ({sum(attempts.values()) - TASKS} re-runs)")

        rw.signal(signal.SIGTERM)
        assert rw.wait(40) == 0, rw.output()[-3000:]
    finally:
        rw.stop()


#: The lease of the long outage's supervisors, and how long the server stays down then.
LEASE, LONG_DOWN = 5.0, 8.0


@pytest.mark.timeout(420)
@pytest.mark.parametrize(("mode", "down", "lease"), [
    ("fast", DOWN, None), ("immediate", DOWN, None), ("fast", LONG_DOWN, LEASE)],
    ids=["fast", "immediate", "fast-longer-than-lease"])
def test_postgresql_restart_fails_no_unit_under_two_supervisors(cluster, tmp_path, mode,
                                                                down, lease):
    """A drain of rows, plain and transactional tasks under two supervisors, with batched
    completions pending, through ``pg_ctl stop -m MODE`` and a start: no unit FAILED, every
    task SUCCESSFUL, every transactional Effect once, both supervisors and their children
    still up, no crash counted (tests/restarts.py). The last case stays down longer than
    the lease: its reaped units count a crash each."""
    env = {**os.environ, "DBWORKER_TEST_DB": "postgres", "PGHOST": "127.0.0.1",
           "PGPORT": str(cluster.port), "PGUSER": "postgres", "DBWORKER_TEST_DB_NAME": DATABASE,
           "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT),
           "PYTHONUNBUFFERED": "1"}
    if lease is not None:
        env["DBWORKER_TEST_LEASE"] = str(lease)
    with cluster.connect("postgres") as conn:
        conn.execute(f"CREATE DATABASE {DATABASE}")
    drain = restarts.Drain(tmp_path)
    drain.seed(env)

    def query(sql: str) -> list[tuple]:
        with cluster.connect() as conn:
            return conn.execute(sql).fetchall()

    def outage() -> None:
        cluster.stop(mode)  # every connection is cut; new ones are refused
        time.sleep(down)
        cluster.start()

    restarts.restart_during_drain(
        f"postgresql -m {mode}, down {down}s, lease {lease or 30}s", query, drain, env,
        outage, past_lease=lease is not None)
