"""The database engine interface (``django_dbworker.db``): one engine per database, the only
place that knows which database it talks to; the stores call it and nothing else."""

from __future__ import annotations

import inspect
import subprocess
import time
from pathlib import Path

import pytest
from django.db import NotSupportedError, connection, connections, transaction
from django.db.models import F, Func, JSONField
from django.utils import timezone

from django_dbworker import checks
from django_dbworker.db import ENGINES, Engine, TransactionEnded, engine, engine_for
from django_dbworker.db.connections import TransactionCheck
from django_dbworker.db.engine import Unsupported
from django_dbworker.models import Execution, State, TaskRecord
from django_dbworker.outcomes import Finished
from django_dbworker.rows import pending, planner, store
from django_dbworker.rows.registry import workers
from django_dbworker.units.claimant import Claimant
from tests.testapp.models import Item
from tests.testapp.tasks import add

pytestmark = pytest.mark.django_db(transaction=True)
ROOT = Path(__file__).resolve().parent.parent


def test_the_engine_is_the_one_of_the_databases_vendor(vendor):
    assert engine() is engine("default") is engine_for(connection) is ENGINES[vendor]
    assert engine().vendor == vendor
    assert set(ENGINES) == {"mysql", "postgresql", "sqlite"}


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_implements_the_interface_with_its_parameters(name):
    implementation = type(ENGINES[name])
    assert issubclass(implementation, Engine)
    for attribute, member in vars(Engine).items():
        if attribute.startswith("_") or not callable(member):
            continue
        mine = getattr(implementation, attribute)
        # the same parameters; a return type may be narrower
        assert inspect.signature(mine).parameters == inspect.signature(member).parameters, \
            attribute


def test_nothing_outside_db_asks_which_database_it_talks_to():
    found = subprocess.run(
        ["grep", "-rn", r"connection.vendor\|\.vendor ==", "django_dbworker"],
        cwd=ROOT, capture_output=True, text=True).stdout.splitlines()
    assert [line for line in found if not line.startswith("django_dbworker/db/")] == []


def test_a_database_without_an_engine_is_refused_by_a_check(vendor, monkeypatch):
    monkeypatch.delitem(ENGINES, vendor)
    errors = [e for e in checks.check_settings() if e.id == "django_dbworker.E012"]
    assert len(errors) == 1 and repr(vendor) in errors[0].msg
    assert "postgresql" in errors[0].hint or "sqlite" in errors[0].hint


def test_enqueueing_to_a_database_without_an_engine_stores_nothing(vendor, monkeypatch):
    """A web process runs no system checks: enqueue() itself refuses, rather than store a
    task no supervisor could ever claim."""
    monkeypatch.delitem(ENGINES, vendor)
    with pytest.raises(NotSupportedError, match=f"no engine for the database vendor '{vendor}'"):
        add.enqueue(1, 2)
    with pytest.raises(NotSupportedError, match="Nothing was enqueued"):
        add.enqueue_many([((1, 2), {})])
    monkeypatch.undo()
    assert TaskRecord.objects.count() == 0


def test_an_unsupported_engine_names_the_vendor_and_what_runs():
    with pytest.raises(NotSupportedError, match=r"'oracle'.*postgresql, sqlite"):
        Unsupported("oracle").json_append("worker_ids")


def _claim():
    Item.objects.create()
    (claim,) = planner.claim(workers["touch"], 1, Claimant(), 30)
    return claim


def test_complete_changes_the_unit_once_and_a_stale_claim_not_at_all():
    claim = _claim()
    assert store.record(claim, Finished()) == 1
    assert Execution.objects.get(pk=claim.execution_id).state == State.FINISHED
    assert store.record(claim, Finished()) == 0, "fenced by the token: no longer current"


def test_complete_in_a_handlers_transaction_checks_the_transaction():
    claim = _claim()
    with transaction.atomic():
        check = TransactionCheck("default")
        check.begin(Item.objects.first())
        assert store.record(claim, Finished(), check) == 1
    assert Execution.objects.get(pk=claim.execution_id).state == State.FINISHED


def test_a_transaction_ended_by_the_handler_is_told_not_recorded(vendor):
    claim = _claim()
    with pytest.raises(TransactionEnded), transaction.atomic():
        check = TransactionCheck("default")
        check.begin(Item.objects.first())
        with connection.cursor() as cursor:  # what a misbehaving handler may do
            cursor.execute("COMMIT")
            if vendor == "postgresql":
                cursor.execute("BEGIN")
        store.record(claim, Finished(), check)
    assert Execution.objects.get(pk=claim.execution_id).state == State.WORKING


def test_json_list_fragments_on_a_real_row():
    result = add.enqueue(1, 2)
    rows = TaskRecord.objects.filter(pk=result.id)
    table = connection.ops.quote_name(TaskRecord._meta.db_table)
    with connection.cursor() as cursor:
        for value in ("a", "b"):
            cursor.execute(f"UPDATE {table} SET worker_ids = "
                           f"{engine().json_append('worker_ids')} WHERE id = %s",
                           [value, TaskRecord._meta.pk.get_db_prep_value(result.id, connection)])
    assert rows.get().worker_ids == ["a", "b"]
    rows.update(worker_ids=Func(F("worker_ids"), template=engine().json_drop_last(),
                                output_field=JSONField()))
    assert rows.get().worker_ids == ["a"]


def test_one_statement_runs_in_a_transaction_where_the_engine_needs_one(vendor):
    with engine().one_statement(connection):
        in_transaction = connection.in_atomic_block
    assert in_transaction == (vendor != "postgresql")


def test_commit_counter_tells_another_connections_commit(vendor):
    counter = engine().commit_counter(connection)
    if not engine().watches_commits:
        assert counter is None
        return
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute("SELECT 1")
        assert engine().commit_counter(connection) == counter  # a read changes nothing
        # a new unit (MariaDB/MySQL's probe looks at what a claim would find new)
        columns, values = pending.new_execution_sql(workers["touch"])
        quote = other.ops.quote_name
        now = Execution._meta.get_field("created_at").get_db_prep_save(timezone.now(), other)
        row = ", ".join(v.format(key="'999999'", sort_key="999999", now="%s") for v in values)
        with other.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {quote(Execution._meta.db_table)} "
                f"({', '.join(quote(c) for c in columns)}) VALUES ({row})",
                [now] * sum(v == "{now}" for v in values))
    finally:
        other.close()
    assert engine().commit_counter(connection) != counter


def test_capability_flags_are_what_each_database_does(vendor):
    e = engine()
    assert e.notifies == (vendor == "postgresql")
    assert e.commits_with_completion == (vendor == "postgresql")
    assert e.watches_commits == (vendor in ("sqlite", "mysql"))
    assert e.checks_lease_on_record == (vendor != "sqlite")
    assert e.progress_in_handler_transaction == (vendor == "sqlite")
    assert (e.marker_sql is not None) == (vendor == "postgresql")


def test_listening_hears_what_a_committed_transaction_announced(vendor):
    e = engine()
    if not e.notifies:
        with pytest.raises(NotSupportedError, match="listening"):
            e.listen(connection, "dbworker_test")
        return
    listening = e.listen(connection, "dbworker_test")
    try:
        assert listening.fileno() > 0 and not listening.closed
        with transaction.atomic():
            e.notify(connection, "dbworker_test", "rows")
            assert listening.received() == set(), "delivered only at commit"
        deadline = time.monotonic() + 10
        heard: set[str] = set()
        while not heard and time.monotonic() < deadline:
            heard = listening.received()
        assert heard == {"rows"}
    finally:
        listening.close()
    assert listening.closed
