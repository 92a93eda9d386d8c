"""SQLite: our processes wait for a busy write lock in short steps (``db.sqlite.with_short_waits``)
before they wait the way SQLite does, and leave the busy timeout as it was."""

from __future__ import annotations

import sqlite3
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, connections, transaction

from django_dbworker import conf
from django_dbworker.db import connections as db
from django_dbworker.db import sqlite
from django_dbworker.models import Pause
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sqlite_file(vendor: str) -> str:
    if vendor != "sqlite":
        pytest.skip("SQLite's write lock")
    connection.ensure_connection()
    return connection.settings_dict["NAME"]


def busy_timeout() -> int:
    return connection.connection.execute("PRAGMA busy_timeout").fetchone()[0]


def test_a_transaction_gets_the_write_lock_soon_after_another_process_let_it_go(sqlite_file):
    db.own_process(connection.alias)
    other = sqlite3.connect(sqlite_file, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock ...
    release = threading.Timer(0.005, other.execute, ("COMMIT",))  # ... for 5 ms
    release.start()
    started = time.monotonic()
    try:
        with transaction.atomic():
            Item.objects.create()
        waited = time.monotonic() - started
    finally:
        release.join()
        other.close()
    assert Item.objects.count() == 1
    # SQLite's own busy handler would have slept 1 + 2 + 5 ms at least.
    assert waited < 1.0
    assert busy_timeout() == int(conf.get().SQLITE_BUSY_TIMEOUT * 1000), "restored"


def test_after_the_short_waits_it_waits_as_sqlite_does(sqlite_file, settings):
    settings.DBWORKER = {**settings.DBWORKER, "SQLITE_BUSY_TIMEOUT": 0.2}
    connection.close()
    db.own_process(connection.alias)
    other = sqlite3.connect(sqlite_file, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    started = time.monotonic()
    try:
        with pytest.raises(OperationalError, match="locked"), transaction.atomic():
            pass
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert time.monotonic() - started >= 0.2, "the short tries, then the busy timeout"
    assert busy_timeout() == 200


def test_other_errors_are_not_tried_again(sqlite_file):
    connection.ensure_connection()
    tries = []

    def attempt() -> None:
        tries.append(1)
        raise sqlite3.OperationalError("no such table: nowhere")

    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        sqlite.with_short_waits(connection, attempt)
    assert len(tries) == 1
    assert busy_timeout() == int(conf.get().SQLITE_BUSY_TIMEOUT * 1000)


def test_busy_tries_come_tens_of_microseconds_apart_with_sqlites_wait_off(sqlite_file):
    connection.ensure_connection()
    seen = []

    def attempt() -> str:
        seen.append((time.monotonic(), busy_timeout()))
        if len(seen) < 5:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    assert sqlite.with_short_waits(connection, attempt) == "done"
    assert [timeout for _, timeout in seen] == [0] * 5, "SQLite's own sleeps are off"
    assert seen[-1][0] - seen[0][0] < 0.05, "1 + 2 + 5 + 10 ms with SQLite's busy handler"
    assert busy_timeout() == int(conf.get().SQLITE_BUSY_TIMEOUT * 1000)


@pytest.fixture
def deferred(sqlite_file, monkeypatch):
    """Django's default transactions (``BEGIN``, the lock taken at the first write), which
    the test settings replace with IMMEDIATE; as a user's settings have them (W001)."""
    connection.close()  # a new session, as a new process has
    monkeypatch.setitem(connection.settings_dict["OPTIONS"], "transaction_mode", None)
    monkeypatch.setattr(connections["default"], "transaction_mode", None, raising=False)
    return sqlite_file


def test_an_operator_command_waits_for_the_write_lock_beside_supervisors(deferred):
    """``dbworker pause`` beside supervisors that write (Django's default deferred
    transactions, W001): it waits for the lock, as runworkers does, instead of dying with
    ``OperationalError: database is locked``."""
    other = sqlite3.connect(deferred, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # a supervisor's write ...
    other.execute("INSERT INTO testapp_item (kind, action, enabled, rank, steps) "
                  "VALUES ('idle', 'ok', 1, 0, 0)")
    release = threading.Timer(0.3, other.execute, ("COMMIT",))  # ... committed later
    release.start()
    try:
        out = StringIO()
        call_command("dbworker", "pause", "--queue", "default", stdout=out)
    finally:
        release.join()
        other.close()
    assert "Paused queue 'default'" in out.getvalue()
    assert Pause.objects.filter(kind="queue", name="default").exists()


def test_an_operator_command_past_the_busy_timeout_names_w001s_fix(deferred, settings):
    settings.DBWORKER = {**settings.DBWORKER, "SQLITE_BUSY_TIMEOUT": 0.2}
    other = sqlite3.connect(deferred, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(CommandError, match=(
                r"The database is locked: another process held its write lock longer than "
                r"DBWORKER\['SQLITE_BUSY_TIMEOUT'\] \(0.2 s\); run the command again, .*"
                r"'transaction_mode': 'IMMEDIATE'.*django_dbworker.W001")):
            call_command("dbworker", "pause", "--queue", "default", stdout=StringIO())
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert not Pause.objects.exists()
