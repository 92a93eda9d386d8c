"""SQLite: our processes wait for a busy write lock in short steps (``db.sqlite.with_short_waits``)
before they wait the way SQLite does, and leave the busy timeout as it was."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import OperationalError, connection, connections, transaction
from django.urls import reverse
from django.utils import timezone

from django_dbworker import conf
from django_dbworker.db import connections as db
from django_dbworker.db import sqlite
from django_dbworker.insight import counts
from django_dbworker.models import Execution, Pause, State
from tests.conftest import wait_for
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


def test_a_transaction_gets_the_write_lock_soon_after_another_process_let_it_go(
        sqlite_file, monkeypatch):
    """Another process lets the lock go during our first short pause (tens of
    microseconds): the next try has it, with SQLite's own busy handler (1 + 2 + 5 ms of
    sleep at least) never used."""
    db.own_process(connection.alias)
    other = sqlite3.connect(sqlite_file, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock ...
    pauses: list[tuple[float, int]] = []

    def pause(seconds: float) -> None:
        pauses.append((seconds, busy_timeout()))
        if other.in_transaction:
            other.execute("COMMIT")  # ... and lets it go while we pause

    monkeypatch.setattr(sqlite.time, "sleep", pause)
    try:
        with transaction.atomic():
            Item.objects.create()
    finally:
        other.close()
    assert Item.objects.count() == 1
    assert pauses == [(sqlite._PAUSES[0], 0)], "one short pause, SQLite's wait off"
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


def test_busy_tries_come_tens_of_microseconds_apart_with_sqlites_wait_off(sqlite_file,
                                                                         monkeypatch):
    connection.ensure_connection()
    seen = []

    def attempt() -> str:
        seen.append(busy_timeout())
        if len(seen) < 5:
            raise sqlite3.OperationalError("database is locked")
        return "done"

    pauses: list[float] = []
    monkeypatch.setattr(sqlite.time, "sleep", pauses.append)
    assert sqlite.with_short_waits(connection, attempt) == "done"
    assert seen == [0] * 5, "SQLite's own sleeps are off"
    # SQLite's busy handler would sleep 1 + 2 + 5 + 10 ms between these tries.
    assert pauses == list(sqlite._PAUSES[:4])
    assert max(pauses) <= 0.001
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


def test_a_sweep_that_meets_the_held_write_lock_is_tried_again_not_paused(sqlite_file,
                                                                           runworkers):
    """The supervisor's loop waits MAIN_LOCK_WAIT (1 s) for SQLite's write lock; a
    discovery step that waited that long is tried again in a later round
    (``sweep_retried``), as a claim is, instead of leaving the worker alone for 30 s
    (``claim_failed``, and ``--burst`` exiting 1: seen beside two other supervisors)."""
    Item.objects.bulk_create(Item() for _ in range(20))  # no post_save: the sweep finds them
    other = sqlite3.connect(sqlite_file, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")  # another process writes for longer than a second
    try:
        rw = runworkers("--worker", "touch", "--burst", "-v", "2")  # -v 2: the info lines
        wait_for(lambda: "sweep_retried" in rw.output() or "claim_failed" in rw.output(),
                 120, "the sweep to meet the lock")
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert rw.wait(120) == 0, rw.output()
    assert Execution.objects.filter(worker="touch", state=State.FINISHED).count() == 20
    out = rw.output()
    assert "claim_failed" not in out, out
    assert "sweep_retried source=touch" in out, out


def test_the_operator_reads_need_no_write_lock(sqlite_file, settings, client):
    """The metrics view and the newest-first reads run beside a writer that holds the
    lock: ``index_first`` opens no transaction where the planner cannot be steered (a
    BEGIN IMMEDIATE there would wait for the lock, then fail)."""
    settings.DBWORKER = {**settings.DBWORKER, "SQLITE_BUSY_TIMEOUT": 0.2}
    connection.close()
    other = sqlite3.connect(sqlite_file, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # a supervisor's transactional handler, say
    try:
        counts.task_history()
        counts.execution_durations(timezone.now())
        assert client.get(reverse("django_dbworker:metrics")).status_code == 200
        body = client.get(reverse("django_dbworker:health")).json()
        assert "locked" not in json.dumps(body), body
        assert "lag_seconds" in body and "supervisors_alive" in body, body  # read them all
    finally:
        other.execute("ROLLBACK")
        other.close()
