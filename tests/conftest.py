"""Database selection, PostgreSQL reachability, and helpers to start real runworkers."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import flush

ROOT = Path(__file__).resolve().parent.parent


def pytest_report_header(config: pytest.Config) -> str:
    return f"dbworker test database: {os.environ.get('DBWORKER_TEST_DB', 'sqlite')}"


def pytest_sessionstart(session: pytest.Session) -> None:
    if os.environ.get("DBWORKER_TEST_DB") != "postgres":
        return
    import psycopg

    try:
        psycopg.connect(
            host=os.environ.get("PGHOST", "127.0.0.1"),
            port=os.environ.get("PGPORT", "5432"),
            user=os.environ.get("PGUSER", "postgres"),
            dbname="postgres",
            connect_timeout=5,
        ).close()
    except psycopg.OperationalError as exc:
        message = (
            "\n" + "!" * 78 + "\nPostgreSQL is NOT reachable; the PostgreSQL half of the "
            f"suite cannot run:\n{exc}\n" + "!" * 78
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.exit(message + "\nUnder CI this is a failure.", returncode=3)
        print(message, file=sys.stderr)
        session.config.dbworker_skip_postgres = True  # type: ignore[attr-defined]


#: The ``compat`` subset: what the (Python, Django) pairs other than the newest run in
#: scripts/test's quick pass (``-m compat``, noxfile.py; docs/compatibility.md says why):
#: whole modules, and single tests of the slower process modules.
COMPAT = {
    "test_compat.py",          # the framework per Django version, and the refusals
    "test_tasks.py",           # the backend in-process: enqueue, results, options, signals
    "test_enqueue_many.py",    # batched enqueue, its signals and results
    "test_fast_paths.py",      # what leans on Django's internals (signals, normalize_json)
    "test_declarations.py",    # bad tasks and workers refused; the system checks
    "test_immediate.py",       # our @task under Django's own backends; immediate mode
    "test_admin.py",           # the admin's actions (admin/djadmin.py)
    # cron rows' admin: actions on a plain ModelAdmin
    "test_stored_schedules.py::test_admin_saves_lists_next_run_and_enables_disables",
    "test_stored_schedules.py::test_admin_actions_need_the_change_permission",
    # real runworkers: tasks and rows with retries, the heap frozen before forking (it
    # differed on Python 3.12), a timeout and a cancel stopping a child, LISTEN/NOTIFY
    "test_task_processes.py::test_tasks_and_rows_in_one_burst_with_retries",
    "test_task_processes.py::test_children_start_with_the_supervisors_heap_frozen",
    "test_task_processes.py::test_timeout_stops_the_process_and_retries",
    "test_task_processes.py::test_cancel_a_running_task",
    "test_task_processes.py::test_postgres_wakes_idle_supervisors_without_polling",
    # real runworkers running row workers: SIGTERM, and a child killed
    "test_processes.py::test_sigterm_lets_the_running_handler_finish_and_claims_nothing",
    "test_processes.py::test_killed_child_is_released_at_once_and_rerun",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    compat = pytest.mark.compat
    db = os.environ.get("DBWORKER_TEST_DB", "sqlite")
    for item in items:
        name = getattr(item, "originalname", item.name)
        if item.path.name in COMPAT or f"{item.path.name}::{name}" in COMPAT:
            item.add_marker(compat)
        # A test whose subject is not the database (a browser, a signal to a script, the
        # docs site) runs in one database's run, not three times: the CI's 2 CPUs are
        # its limit. The reason says which run has it.
        only = item.get_closest_marker("on_database")
        if only is not None and only.args[0] != db:
            item.add_marker(pytest.mark.skip(
                reason=f"runs in the {only.args[0]} run only: {only.args[1]}"))
    if getattr(config, "dbworker_skip_postgres", False):
        skip = pytest.mark.skip(reason="PostgreSQL is not reachable (see the banner above)")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _cheap_flush() -> None:
    """The flush between transactional tests without Django's slow parts (tests/flush.py)."""
    from django.db import connections

    for alias in connections:
        flush.install(connections[alias])


@pytest.fixture
def vendor(db: None) -> str:
    from django.db import connection

    return connection.vendor


class Runworkers:
    """A real ``runworkers`` process against the test database."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = log.open("wb")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "django", "runworkers", "--settings=tests.settings", *args],
            cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def output(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def signal_group(self, signum: int) -> None:
        os.killpg(self.process.pid, signum)

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"runworkers did not exit within {timeout}s; output:\n{self.output()}"
            ) from None

    def children(self) -> list[int]:
        out = subprocess.run(["pgrep", "-P", str(self.pid)], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self._log.close()


@pytest.fixture
def runworkers(transactional_db: None, tmp_path: Path) -> Iterator[Callable[..., Runworkers]]:
    from django.db import connection

    started: list[Runworkers] = []
    env = {
        **os.environ,
        "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
        "PYTHONPATH": str(ROOT),
        "PYTHONUNBUFFERED": "1",
    }

    def start(*args: str, lease: float | None = None,
              extra_env: dict[str, str] | None = None) -> Runworkers:
        run_env = {**env, **(extra_env or {})}
        if lease is not None:
            run_env["DBWORKER_TEST_LEASE"] = str(lease)
        process = Runworkers(list(args), run_env, tmp_path / f"runworkers-{len(started)}.log")
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
    connection.close()


def wait_for(predicate: Callable[[], object], timeout: float = 30, what: str = "") -> object:
    """Poll ``predicate`` until it is truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.05)


def sent_to_postgres(call: Callable[[], object], folder: Path) -> tuple[object, list[list[str]]]:
    """``call()`` with libpq's protocol trace on Django's connection (PostgreSQL); returns
    its value and the messages the client sent, each as its tab-separated fields after the
    direction and length: ``[type, text...]`` (``["Query", '"SELECT 1"']``, ``["Sync"]``)."""
    from django.db import connection
    from psycopg import pq

    connection.ensure_connection()
    pgconn = connection.connection.pgconn
    trace = folder / "libpq.trace"
    with open(trace, "w") as f:
        pgconn.trace(f.fileno())
        pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
        try:
            value = call()
        finally:
            pgconn.untrace()
    lines = [line.split("\t") for line in trace.read_text().splitlines()]
    return value, [fields[2:] for fields in lines if fields[:1] == ["F"]]


def queries_sent(call: Callable[[], object], folder: Path) -> tuple[object, list[str]]:
    """``call()`` with libpq's protocol trace on; its value and the text of every Query
    message sent (the simple protocol of client-side binding)."""
    value, sent = sent_to_postgres(call, folder)
    return value, [m[1].strip().strip('"') for m in sent if m[:1] == ["Query"]]


def round_trips(call: Callable[[], object], folder: Path) -> tuple[object, int]:
    """``call()`` with libpq's protocol trace on; its value and the round trips it made: the
    messages after which the client waits for the server, a simple-protocol Query (one or
    several statements) or a Sync (the end of an extended-protocol batch, psycopg's
    pipeline among them)."""
    value, sent = sent_to_postgres(call, folder)
    return value, sum(1 for m in sent if m[:1] in (["Query"], ["Sync"]))
