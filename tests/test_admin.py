"""The admin of executions, tasks and supervisors, the dashboard and WorkerStatusMixin,
through Django's test client: pages, actions, confirmation, permissions."""

import re
import uuid

import pytest
from django.contrib.admin import site
from django.contrib.auth.models import Permission, User
from django.core.exceptions import PermissionDenied
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from django_dbworker.admin.djadmin import FORM_ACTIONS
from django_dbworker.models import Execution, State, Supervisor, TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.testapp import tasks
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db

EXECUTIONS = reverse("admin:django_dbworker_execution_changelist")
TASKS = reverse("admin:django_dbworker_taskrecord_changelist")


@pytest.fixture
def failed():
    """Two failed executions of ``touch`` and one finished one."""
    items = [Item.objects.create(action="raise"), Item.objects.create(action="raise"),
             Item.objects.create(action="ok")]
    run_until_idle(["touch"])
    return {i.pk: Execution.objects.get(worker="touch", source_id=str(i.pk)) for i in items}


def staff(*perms):
    user = User.objects.create_user("staff", password="pw", is_staff=True)
    for codename in perms:
        user.user_permissions.add(Permission.objects.get(codename=codename))
    return user


def action(name, *pks, **extra):
    return {"action": name, "index": "0", "_selected_action": [str(p) for p in pks], **extra}


def test_executions_list_and_detail_show_the_error_and_traceback(admin_client, failed):
    page = admin_client.get(EXECUTIONS).content.decode()
    assert "ValueError: item" in page and "dbw-status-failed" in page
    first = next(iter(failed.values()))
    item_url = reverse("admin:testapp_item_change", args=[first.source_id])
    assert f'href="{item_url}"' in page, "the source row links to its admin page"
    detail = admin_client.get(
        reverse("admin:django_dbworker_execution_change", args=[first.pk])).content.decode()
    assert "Traceback (most recent call last)" in detail
    assert "raise ValueError(f&quot;item {item.pk} is broken&quot;)" in detail
    assert 'class="dbw-pre dbw-traceback"' in detail
    assert 'name="_save"' not in detail, "executions are not edited by hand"


def test_filters_and_search(admin_client, failed):
    pk = next(iter(failed))
    page = admin_client.get(EXECUTIONS, {"q": str(pk), "worker": "touch"}).content.decode()
    assert len(re.findall(r'name="_selected_action" value=', page)) == 1
    page = admin_client.get(EXECUTIONS, {"state__exact": "FAILED", "worker": "touch"})
    assert len(re.findall(r'name="_selected_action" value=', page.content.decode())) == 2
    page = admin_client.get(EXECUTIONS, {"exception": "builtins.ValueError"})
    assert len(re.findall(r'name="_selected_action" value=', page.content.decode())) == 2


@pytest.mark.skipif(not FORM_ACTIONS, reason="Django 6.1 added actions on the change form")
def test_retry_one_failed_execution_from_its_page(admin_client, failed):
    execution = next(e for e in failed.values() if e.state == State.FAILED)
    url = reverse("admin:django_dbworker_execution_change", args=[execution.pk])
    response = admin_client.post(url, {"CHANGE_FORM-action": "retry_failed",
                                       "_selected_action": str(execution.pk)}, follow=True)
    assert response.redirect_chain[-1][0] == url
    execution.refresh_from_db()
    assert execution.state == State.UNFINISHED
    assert "Retry: 1 of 1 selected failed executions changed." in response.content.decode()


@pytest.mark.skipif(FORM_ACTIONS, reason="Django 6.1 has actions on the change form")
def test_before_django_6_1_actions_are_on_the_list_only(admin_client, failed):
    """Django 5.2 and 6.0 have no change-form actions: the page offers none, a forged one
    is refused, and the list's action says what it does to the selected rows."""
    execution = next(e for e in failed.values() if e.state == State.FAILED)
    url = reverse("admin:django_dbworker_execution_change", args=[execution.pk])
    assert "CHANGE_FORM-action" not in admin_client.get(url).content.decode()
    post = {"CHANGE_FORM-action": "retry_failed", "_selected_action": str(execution.pk)}
    assert admin_client.post(url, post).status_code == 403
    request = RequestFactory().post(url, post)
    request.user = User.objects.get(username="admin")
    model_admin = site._registry[Execution]
    with pytest.raises(PermissionDenied, match=r"Actions on a change page need Django 6\.1 "
                       r"\(this is Django [\d.]+\); run 'retry_failed' from the list page"):
        model_admin.changeform_view(request, str(execution.pk))
    execution.refresh_from_db()
    assert execution.state == State.FAILED
    page = admin_client.get(EXECUTIONS).content.decode()
    assert '<option value="retry_failed">Retry the selected failed executions</option>' in page
    response = admin_client.post(EXECUTIONS, action("retry_failed", execution.pk), follow=True)
    execution.refresh_from_db()
    assert execution.state == State.UNFINISHED
    assert "Retry: 1 of 1 selected failed executions changed." in response.content.decode()


def test_bulk_retry_asks_first_then_changes_only_failed_ones(admin_client, failed):
    pks = list(e.pk for e in failed.values())
    confirm = admin_client.post(EXECUTIONS, action("retry_failed", *pks))
    text = confirm.content.decode()
    assert confirm.status_code == 200 and "Retry changes <strong>2</strong> of the 3" in text
    assert Execution.objects.filter(state=State.FAILED).count() == 2, "nothing changed yet"
    done = admin_client.post(EXECUTIONS, {**action("retry_failed", *pks), "post": "yes"},
                             follow=True)
    assert "Retry: 2 of 3 selected failed executions changed. 1 could not be changed" \
        in done.content.decode()
    assert Execution.objects.filter(worker="touch", state=State.UNFINISHED).count() == 2
    assert Execution.objects.filter(worker="touch", state=State.FINISHED).count() == 1
    counts = run_until_idle(["touch"])
    assert counts["failed"] == 2


def test_run_again_puts_a_finished_execution_back(admin_client, failed):
    finished = next(e for e in failed.values() if e.state == State.FINISHED)
    admin_client.post(EXECUTIONS, action("run_again", finished.pk))
    finished.refresh_from_db()
    assert finished.state == State.UNFINISHED and finished.finished_at is None


def test_staff_without_change_permission_sees_no_action_and_gets_403(client, failed):
    client.force_login(staff("view_execution", "view_taskrecord"))
    page = client.get(EXECUTIONS)
    assert page.status_code == 200 and 'name="action"' not in page.content.decode()
    execution = next(e for e in failed.values() if e.state == State.FAILED)
    assert client.post(EXECUTIONS, action("retry_failed", execution.pk)).status_code == 403
    url = reverse("admin:django_dbworker_execution_change", args=[execution.pk])
    detail = client.get(url).content.decode()
    assert "CHANGE_FORM-action" not in detail and "Traceback" in detail
    forged = client.post(url, {"CHANGE_FORM-action": "retry_failed",
                               "_selected_action": str(execution.pk)})
    assert forged.status_code == 403
    result = tasks.add.enqueue(1, 2)
    assert client.post(TASKS, action("cancel_tasks", result.id)).status_code == 403
    execution.refresh_from_db()
    assert execution.state == State.FAILED
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.READY


def test_staff_with_change_permission_may_retry(client, failed):
    client.force_login(staff("view_execution", "change_execution"))
    execution = next(e for e in failed.values() if e.state == State.FAILED)
    assert 'name="action"' in client.get(EXECUTIONS).content.decode()
    client.post(EXECUTIONS, action("retry_failed", execution.pk))
    execution.refresh_from_db()
    assert execution.state == State.UNFINISHED


def test_tasks_list_detail_retry_and_cancel(admin_client):
    failing = tasks.always_fails.enqueue()
    waiting = tasks.add.using(run_after=timezone.now() + timezone.timedelta(hours=1)).enqueue(1, 2)
    run_until_idle(tasks=True, worker_names=[])
    TaskRecord.objects.filter(pk=waiting.id).update(progress=42.0, progress_message="half")
    page = admin_client.get(TASKS).content.decode()
    assert 'role="progressbar" aria-valuenow="42"' in page and "dbw-status-failed" in page
    detail = admin_client.get(
        reverse("admin:django_dbworker_taskrecord_change", args=[failing.id])).content.decode()
    assert detail.count("Traceback (most recent call last)") == 3, "every attempt's error"
    assert "Attempt 3 at" in detail
    admin_client.post(TASKS, action("retry_tasks", failing.id))
    assert TaskRecord.objects.get(pk=failing.id).status == TaskStatus.READY
    admin_client.post(TASKS, action("cancel_tasks", waiting.id))
    assert TaskRecord.objects.get(pk=waiting.id).status == TaskStatus.CANCELLED
    assert admin_client.get(TASKS, {"q": str(waiting.id)}).content.decode().count(
        'name="_selected_action" value=') == 1


def test_supervisors_and_dashboard(admin_client, failed):
    now = timezone.now()
    Supervisor.objects.create(
        id=uuid.uuid4(), host="web-1", pid=42, started_at=now, last_heartbeat=now,
        heartbeat_expires_at=now + timezone.timedelta(seconds=30), concurrency=4,
        workers=["touch"], queues=None,
        running=[{"worker": "touch", "execution": 1, "source": "1", "attempt": 1,
                  "child": 43, "since": now.isoformat()}])
    Supervisor.objects.create(
        id=uuid.uuid4(), host="web-2", pid=7, started_at=now, last_heartbeat=now,
        heartbeat_expires_at=now - timezone.timedelta(seconds=1), concurrency=2)
    page = admin_client.get(reverse("admin:django_dbworker_supervisor_changelist"))
    text = page.content.decode()
    assert "web-1:42" in text and ">alive<" in text and ">dead<" in text and "1 of 4" in text
    dash = admin_client.get(reverse("admin:django_dbworker_dashboard_changelist"))
    text = dash.content.decode()
    assert dash.status_code == 200 and "builtins.ValueError" in text
    assert "1 alive" in text and "1 dead" in text
    assert re.search(r"<th><a [^>]*>touch</a></th>", text)
    index = admin_client.get(reverse("admin:index")).content.decode()
    assert "Dashboard" in index


def test_dashboard_needs_a_view_permission(client, db):
    client.force_login(staff())
    url = reverse("admin:django_dbworker_dashboard_changelist")
    assert client.get(url).status_code == 403


def test_mixin_column_filter_and_reprocess(admin_client, failed):
    url = reverse("admin:testapp_item_changelist")
    page = admin_client.get(url).content.decode()
    assert "dbw-status-failed" in page and "dbw-status-finished" in page
    assert "django_dbworker/admin.css" in page, "the badges get their style"
    only_failed = admin_client.get(url, {"dbworker_touch": "FAILED"}).content.decode()
    assert only_failed.count('name="_selected_action" value=') == 2
    none_yet = admin_client.get(url, {"dbworker_after_touch": "none"}).content.decode()
    assert none_yet.count('name="_selected_action" value=') == 3, "only touch ran"
    finished = next(e for e in failed.values() if e.state == State.FINISHED)
    admin_client.post(url, action("dbworker_reprocess", finished.source_id))
    finished.refresh_from_db()
    assert finished.state == State.UNFINISHED


def test_mixin_reprocess_needs_change_execution(client, failed):
    client.force_login(staff("view_item", "change_item"))
    url = reverse("admin:testapp_item_changelist")
    assert "dbworker_reprocess" not in client.get(url).content.decode()
    pk = next(iter(failed))
    assert client.post(url, action("dbworker_reprocess", pk)).status_code == 403


# ----- tampered rows render; running units are not deleted ----------------------------------


def test_an_execution_whose_source_id_is_not_a_key_renders_without_a_link(admin_client, failed):
    """A row changed by hand: source_id 'abc' for an integer pk shows as it is, no link."""
    tampered, other = list(failed.values())[:2]
    Execution.objects.filter(pk=tampered.pk).update(source_id="abc")
    Execution.objects.filter(pk=other.pk).update(source_id="99999999999999999999")
    response = admin_client.get(EXECUTIONS)
    assert response.status_code == 200
    page = response.content.decode()
    assert ">abc<" in page and "/testapp/item/abc/" not in page
    detail = admin_client.get(reverse("admin:django_dbworker_execution_change",
                                      args=[tampered.pk]))
    assert detail.status_code == 200 and "abc" in detail.content.decode()


def test_tampered_task_rows_render_in_the_list_and_their_pages(admin_client, vendor):
    from django.db import connection

    rows = [tasks.add.enqueue(i, i) for i in range(4)]
    TaskRecord.objects.filter(pk=rows[0].id).update(task_path="os.system")
    TaskRecord.objects.filter(pk=rows[1].id).update(priority=30000, progress=1e300)
    TaskRecord.objects.filter(pk=rows[2].id).update(errors={"not": "a list"},
                                                    status=TaskStatus.FAILED)
    table = TaskRecord._meta.db_table
    with connection.cursor() as cursor:  # arguments that are not what enqueue writes
        # (not JSON at all is refused by both databases' JSON check)
        cursor.execute(f"UPDATE {table} SET args = '\"not a list\"', kwargs = '[1]' "
                       "WHERE id = %s", [uuid.UUID(rows[3].id).hex
                                         if vendor == "sqlite" else rows[3].id])
    response = admin_client.get(TASKS)
    assert response.status_code == 200
    page = response.content.decode()
    assert "30000" in page and ">system<" in page
    for row in rows:
        detail = admin_client.get(reverse("admin:django_dbworker_taskrecord_change",
                                          args=[row.id]))
        assert detail.status_code == 200, row.id
    errors_page = admin_client.get(reverse("admin:django_dbworker_taskrecord_change",
                                           args=[rows[2].id])).content.decode()
    assert "&quot;not&quot;: &quot;a list&quot;" in errors_page


def delete_selected(client, url, *pks, confirm=True):
    return client.post(url, action("delete_selected", *pks, **({"post": "yes"} if confirm
                                                                 else {})), follow=True)


def test_delete_selected_skips_running_tasks_and_says_to_cancel_first(admin_client):
    running, ready = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    TaskRecord.objects.filter(pk=running.id).update(status=TaskStatus.RUNNING)
    ask = delete_selected(admin_client, TASKS, running.id, ready.id, confirm=False)
    page = ask.content.decode()
    assert "1 running task(s) not deleted: they are running; cancel them first" in page
    assert f'value="{ready.id}"' in page and f'value="{running.id}"' not in page, \
        "the confirmation lists only what will be deleted"
    done = delete_selected(admin_client, TASKS, running.id, ready.id).content.decode()
    assert "Successfully deleted 1 " in done
    assert list(TaskRecord.objects.values_list("pk", flat=True)) == [uuid.UUID(running.id)]
    only = delete_selected(admin_client, TASKS, running.id).content.decode()
    assert "cancel them first (the Cancel action)" in only
    assert TaskRecord.objects.filter(pk=running.id).exists()


def test_the_delete_page_refuses_a_running_task(admin_client):
    running = tasks.add.enqueue(1, 1)
    TaskRecord.objects.filter(pk=running.id).update(status=TaskStatus.RUNNING)
    url = reverse("admin:django_dbworker_taskrecord_delete", args=[running.id])
    for response in (admin_client.get(url, follow=True),
                     admin_client.post(url, {"post": "yes"}, follow=True)):
        assert response.redirect_chain[-1][0] == TASKS
        assert "cancel them first" in response.content.decode()
    assert TaskRecord.objects.filter(pk=running.id).exists()
    TaskRecord.objects.filter(pk=running.id).update(status=TaskStatus.CANCELLED)
    admin_client.post(url, {"post": "yes"})
    assert not TaskRecord.objects.filter(pk=running.id).exists()


def test_delete_selected_skips_working_executions(admin_client, failed):
    working, idle, _ = failed.values()
    Execution.objects.filter(pk=working.pk).update(state=State.WORKING)
    done = delete_selected(admin_client, EXECUTIONS, working.pk, idle.pk).content.decode()
    assert "1 working execution(s) not deleted: they are running; wait until" in done
    assert Execution.objects.filter(pk=working.pk).exists()
    assert not Execution.objects.filter(pk=idle.pk).exists()
    url = reverse("admin:django_dbworker_execution_delete", args=[working.pk])
    admin_client.post(url, {"post": "yes"})
    assert Execution.objects.filter(pk=working.pk).exists()


def test_a_unit_that_started_after_the_confirmation_is_not_deleted(admin_client):
    """The DELETE itself excludes running rows: what started meanwhile stays."""
    from django.contrib.admin.sites import site

    row = tasks.add.enqueue(1, 1)
    model_admin = site._registry[TaskRecord]
    TaskRecord.objects.filter(pk=row.id).update(status=TaskStatus.RUNNING)
    model_admin.delete_queryset(None, TaskRecord.objects.filter(pk=row.id))
    assert TaskRecord.objects.filter(pk=row.id).exists()


def test_a_supervisor_row_may_be_deleted_from_its_page(admin_client):
    """SupervisorAdmin's "busy" column is a method: the rows a delete must skip are
    ``busy_rows`` (which it has none of), not ``busy``."""
    now = timezone.now()
    supervisor = Supervisor.objects.create(
        id=uuid.uuid4(), host="web-3", pid=9, started_at=now, last_heartbeat=now,
        heartbeat_expires_at=now, concurrency=1)
    url = reverse("admin:django_dbworker_supervisor_delete", args=[supervisor.pk])
    assert admin_client.get(url).status_code == 200
    admin_client.post(url, {"post": "yes"})
    assert not Supervisor.objects.filter(pk=supervisor.pk).exists()
