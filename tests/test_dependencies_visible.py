"""WAITING where people look: the admin's task list, filter, detail and cancel action, the
``dbworker`` CLI (stats, inspect, cancel, purge), the metrics, ``get_result``."""

from __future__ import annotations

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from django_dbworker.djtasks import TaskResultStatus, default_task_backend
from django_dbworker.models import TaskRecord, TaskStatus
from tests.testapp import tasks

pytestmark = pytest.mark.django_db

TASKS = reverse("admin:django_dbworker_taskrecord_changelist")


@pytest.fixture
def waiting():
    first = tasks.add.using(run_after=timedelta(hours=1)).enqueue(1, 2)
    second = tasks.add.enqueue(3, 4)
    return first, tasks.add.using(after=[first, second]).enqueue(5, 6)


def cli(*args):
    out = StringIO()
    call_command("dbworker", *args, stdout=out)
    return out.getvalue()


def test_get_result_shows_waiting_as_ready(waiting):
    _, dependent = waiting
    fetched = default_task_backend.get_result(dependent.id)
    assert fetched.status == TaskResultStatus.READY
    assert fetched.dbworker_status == TaskStatus.WAITING


def test_admin_lists_filters_and_details_a_waiting_task(admin_client, waiting):
    first, dependent = waiting
    page = admin_client.get(TASKS).content.decode()
    assert "dbw-status-waiting" in page and "waiting for 2" in page
    only = admin_client.get(TASKS, {"status__exact": "WAITING"}).content.decode()
    assert only.count('name="_selected_action" value=') == 1
    detail = admin_client.get(reverse("admin:django_dbworker_taskrecord_change",
                                      args=[dependent.id])).content.decode()
    assert "Dependencies" in detail and detail.count('class="dbw-dependency"') == 2
    assert reverse("admin:django_dbworker_taskrecord_change", args=[first.id]) in detail
    assert "succeeded: waiting" in detail


def test_admin_cancel_action_cancels_a_waiting_task(admin_client, waiting):
    _, dependent = waiting
    admin_client.post(TASKS, {"action": "cancel_tasks", "index": "0",
                              "_selected_action": [dependent.id]})
    assert TaskRecord.objects.get(pk=dependent.id).status == TaskStatus.CANCELLED


def test_cli_counts_and_shows_waiting(waiting):
    _, dependent = waiting
    doc = json.loads(cli("stats", "--json"))
    default = next(q for q in doc["queues"] if q["name"] == "default")
    assert default["counts"]["WAITING"] == 1 and default["counts"]["READY"] == 2
    assert "waiting" in cli("stats")
    shown = json.loads(cli("inspect", dependent.id, "--json"))
    assert json.dumps(shown).count('"WAITING"') >= 1


def test_cli_cancel_and_purge_take_waiting_tasks(waiting):
    first, dependent = waiting
    cli("cancel", dependent.id, "--yes")
    assert TaskRecord.objects.get(pk=dependent.id).status == TaskStatus.CANCELLED
    other = tasks.add.using(after=[first]).enqueue(1, 1)
    cli("purge", "--yes")
    assert not TaskRecord.objects.filter(pk=other.id).exists()


def test_metrics_count_waiting_tasks(admin_client, waiting):
    from django_dbworker.insight import counts

    assert counts.task_counts()["default"]["WAITING"] == 1
