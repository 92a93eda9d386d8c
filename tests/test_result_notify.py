"""``result.get()`` woken by NOTIFY on PostgreSQL (issue 21): every record of a final
status notifies the ended tasks' ids (``db/notify.py``'s ``ENDED``), a batch of successes
in one notification sent by its own statement; the wait LISTENs and learns of the end
within a round trip. Without NOTIFY (other databases, ``DBWORKER["NOTIFY"] = False``) the
wait polls, as before."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections
from django.test import override_settings

from django_dbworker import cancel
from django_dbworker.db import engine_for
from django_dbworker.db.notify import ENDED, LONGEST_PAYLOAD, ended_payload
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks import waiting
from django_dbworker.units.claimant import Claimant
from django_dbworker.units.failures import FailureInfo
from tests.test_result_wait import run_async
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ends(vendor):
    """A LISTEN on the ended tasks' channel; its ``payloads()``: what arrived so far."""
    if vendor != "postgresql":
        pytest.skip("LISTEN/NOTIFY is PostgreSQL's; elsewhere get() polls")
    listening = engine_for(connection).listen(connection, ENDED)

    class Ends:
        def payloads(self, wait=0.5):
            until, got = time.monotonic() + wait, []
            while time.monotonic() < until:
                got += [n.payload for n in listening.raw.notifies(timeout=0.05)]
            return got

    yield Ends()
    listening.close()


def _claim(n):
    claims = taskplanner.claim(None, n, Claimant(), 30)
    assert len(claims) == n
    return claims


def test_a_batch_of_successes_notifies_its_ids_once(ends):
    ids = {str(tasks.add.enqueue(i, i).id) for i in range(3)}
    claims = _claim(3)
    from django.utils import timezone
    recorded = taskstore.succeed_many([(c, 1, timezone.now()) for c in claims])
    assert {str(i) for i in recorded} == ids
    (payload,) = ends.payloads()
    assert set(payload.split(",")) == ids
    taskstore.succeed_many([(c, 1, timezone.now()) for c in claims])  # fenced: nothing
    assert ends.payloads() == []


def test_a_final_failure_and_a_cancel_notify_and_a_retry_does_not(ends):
    failed, retried, cancelled = (tasks.add.enqueue(i, i) for i in range(3))
    by_id = {str(c.task_id): c for c in _claim(2)}
    info = FailureInfo("builtins.ValueError", "no")
    from django.utils import timezone
    assert taskstore.fail_attempt(by_id[str(retried.id)], info,
                                  retry_at=timezone.now() + timezone.timedelta(hours=1))
    assert ends.payloads() == []
    assert taskstore.fail_attempt(by_id[str(failed.id)], info, retry_at=None)
    assert ends.payloads() == [str(failed.id)]
    cancel(cancelled.id)
    assert ends.payloads() == [str(cancelled.id)]


def test_a_payload_too_long_becomes_a_star():
    assert ended_payload(["a", "b"]) == "a,b"
    assert ended_payload(["x" * 100] * (LONGEST_PAYLOAD // 100)) == "*"


def _succeed_later(task_id, after):
    def run():
        time.sleep(after)
        try:
            claims = taskplanner.claim(None, 10, Claimant(), 30)
            (c,) = [c for c in claims if str(c.task_id) == str(task_id)]
            from django.utils import timezone
            taskstore.succeed_many([(c, 7, timezone.now())])
        finally:
            connections.close_all()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_get_learns_of_the_end_from_the_notification_not_a_poll(ends, monkeypatch):
    monkeypatch.setattr(waiting, "LISTENING_PAUSE", 3600.0)  # no look but the first
    result = tasks.add.enqueue(3, 4)
    thread = _succeed_later(result.id, 0.3)
    assert result.get(timeout=120) == 7  # a look by time would come an hour later
    thread.join()
    other = tasks.add.enqueue(3, 4)
    thread = _succeed_later(other.id, 0.3)
    assert run_async(other.aget(timeout=120)) == 7
    thread.join()


def test_a_notification_for_another_task_does_not_end_the_wait(ends, monkeypatch):
    monkeypatch.setattr(waiting, "LISTENING_PAUSE", 60.0)
    mine, other = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    thread = _succeed_later(other.id, 0.2)
    with pytest.raises(waiting.ResultTimeout):
        mine.get(timeout=1.0)
    thread.join()


@pytest.mark.parametrize("notify", [True, False])
def test_get_and_aget_end_on_every_database_with_or_without_notify(notify, db):
    with override_settings(DBWORKER={"NOTIFY": notify}):
        for wait in ("get", "aget"):
            result = tasks.add.enqueue(3, 4)
            thread = _succeed_later(result.id, 0.2)
            value = (result.get(timeout=120) if wait == "get"
                     else run_async(result.aget(timeout=120)))
            assert value == 7
            thread.join()
