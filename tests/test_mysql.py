"""What only MariaDB/MySQL needs (``db/mysql.py``, ``db/partial.py``): the flag columns that
stand in for partial indexes, keys compared byte for byte, uniqueness the database
enforces, the checks of server version and isolation level, and a clean ``migrate``.

The version rules are checked on values (this machine has one server: MariaDB 10.11); the
rest runs against the real server, in the MariaDB run of the suite only."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.db import IntegrityError, connection, transaction

from django_dbworker.db import mysql
from django_dbworker.db.partial import PartialIndex
from django_dbworker.models import Execution, State, TaskRecord
from django_dbworker.rows import pending, planner
from django_dbworker.rows.registry import workers
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Tag

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(("mariadb", "version", "ok"), [
    (True, (10, 5, 22), False), (True, (10, 6, 0), True), (True, (10, 11, 19), True),
    (True, (11, 4, 2), True), (False, (5, 7, 44), False), (False, (8, 0, 0), True),
    (False, (8, 4, 1), True),
])
def test_server_versions_without_skip_locked_are_refused(mariadb, version, ok):
    problem = mysql.version_problem(mariadb, version)
    assert (problem is None) == ok
    if not ok:
        name = "MariaDB" if mariadb else "MySQL"
        assert name in problem and ".".join(map(str, version)) in problem


on_mysql = pytest.mark.skipif(os.environ.get("DBWORKER_TEST_DB") != "mariadb",
                              reason="runs with the MariaDB run of the suite")


def columns(table: str) -> dict[str, tuple[str, str | None, str]]:
    """``column -> (EXTRA, COLLATION_NAME, GENERATION_EXPRESSION)`` from the catalog."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT column_name, extra, collation_name, generation_expression "
                       "FROM information_schema.columns WHERE table_schema = DATABASE() "
                       "AND table_name = %s", [table])
        return {name: (extra, collation, expression or "")
                for name, extra, collation, expression in cursor.fetchall()}


def index_columns(table: str) -> dict[str, list[str]]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT index_name, column_name FROM information_schema.statistics "
                       "WHERE table_schema = DATABASE() AND table_name = %s "
                       "ORDER BY index_name, seq_in_index", [table])
        found: dict[str, list[str]] = {}
        for name, column in cursor.fetchall():
            found.setdefault(name, []).append(column)
        return found


@on_mysql
@pytest.mark.django_db
def test_every_partial_index_leads_with_its_virtual_flag_column():
    for model in (Execution, TaskRecord):
        table = model._meta.db_table
        catalog, indexes = columns(table), index_columns(table)
        partial = [i for i in model._meta.indexes if isinstance(i, PartialIndex)]
        assert partial
        for index in partial:
            extra, _, expression = catalog[index.flag]
            assert "VIRTUAL" in extra.upper(), (index.flag, extra)
            assert all(f"'{state}'" in expression for state in index.states), expression
            assert indexes[index.name][0] == index.flag, (index.name, indexes[index.name])
    # the unique idempotency key: a plain unique index (NULLs never collide)
    assert index_columns(TaskRecord._meta.db_table)["dbworker_task_idempotency_key"] == [
        "idempotency_key"]


@on_mysql
@pytest.mark.django_db
def test_key_columns_compare_byte_for_byte():
    assert columns(Execution._meta.db_table)["source_id"][1] == "utf8mb4_bin"
    assert columns(TaskRecord._meta.db_table)["idempotency_key"][1] == "utf8mb4_bin"


@on_mysql
@pytest.mark.django_db(transaction=True)
def test_text_keys_that_differ_only_in_case_are_two_units():
    """Tag's primary key is text; the database's collation (utf8mb4_unicode_ci in the test
    settings, as many projects have) would call "abc" and "ABC" one key: a project whose
    own keys are case-sensitive (a binary collation) would lose units."""
    worker = workers["tag"]
    assert worker.source is Tag
    assert pending.add(worker, ["abc", "ABC"], connection.alias) == 2
    assert sorted(Execution.objects.filter(worker=worker.name)
                  .values_list("source_id", flat=True)) == ["ABC", "abc"]
    Tag.objects.create(pk="abc")
    # the claim probes the source table in its own collation (through its index)
    claims = planner.claim(worker, 10, Claimant(), 30)
    assert "abc" in {c.source_key for c in claims}


@on_mysql
@pytest.mark.django_db(transaction=True)
def test_idempotency_keys_are_unique_in_the_database_and_nulls_are_not():
    TaskRecord.objects.create(task_path="x", idempotency_key="k")
    TaskRecord.objects.create(task_path="x", idempotency_key="K")  # another key
    TaskRecord.objects.create(task_path="x")
    TaskRecord.objects.create(task_path="x")
    with pytest.raises(IntegrityError), transaction.atomic():
        TaskRecord.objects.create(task_path="x", idempotency_key="k")
    assert TaskRecord.objects.count() == 4


@on_mysql
@pytest.mark.django_db(transaction=True)
def test_isolation_levels_that_break_claims_are_refused():
    def ids() -> set[str]:
        return {m.id for m in mysql.server_checks("default", connection)}

    assert ids() == set()  # READ COMMITTED, Django's default
    with connection.cursor() as cursor:
        try:
            for level, expected in (("SERIALIZABLE", "django_dbworker.E014"),
                                    ("READ UNCOMMITTED", "django_dbworker.E014"),
                                    ("REPEATABLE READ", "django_dbworker.W004")):
                cursor.execute(f"SET SESSION TRANSACTION ISOLATION LEVEL {level}")
                assert ids() == {expected}, level
        finally:
            cursor.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")


@on_mysql
@pytest.mark.django_db(transaction=True)
def test_migrate_and_check_print_no_warning_that_weakens_a_guarantee():
    """Django's W036 (a unique constraint not created), W037 (an index condition ignored)
    and W043 (an index not created) are answered by ``db.partial``; nothing else warns."""
    env = {**os.environ, "DBWORKER_TEST_DB": "mariadb", "PYTHONPATH": str(ROOT),
           "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"]}
    for command in (["check", "--database", "default"], ["migrate", "--check"]):
        done = subprocess.run([sys.executable, "-m", "django", *command,
                               "--settings=tests.settings"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "WARNING" not in output.upper() and "models.W0" not in output, output


@on_mysql
@pytest.mark.django_db(transaction=True)
def test_a_claim_is_one_short_transaction_of_three_statements():
    worker = workers["touch"]
    from tests.testapp.models import Item
    items = Item.objects.bulk_create([Item(kind="touch") for _ in range(3)])
    pending.add(worker, [i.pk for i in items], connection.alias)
    claims = planner.claim(worker, 2, Claimant(), 30)
    assert [int(c.source_key) for c in claims] == [items[0].pk, items[1].pk]
    assert Execution.objects.filter(state=State.WORKING).count() == 2
    assert not connection.in_atomic_block
