"""The example project end to end, on this run's database (SQLite or PostgreSQL).

Each test gets a database of its own: a SQLite file, or a PostgreSQL database
``dbworker_example_<pid>`` created and dropped here. ``scripts/demo --check`` is the whole
demo (migrate, admin user, sample uploads, runserver and runworkers, the page and the API
checked over HTTP); the example's own tests (``manage.py test images``) check its views,
query counts and tasks.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import ROOT

EXAMPLE = ROOT / "example_project"
DB = os.environ.get("DBWORKER_TEST_DB", "sqlite")
PG = {
    "host": os.environ.get("PGHOST", "127.0.0.1"),
    "port": os.environ.get("PGPORT", "5432"),
    "user": os.environ.get("PGUSER", "postgres"),
}

pytestmark = [
    pytest.mark.processes,
    pytest.mark.skipif(DB not in ("sqlite", "postgres"),
                       reason="the example needs a SQLite file or PostgreSQL"),
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
    assert found_pairs(example_env) == planted_pairs()


def test_the_examples_own_tests(example_env: dict[str, str]) -> None:
    done = subprocess.run([sys.executable, "manage.py", "test", "images", "--noinput"],
                          cwd=EXAMPLE, env=example_env, capture_output=True, text=True,
                          timeout=170)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK" in done.stderr, done.stderr
