"""SQLite: our processes wait for a busy write lock in short steps (``db.sqlite.with_short_waits``)
before they wait the way SQLite does, and leave the busy timeout as it was."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from django_dbworker import conf
from django_dbworker.db import connections as db
from django_dbworker.db import sqlite
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
