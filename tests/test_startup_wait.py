"""runworkers keeps trying to reach the database at start-up for ``STARTUP_WAIT`` seconds
(a database starting beside it, failing over), saying so, then gives up naming the database
and the setting. Its coming up while every connection is dropped: test_chaos.py."""

from __future__ import annotations

import socket
import time

import pytest
from django.db import connection

pytestmark = pytest.mark.processes


def _closed_port() -> int:
    with socket.socket() as s:  # a port nothing listens on once this socket is closed
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unreachable(tmp_path) -> dict[str, str]:
    if connection.vendor == "postgresql":
        return {"PGPORT": str(_closed_port())}
    if connection.vendor == "mysql":
        return {"MYSQL_PORT": str(_closed_port())}
    return {"DBWORKER_TEST_DB_NAME": str(tmp_path / "no-such-folder" / "db.sqlite3")}


def test_runworkers_tries_for_startup_wait_then_names_the_database(runworkers, tmp_path):
    began = time.monotonic()
    rw = runworkers("--worker", "touch", extra_env={
        **_unreachable(tmp_path), "DBWORKER_TEST_STARTUP_WAIT": "2"})
    assert rw.wait(60) == 1
    took = time.monotonic() - began
    out = rw.output()
    assert "runworkers: cannot reach database 'default' (" in out
    assert "trying again in 0.5 s" in out and "trying again in 1 s" in out, out
    assert ("CommandError: Cannot reach database 'default' (tried for 2 s: "
            "DBWORKER['STARTUP_WAIT'])") in out, out
    assert took >= 2, took


def test_startup_wait_0_gives_up_at_once(runworkers, tmp_path):
    rw = runworkers("--worker", "touch", extra_env={
        **_unreachable(tmp_path), "DBWORKER_TEST_STARTUP_WAIT": "0"})
    assert rw.wait(60) == 1
    out = rw.output()
    assert "trying again" not in out, out
    assert "CommandError: Cannot reach database 'default': " in out, out
