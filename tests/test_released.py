"""``context.released()``: a transactional handler computes without holding its
transaction, then writes in a new one that commits with the status (issue 21)."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, connections

from django_dbworker.models import Execution, State
from django_dbworker.testing import run_until_idle
from tests.testapp import workers as testworkers
from tests.testapp.models import Effect, Item

pytestmark = pytest.mark.django_db(transaction=True)


def in_another_connection(fn):
    """Run ``fn`` in a thread (its own database connection); its value or its error."""
    found = {}

    def run():
        try:
            found["value"] = fn()
        except BaseException as exc:
            found["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    if "error" in found:
        raise found["error"]
    return found["value"]


@pytest.fixture
def probe():
    seen = []

    def set_probe(fn):
        def probe_fn(free, context):
            seen.append((free, fn(context)))
        testworkers.RELEASED_PROBE = probe_fn

    yield set_probe, seen
    testworkers.RELEASED_PROBE = None


def main_session():
    """Something another connection can look the main connection's session up by."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_backend_pid()")
        elif connection.vendor == "mysql":
            cursor.execute("SELECT CONNECTION_ID()")
        else:
            return None
        return cursor.fetchone()[0]


def test_inside_the_block_the_handler_holds_no_transaction(probe):
    set_probe, seen = probe
    session = main_session()

    def look(context):
        def other():
            with connections["default"].cursor() as cursor:
                if connection.vendor == "postgresql":
                    cursor.execute("SELECT state FROM pg_stat_activity WHERE pid = %s",
                                   [session])
                    return cursor.fetchone()[0]
                if connection.vendor == "mysql":
                    cursor.execute("SELECT count(*) FROM information_schema.INNODB_TRX "
                                   "WHERE trx_mysql_thread_id = %s", [session])
                    return f"transactions {cursor.fetchone()[0]}"
                # SQLite: the write lock is free, so another writer gets it at once.
                Item.objects.create(kind="other", action="written meanwhile")
                return "wrote"
        return in_another_connection(other)

    set_probe(look)
    item = Item.objects.create(kind="compute", action="read")
    assert run_until_idle(["compute"]) == {"finished": 1}
    expected = {"postgresql": "idle", "mysql": "transactions 0", "sqlite": "wrote"}
    assert seen == [(True, expected[connection.vendor])]
    assert Effect.objects.get(worker="compute").note == "read True"  # committed with it
    assert Execution.objects.get(worker="compute", source_id=str(item.pk)).state == \
        State.FINISHED


def test_a_process_whose_claim_was_taken_meanwhile_cannot_commit(probe):
    """While it computed, its unit was taken over (its token changed, as a reaper and a
    new claim do): the writes after the block roll back with the refused completion."""
    set_probe, _ = probe
    item = Item.objects.create(kind="compute", action="read")

    def steal(context):
        return in_another_connection(lambda: Execution.objects.filter(
            pk=context.execution_id).update(token=uuid.uuid4()))

    set_probe(steal)
    assert run_until_idle(["compute"]) == {"lease_lost": 1}
    assert not Effect.objects.filter(worker="compute").exists()
    assert Execution.objects.get(worker="compute", source_id=str(item.pk)).state == \
        State.WORKING


def test_inside_an_outer_transaction_nothing_is_released():
    from django.db import transaction

    item = Item.objects.create(kind="compute", action="read")
    with transaction.atomic():
        assert run_until_idle(["compute"]) == {"finished": 1}
    assert Effect.objects.get(worker="compute").note == "read False"
    assert item.pk


def test_inside_the_handlers_own_atomic_block_it_is_refused_by_name():
    item = Item.objects.create(kind="compute", action="nested")
    assert run_until_idle(["compute"]) == {"failed": 1}
    (error,) = Execution.objects.get(worker="compute", source_id=str(item.pk)).failures.all()
    assert error.exception_class == "django_dbworker.exceptions.HandlerTransactionError"
    assert "inside the handler's own transaction.atomic()" in error.message


@pytest.mark.processes
def test_runworkers_runs_it(runworkers):
    Item.objects.create(kind="compute", action="read")
    p = runworkers("--worker", "compute", "--burst", "--concurrency", "1")
    assert p.wait() == 0, p.output()
    assert Effect.objects.get(worker="compute").note == "read True"
