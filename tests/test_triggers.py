"""Optional database triggers (``rows/triggers.py``, ``dbworker triggers``): rows written by
any program become pending in their writer's transaction, and lose their executions when
deleted; installed, stale and missing triggers are told apart, and a check warns."""

from __future__ import annotations

import dataclasses
import json
import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker import checks
from django_dbworker.db import engine, keys
from django_dbworker.exceptions import TriggerUnavailable, UnknownWorker
from django_dbworker.models import Execution, State
from django_dbworker.rows import triggers
from django_dbworker.rows.registry import Worker, workers
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Document, Effect, Item, Ranked, Tag

ITEM_WORKERS = sorted(w.name for w in workers.for_model(Item))

#: Committed tests: on MariaDB and MySQL, CREATE and DROP TRIGGER commit the transaction they
#: run in, so a test's own transaction could not roll them back.
pytestmark = pytest.mark.django_db(transaction=True)


def raw_item(kind: str = "touch", action: str = "ok") -> int:
    """An Item inserted with raw SQL (no save(), no signal); its pk."""
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO testapp_item (kind, action, enabled, rank, steps) "
                       "VALUES (%s, %s, %s, 0, 0)", [kind, action, True])
        cursor.execute("SELECT max(id) FROM testapp_item")
        return cursor.fetchone()[0]


def units(worker: str) -> dict[str, Execution]:
    return {e.source_id: e for e in Execution.objects.filter(worker=worker)}


@pytest.fixture(autouse=True)
def clean_triggers(transactional_db):
    """Triggers outlive a test's data (they are schema): removed before the flush."""
    yield
    triggers.remove()


# ----- install, status, remove --------------------------------------------------------------

def test_install_status_and_remove():
    assert {s.state for s in triggers.status().values()} == {"missing"}
    assert not triggers.installed("touch") and triggers.current() == set()

    assert triggers.install(workers=["touch", "tag"]) == ["tag", "touch"]
    states = triggers.status()
    assert states["touch"] == triggers.TriggerStatus(worker="touch", table="testapp_item",
                                                      state="installed")
    assert states["tag"].state == "installed" and states["ranked"].state == "missing"
    assert triggers.installed("touch") and triggers.installed(workers["tag"])
    assert triggers.current() == {"tag", "touch"}
    assert triggers.install(workers=["touch"]) == [], "current triggers are left alone"

    assert triggers.remove(workers=["tag"]) == ["tag"]
    assert triggers.current() == {"touch"}
    assert triggers.remove() == ["touch"]
    assert {s.state for s in triggers.status().values()} == {"missing"}


def test_install_catches_up_on_rows_written_before_and_executions_of_rows_gone():
    before = Item.objects.bulk_create([Item(kind="touch"), Item(kind="other")])
    document = Document.objects.bulk_create([Document(title="before")])[0]
    gone = Execution.objects.create(worker="touch", source_id="999999", sort_key=999999)
    running = Execution.objects.create(worker="touch", source_id="999998", sort_key=999998,
                                       state=State.WORKING)
    triggers.install(workers=["touch", "read_document"])
    assert set(units("read_document")) == {keys.to_key(Document, document.pk, "default")}
    made = units("touch")
    assert {str(i.pk) for i in before} <= set(made), "every row, eligible or not (as save())"
    assert not Execution.objects.filter(pk=gone.pk).exists()
    assert Execution.objects.filter(pk=running.pk).exists(), "a running unit is left alone"


def test_unknown_worker_names_are_refused_naming_them_and_the_known_ones():
    with pytest.raises(UnknownWorker, match=r"'nope'.*registered workers: .*touch"):
        triggers.install(workers=["touch", "nope"])
    assert triggers.current() == set(), "nothing was installed"
    with pytest.raises(UnknownWorker, match="'nope'"):
        triggers.remove(workers=["nope"])


def test_a_source_written_to_another_database_is_refused(monkeypatch):
    monkeypatch.setattr(triggers.router, "db_for_write", lambda model, **hints: "other")
    with pytest.raises(TriggerUnavailable, match=r"'touch'.*database 'other'.*DATABASE_ROUTERS"):
        triggers.install(workers=["touch"])
    assert "database 'other'" in triggers.status()["touch"].reason
    assert not triggers.installed("touch")
    with pytest.raises(TriggerUnavailable, match="DBWORKER\\['DATABASE'\\]"):
        triggers.status("elsewhere")


def test_install_inside_a_transaction_rolls_back_with_it_or_is_refused_where_ddl_commits():
    """PostgreSQL and SQLite roll DDL back: an install in a transaction that rolls back
    leaves nothing. MariaDB and MySQL commit on CREATE TRIGGER: refused there, before any
    change, rather than commit the caller's work halfway."""
    item = Item.objects.create(kind="touch")
    Execution.objects.filter(worker="touch").delete()
    if connection.features.can_rollback_ddl:
        with pytest.raises(RuntimeError), transaction.atomic():
            assert triggers.install(workers=["touch"]) == ["touch"]
            assert str(item.pk) in units("touch")
            raise RuntimeError("roll back")
    else:
        with pytest.raises(TriggerUnavailable, match="outside transaction.atomic"), \
                transaction.atomic():
            triggers.install(workers=["touch"])
        with pytest.raises(TriggerUnavailable, match="outside transaction.atomic"), \
                transaction.atomic():
            triggers.remove()
    assert triggers.current() == set() and not units("touch")


# ----- what the triggers do ----------------------------------------------------------------

def test_a_raw_insert_is_pending_in_its_own_transaction_and_rolled_back_with_it():
    triggers.install()
    with pytest.raises(RuntimeError), transaction.atomic():
        pk = raw_item()
        assert set(units("touch")) == {str(pk)}
        assert Execution.objects.filter(source_id=str(pk)).count() == len(ITEM_WORKERS)
        raise RuntimeError("roll back")
    assert not Execution.objects.exists()

    pk = raw_item()
    unit = units("touch")[str(pk)]
    assert (unit.state, unit.sort_key, unit.attempts, unit.crashes) == (State.PENDING, pk, 0, 0)
    assert unit.created_at == unit.available_at <= timezone.now()
    assert Execution.objects.claimable(timezone.now()).filter(pk=unit.pk).exists()
    assert run_until_idle(["touch"])["finished"] == 1
    assert Effect.objects.filter(item_id=pk, worker="touch").exists()


def test_bulk_created_rows_of_every_key_type_get_the_key_the_orm_writes():
    triggers.install()
    items = Item.objects.bulk_create([Item(kind="touch") for _ in range(3)])
    documents = Document.objects.bulk_create([Document(title="a"), Document(title="b")])
    tags = Tag.objects.bulk_create([Tag(code="x-1"), Tag(code="Ünï")])
    for name, model, rows in (("touch", Item, items), ("read_document", Document, documents),
                              ("tag", Tag, tags)):
        made = units(name)
        assert set(made) == {keys.to_key(model, r.pk, "default") for r in rows}, name
        for r in rows:
            assert made[keys.to_key(model, r.pk, "default")].sort_key == keys.sort_key(model, r.pk)
    with connection.cursor() as cursor:  # raw SQL, as another program writes a text key
        cursor.execute("INSERT INTO testapp_tag (code) VALUES ('raw')")
    assert "raw" in units("tag")


def test_a_saved_row_has_one_execution_per_worker():
    triggers.install()
    item = Item.objects.create(kind="touch")
    assert Execution.objects.filter(source_id=str(item.pk)).count() == len(ITEM_WORKERS)


def test_a_raw_delete_removes_the_rows_executions_but_a_running_one():
    triggers.install()
    kept, gone, busy = raw_item(), raw_item(), raw_item()
    Execution.objects.filter(worker="touch", source_id=str(busy)).update(state=State.WORKING)
    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM testapp_item WHERE id IN (%s, %s)", [gone, busy])
    assert set(units("touch")) == {str(kept), str(busy)}
    assert not Execution.objects.filter(source_id=str(gone)).exists()


def test_a_handler_deleting_its_own_row_is_forgotten_as_without_triggers():
    triggers.install(workers=["touch"])
    item = Item.objects.create(action="delete_self")
    assert run_until_idle(["touch"])["gone"] == 1
    assert not Execution.objects.filter(worker="touch", source_id=str(item.pk)).exists()


def test_the_delete_triggers_statements_read_through_indexes_on_mariadb(vendor):
    """MariaDB/MySQL run the delete trigger once per deleted row: each of its statements
    must find the row's execution and its failures through indexes, whatever the history
    (an ``IN (SELECT ...)`` in a one-table DELETE scans the whole failures table there).
    Checked with ``EXPLAIN`` of the body's statements, the deleted key made a constant."""
    if vendor != "mysql":
        pytest.skip("MariaDB/MySQL's row triggers")
    from django_dbworker.models import Failure

    units = Execution.objects.bulk_create(
        [Execution(worker="touch", source_id=str(i), sort_key=i, state=State.FAILED)
         for i in range(1, 2001)])
    Failure.objects.bulk_create([Failure(execution=u, attempt=1, exception_class="E",
                                         message="m", traceback="") for u in units])
    create = next(sql for sql in triggers._expected(workers["touch"], "default").statements
                  if sql.startswith("CREATE TRIGGER") and "AFTER DELETE" in sql)
    body = create.split("*/", 1)[1].rsplit("END", 1)[0]
    statements = [sql.strip() for sql in body.split(";") if sql.strip()]
    assert len(statements) == 2, statements  # the failures, then the execution
    for sql in statements:
        with connection.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql.replace("OLD.`id`", "1000"))
            names = [c[0].lower() for c in cursor.description]
            plan = [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]
        assert not any(r["type"] in ("ALL", "index") for r in plan), (sql, plan)


# ----- stale triggers ----------------------------------------------------------------------

def test_triggers_written_for_another_source_or_sql_are_stale_until_installed_again(
        monkeypatch):
    triggers.install(workers=["touch", "rank_pk"])
    monkeypatch.setattr(workers["touch"], "source", Ranked)
    state = triggers.status()["touch"]
    assert state.state == "stale" and "testapp_item" in state.reason
    assert not triggers.installed("touch")
    assert triggers.install(workers=["touch"]) == ["touch"]
    assert triggers.status()["touch"] == triggers.TriggerStatus(
        worker="touch", table="testapp_ranked", state="installed")
    monkeypatch.undo()

    original = triggers._describe
    monkeypatch.setattr(triggers, "_describe", lambda *args: dataclasses.replace(
        original(*args), deletable="1 = 1"))  # another version of our SQL
    state = triggers.status()["rank_pk"]
    assert state.state == "stale" and "another version" in state.reason
    triggers.install(workers=["rank_pk"])
    assert triggers.installed("rank_pk")


def test_half_installed_triggers_are_stale():
    triggers.install(workers=["touch"])
    found = triggers._found("default")["touch"]
    delete = next(f.trigger for f in found if f.event == "delete")
    with connection.cursor() as cursor:
        for sql in engine().drop_row_trigger(connection, delete):
            cursor.execute(sql)
    state = triggers.status()["touch"]
    assert state.state == "stale" and "delete trigger is missing" in state.reason


def test_triggers_of_a_worker_no_longer_registered_are_stale_and_removable(monkeypatch):
    gone = Worker(lambda item: None, name="retired", source=Item, eligible=None,
                  concurrency=1, transactional=True)
    workers.add(gone)
    try:
        triggers.install(workers=["retired"])
    finally:
        workers.remove("retired")
    state = triggers.status()["retired"]
    assert state.state == "stale" and "no worker of this name" in state.reason
    assert triggers.remove(workers=["retired"]) == ["retired"]
    assert "retired" not in triggers.status()


# ----- the system check ---------------------------------------------------------------------

def test_the_check_warns_of_stale_triggers_and_of_missing_ones_beside_installed_ones(
        monkeypatch):
    def warned():
        return {m.msg.split("'")[1] for m in checks.check_triggers(databases=["default"])
                if m.id == "django_dbworker.W003"}

    assert warned() == set(), "no triggers at all: fine, they are optional"
    assert checks.check_triggers(databases=None) == []
    triggers.install(workers=["touch", "rank_pk", "rank_up", "rank_down"])
    assert warned() == set(ITEM_WORKERS) - {"touch"}, "other tables are not warned of"
    triggers.install()
    assert warned() == set()
    monkeypatch.setattr(workers["tag"], "source", Ranked)
    assert warned() == {"tag"}


# ----- the command --------------------------------------------------------------------------

def command(*args: str) -> str:
    out = StringIO()
    call_command("dbworker", "triggers", *args, stdout=out)
    return out.getvalue()


def test_the_command_installs_shows_and_removes_them():
    doc = json.loads(command("install", "--worker", "touch", "--json"))
    assert doc["command"] == "triggers" and doc["version"] == 1
    assert doc["action"] == "install" and doc["changed"] == ["touch"]
    assert doc["workers"] == [{"worker": "touch", "table": "testapp_item",
                               "status": "installed", "reason": None}]
    doc = json.loads(command("--json"))
    assert {w["worker"]: w["status"] for w in doc["workers"]}["ranked"] == "missing"
    assert "touch" in command("status", "--worker", "touch")
    text = command("remove")
    assert "Removed the triggers of: touch." in text
    with pytest.raises(CommandError, match=r"'nope'.*registered workers: .*touch"):
        command("install", "--worker", "nope")
    with pytest.raises(CommandError, match="'nope'"):
        command("status", "--worker", "nope")


# ----- with commits: NOTIFY, runworkers, migrate and flush -----------------------------------

def test_a_committed_raw_insert_is_announced(vendor):
    triggers.install(workers=["touch"])
    if not engine().notifies:
        pytest.skip("only PostgreSQL announces (NOTIFY)")
    listening = engine().listen(connection, "dbworker")
    try:
        with transaction.atomic():
            raw_item()
            assert listening.received() == set(), "delivered only at commit"
        deadline = time.monotonic() + 10
        heard: set[str] = set()
        while not heard and time.monotonic() < deadline:
            heard = listening.received()
        assert heard == {"rows"}
    finally:
        listening.close()


def test_runworkers_claims_what_the_trigger_wrote(runworkers):
    triggers.install()
    pk = raw_item()
    unit = units("touch")[str(pk)]
    rw = runworkers("--worker", "touch", "--burst")
    assert rw.wait(60) == 0, rw.output()
    done = Execution.objects.get(pk=unit.pk)
    assert done.state == State.FINISHED and Effect.objects.filter(item_id=pk).exists()


def test_migrate_and_flush_work_with_triggers_installed():
    triggers.install()
    raw_item()
    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    assert not Item.objects.exists() and not Execution.objects.exists()
    assert triggers.current() == set(workers)


def test_deleting_a_row_whose_execution_failed_commits():
    """The delete trigger removes the execution's failures first: their foreign key is
    checked at commit, and the ORM's cascade finds no execution left to cascade from."""
    triggers.install(workers=["touch"])
    orm, raw = Item.objects.create(action="raise"), Item.objects.create(action="raise")
    assert run_until_idle(["touch"])["failed"] == 2
    orm.delete()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("DELETE FROM testapp_item WHERE id = %s", [raw.pk])
    assert not Execution.objects.filter(worker="touch").exists()
    from django_dbworker.models import Failure
    assert not Failure.objects.exists()
