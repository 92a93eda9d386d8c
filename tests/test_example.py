"""The example project end to end, on this run's database (SQLite, PostgreSQL or MariaDB).

Each test gets a database of its own: a SQLite file, a PostgreSQL database
``dbworker_example_<pid>`` created and dropped here, or a MariaDB database of that name
dropped here (before and after) and created by ``scripts/demo`` itself, utf8mb4.
``scripts/demo --check`` is the whole demo (migrate, admin user, sample uploads, runserver
and runworkers, the page, the API, health and metrics checked over HTTP); ``scripts/demo``
stops, with everything it started, on SIGINT or SIGTERM to its own pid; the example's own
tests (``manage.py test images``) check its views, JSON errors, query counts and tasks.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

EXAMPLE = ROOT / "example_project"
DB = os.environ.get("DBWORKER_TEST_DB", "sqlite")
PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": os.environ.get("PGPORT", "5432"),
    "user": os.environ.get("PGUSER", "postgres"),
}
MYSQL = {
    "host": os.environ.get("MYSQL_HOST", "127.0.0.1"),
    "port": int(os.environ.get("MYSQL_PORT", "3306")),
    "user": os.environ.get("MYSQL_USER", "root"),
    "password": os.environ.get("MYSQL_PASSWORD", ""),
}

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(DB not in ("sqlite", "postgres", "mariadb"),
                       reason="the example needs a SQLite file, PostgreSQL or MariaDB"),
]


def planted_pairs() -> set[frozenset[str]]:
    """The pairs the demo plants, read from the example (which Django cannot load here)."""
    spec = importlib.util.spec_from_file_location("example_samples",
                                                  EXAMPLE / "images" / "samples.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.planted_pairs()


def pg_admin(sql: str) -> None:
    import psycopg

    with psycopg.connect(dbname="postgres", autocommit=True, **PG) as connection:
        connection.execute(sql)


def mysql_connect(database: str | None = None) -> Any:  # MySQLdb has no type hints
    import MySQLdb

    return MySQLdb.connect(**MYSQL, **({"database": database} if database else {}),
                           charset="utf8mb4", autocommit=True)


def mysql_admin(sql: str) -> None:
    connection = mysql_connect()
    try:
        connection.cursor().execute(sql)
    finally:
        connection.close()


@pytest.fixture
def example_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Environment for the example's manage.py: a fresh database and media folder."""
    env = {**os.environ, "MEDIA_ROOT": str(tmp_path / "media"), "PYTHONUNBUFFERED": "1"}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if DB == "postgres":
        name = f"dbworker_example_{os.getpid()}"
        pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        pg_admin(f'CREATE DATABASE "{name}"')
        env["DATABASE_URL"] = f"postgres://{PG['user']}@{PG['host']}:{PG['port']}/{name}"
        try:
            yield env
        finally:
            pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            # and the example's test database, left behind when its runner was killed
            pg_admin(f'DROP DATABASE IF EXISTS "test_{name}" WITH (FORCE)')
    elif DB == "mariadb":
        name = f"dbworker_example_{os.getpid()}"
        mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")  # scripts/demo creates it
        env["DATABASE_URL"] = (f"mysql://{MYSQL['user']}:{MYSQL['password']}"
                               f"@{MYSQL['host']}:{MYSQL['port']}/{name}")
        try:
            yield env
        finally:
            mysql_admin(f"DROP DATABASE IF EXISTS `{name}`")
            mysql_admin(f"DROP DATABASE IF EXISTS `test_{name}`")
    else:
        env["DATABASE_URL"] = f"sqlite:///{tmp_path / 'example.sqlite3'}"
        yield env


def found_pairs(env: dict[str, str]) -> set[frozenset[str]]:
    sql = ("SELECT a.name, b.name FROM images_duplicatepair p "
           "JOIN images_image a ON a.id = p.image_id JOIN images_image b ON b.id = p.original_id")
    url = env["DATABASE_URL"]
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as connection:
            rows = connection.execute(sql).fetchall()
    elif url.startswith("mysql:"):
        connection = mysql_connect(url.rsplit("/", 1)[1])
        try:
            cursor = connection.cursor()
            cursor.execute(sql)
            rows = cursor.fetchall()
        finally:
            connection.close()
    else:
        import psycopg

        with psycopg.connect(url) as connection:
            rows = connection.execute(sql).fetchall()
    return {frozenset(row) for row in rows}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_demo_finds_the_planted_duplicates(example_env: dict[str, str]) -> None:
    command = ["bash", str(ROOT / "scripts" / "demo"), "--check", "--timeout", "90",
               "--port", str(free_port())]
    done = subprocess.run(command, cwd=ROOT, env=example_env, capture_output=True, text=True,
                          timeout=170, stdin=subprocess.DEVNULL)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "--check passed" in output and "stopped after" in output, output
    assert "'notes.txt' is not an image" in output, "the failure is shown: " + output
    if DB == "mariadb":  # the database did not exist: the demo made it, four-byte UTF-8
        assert "created the database dbworker_example_" in output, output
        connection = mysql_connect()
        try:
            cursor = connection.cursor()
            cursor.execute("SELECT DEFAULT_CHARACTER_SET_NAME FROM information_schema.SCHEMATA "
                           "WHERE SCHEMA_NAME = %s", [f"dbworker_example_{os.getpid()}"])
            assert cursor.fetchall() == (("utf8mb4",),)
        finally:
            connection.close()
    assert found_pairs(example_env) == planted_pairs()


def processes_below(pid: int) -> dict[int, str]:
    """Every live process below ``pid`` and its command line, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state, ppid = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, ValueError):
            continue  # gone meanwhile
        if state != "Z":
            children.setdefault(int(ppid), []).append(int(stat.parent.name))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found[child] = command_line(child)
            todo.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def running(pid: int) -> bool:
    """False once the process is gone or a zombie (its parent may be a container's init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def default_sigint() -> None:
    """As from a terminal: a shell started with SIGINT ignored (pytest run in the background
    of a script, say) can never trap it, whatever the script does."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)")
@pytest.mark.on_database("sqlite", "the demo script's signal handling (the demo's own "
                         "database is SQLite)")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["TERM", "INT"])
def test_the_demo_stops_on_a_signal_to_its_own_pid(example_env: dict[str, str],
                                                   tmp_path: Path, signum: int) -> None:
    """Not a Ctrl-C to the process group: ``kill -TERM <pid>`` of the script alone stops
    runserver, runworkers (and its children) and the progress display, and removes the
    script's temporary folder."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    demo = subprocess.Popen(["bash", str(ROOT / "scripts" / "demo"), "--port", str(free_port())],
                            cwd=ROOT, env={**example_env, "TMPDIR": str(tmp)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, preexec_fn=default_sigint)
    lines: list[str] = []
    serving = threading.Event()  # the URLs are printed and the progress display has begun

    def read() -> None:
        for line in demo.stdout:
            lines.append(line)
            if re.match(r"\[ *[0-9.]+s\] [0-9]+ images", line) and any(
                    "Ctrl-C stops everything" in earlier for earlier in lines):
                serving.set()

    threading.Thread(target=read, daemon=True).start()
    below: dict[int, str] = {}
    try:
        assert serving.wait(150), "".join(lines)
        below = processes_below(demo.pid)
        started = " | ".join(below.values())
        assert "runserver" in started and "runworkers" in started and "watch" in started, started
        assert list(tmp.glob("dbworker-demo.*")), "the script keeps its logs in TMPDIR"

        demo.send_signal(signum)
        try:
            returncode = demo.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail("still running 120 s after the signal: " + "".join(lines))
    finally:
        if demo.poll() is None:  # the test failed: leave nothing running either
            for pid in [demo.pid, *below]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            demo.wait()
    output = "".join(lines)
    assert returncode == 128 + signum, output
    deadline = time.monotonic() + 5  # runworkers' children die with it (PDEATHSIG)
    while (left := {pid: cmd for pid, cmd in below.items() if running(pid)}) and (
            time.monotonic() < deadline):
        time.sleep(0.05)
    assert not left, f"still running after the demo stopped: {left}"
    assert not list(tmp.iterdir()), "the temporary folder is removed"


def test_the_examples_own_tests(example_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "manage.py", "test", "images", "--noinput"],
                          cwd=EXAMPLE, env=example_env, capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stderr, done.stderr
