"""Retention gives disk space back (issue 21): ``dbworker vacuum`` and what retention does
after each batch, on each database, measured on the real files and tables."""

from __future__ import annotations

import io
import json
import logging
import secrets
from dataclasses import replace
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker import conf
from django_dbworker.db import space
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.supervisor.duties.tasks import Retention
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

#: Enough rows that their pages outnumber what a table keeps anyway (about 4 MB).
TASKS = 2000


def cli(*args: str) -> dict:
    out = io.StringIO()
    call_command("dbworker", *args, "--json", stdout=out)
    return json.loads(out.getvalue())


def finished_long_ago(n: int = TASKS) -> None:
    """``n`` tasks with large arguments, ended a day ago (as a real run leaves them)."""
    # Random text: PostgreSQL would compress a repeated one to nothing.
    tasks.add.enqueue_many([((secrets.token_hex(1000), i), {}) for i in range(n)])
    TaskRecord.objects.update(status=TaskStatus.SUCCESSFUL,
                              finished_at=timezone.now() - timedelta(days=1))


def pragma(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(f"PRAGMA {name}")
        return int(cursor.fetchone()[0])


@pytest.fixture
def sqlite_mode():
    """Each SQLite test starts in Django's mode (no auto-vacuum) and leaves the file so:
    the mode belongs to the file, which the whole session shares."""

    def set_mode(mode: str) -> None:
        with connection.cursor() as cursor:
            cursor.execute(f"PRAGMA auto_vacuum = {mode}")
            cursor.execute("VACUUM")

    set_mode("NONE")
    yield
    set_mode("NONE")


def test_the_report_names_our_tables_and_every_key(vendor):
    assert "django_dbworker_taskrecord" in space.tables()
    assert "django_dbworker_execution" in space.tables()
    doc = space.report("default")
    assert set(space.SPACE_KEYS) <= set(doc) and doc["total_bytes"] > 0


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's file and free list")
def test_sqlite_vacuum_shrinks_the_file_then_retention_gives_pages_back_batch_by_batch(
        caplog, sqlite_mode):
    finished_long_ago()
    assert pragma("auto_vacuum") == 0  # Django's default: pages stay on the free list
    cli("prune", "--older-than", "60", "--yes")
    assert TaskRecord.objects.count() == 0
    free_before = pragma("freelist_count")
    assert free_before > 500, "the pruned rows' pages are on the free list"
    doc = cli("vacuum")
    assert doc["before"]["free_bytes"] == free_before * pragma("page_size")
    # The VACUUM went through the write-ahead log; it is truncated after (issue 39: a
    # 613 MB -wal stayed beside a 223 MB database).
    assert doc["statements"][-1] == "PRAGMA wal_checkpoint(TRUNCATE)"
    with connection.cursor() as cursor:
        cursor.execute("PRAGMA journal_mode")
        assert cursor.fetchone()[0] == "wal"
    assert doc["before"]["wal_bytes"] > 0 and doc["after"]["wal_bytes"] == 0
    assert doc["after"]["free_bytes"] == 0
    assert doc["after"]["total_bytes"] < doc["before"]["total_bytes"] - 3_000_000
    assert doc["after"]["auto_vacuum"] == "incremental" == space.report("default")["auto_vacuum"]
    # From now on retention gives the pages back as it prunes: the duty, batch by batch.
    finished_long_ago()
    size = pragma("page_count")
    caplog.set_level(logging.INFO, logger="django_dbworker")
    retention = Retention(replace(conf.get(), RETENTION=60.0))
    for _ in range(10):
        retention.work(0.0)
    assert TaskRecord.objects.count() == 0
    assert pragma("freelist_count") == 0
    assert pragma("page_count") < size - 500
    assert any("pruned" in r.getMessage() and "pages_released=" in r.getMessage()
               for r in caplog.records)


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite's auto_vacuum modes")
def test_without_incremental_mode_retention_leaves_the_pages_for_new_rows(sqlite_mode):
    finished_long_ago()
    retention = Retention(replace(conf.get(), RETENTION=60.0))
    for _ in range(10):
        retention.work(0.0)
    assert TaskRecord.objects.count() == 0 and pragma("freelist_count") > 500
    assert space.after_prune("default") == 0


@pytest.mark.skipif(connection.vendor != "postgresql", reason="PostgreSQL's VACUUM")
def test_postgresql_vacuum_full_gives_the_tables_space_back():
    finished_long_ago()
    cli("prune", "--older-than", "60", "--yes")
    before = space.report("default")
    assert before["autovacuum"] in ("on", "off")
    plain = cli("vacuum")
    assert plain["statements"][0].startswith("VACUUM (ANALYZE) ")
    assert '"django_dbworker_taskrecord"' in plain["statements"][0]
    full = cli("vacuum", "--full", "--yes")
    assert full["statements"][0].startswith("VACUUM (FULL, ANALYZE) ")
    assert full["after"]["total_bytes"] < before["total_bytes"] - 3_000_000


@pytest.mark.skipif(connection.vendor != "mysql", reason="InnoDB's OPTIMIZE TABLE")
def test_mariadb_vacuum_analyzes_and_full_optimizes():
    finished_long_ago()
    cli("prune", "--older-than", "60", "--yes")
    plain = cli("vacuum")
    assert plain["statements"][0].startswith("ANALYZE TABLE ")
    full = cli("vacuum", "--full", "--yes")
    assert full["statements"][0].startswith("OPTIMIZE TABLE `django_dbworker_")
    assert full["after"]["total_bytes"] <= full["before"]["total_bytes"]


def test_vacuum_inside_a_transaction_is_refused_by_name():
    with transaction.atomic(), pytest.raises(CommandError, match="outside transaction.atomic"):
        cli("vacuum")


def test_vacuum_full_asks_first(monkeypatch):
    monkeypatch.setattr("builtins.input", lambda prompt="": "n")
    with pytest.raises(CommandError, match="Nothing was changed: not confirmed"):
        call_command("dbworker", "vacuum", "--full", stdout=io.StringIO())


def test_vacuum_text_output():
    out = io.StringIO()
    call_command("dbworker", "vacuum", stdout=out)
    text = out.getvalue()
    assert text.startswith("Before: ") and "Ran: " in text and "After: " in text
