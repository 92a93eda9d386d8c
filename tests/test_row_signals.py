"""Signals of row units (issue 21): execution_started, execution_finished,
execution_failed, sent in the process that ran the handler, sender the Worker."""

from __future__ import annotations

import logging

import pytest

from django_dbworker import workers
from django_dbworker.signals import execution_failed, execution_finished, execution_started
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db


@pytest.fixture
def seen():
    events = []

    def started(sender, **kw):
        events.append(("started", sender.name, kw["source_id"], kw["attempt"]))

    def finished(sender, **kw):
        events.append(("finished", sender.name, kw["source_id"], kw["outcome"]))

    def failed(sender, **kw):
        events.append(("failed", sender.name, kw["source_id"], kw["error"]["exception_class"],
                       kw["will_retry"]))

    for signal, receiver in ((execution_started, started), (execution_finished, finished),
                             (execution_failed, failed)):
        signal.connect(receiver, weak=False, dispatch_uid=f"test-{receiver.__name__}")
    yield events
    for signal, receiver in ((execution_started, started), (execution_finished, finished),
                             (execution_failed, failed)):
        signal.disconnect(dispatch_uid=f"test-{receiver.__name__}")


def test_started_then_finished_or_failed(seen):
    ok = Item.objects.create(action="ok")
    bad = Item.objects.create(action="raise")
    run_until_idle(["touch"])
    assert seen == [
        ("started", "touch", ok.pk, 1), ("finished", "touch", ok.pk, "finished"),
        ("started", "touch", bad.pk, 1),
        ("failed", "touch", bad.pk, "builtins.ValueError", False),
    ]
    assert seen[1][1] == workers["touch"].name


def test_a_retried_failure_says_it_will_retry(seen):
    item = Item.objects.create(kind="retried", action="fail:1")
    run_until_idle(["retried"])
    assert seen == [
        ("started", "retried", item.pk, 1),
        ("failed", "retried", item.pk, "builtins.ValueError", True),
        ("started", "retried", item.pk, 2), ("finished", "retried", item.pk, "finished"),
    ]


def test_a_receiver_that_raises_is_logged_and_changes_nothing(caplog):
    def broken(sender, **kw):
        raise RuntimeError("receiver bug")

    execution_finished.connect(broken, weak=False, dispatch_uid="broken")
    try:
        item = Item.objects.create(action="ok")
        caplog.set_level(logging.ERROR, logger="django_dbworker")
        assert run_until_idle(["touch"]) == {"finished": 1}
        assert workers["touch"].state(item.pk)["execution_status"] == "FINISHED"
        assert any("signal_receiver_failed" in r.getMessage() and "receiver bug" in
                   r.getMessage() for r in caplog.records)
    finally:
        execution_finished.disconnect(dispatch_uid="broken")
