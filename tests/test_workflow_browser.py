"""The workflow admin in a real headless Chromium: the list with progress, a workflow's
page with its members indented under what they wait for (their dependencies and
statuses), the links to and from the task admin, the cancel action, and its permission.
Fixtures and helpers: tests/test_browser.py (screenshots to test-output/screenshots/)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission, User

from django_dbworker.models import TaskRecord, TaskStatus, Workflow
from django_dbworker.testing import run_until_idle
from django_dbworker.workflows import chain, group
from tests import test_browser
from tests.conftest import wait_for
from tests.test_browser import log_in, run_action, superuser
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.on_database(
    "postgres", "the workflow page in a browser; its statements run in test_workflow_*.py "
    "on each database")]

# test_browser's fixtures: Chromium (once per module), a page on the live server, shots
browser, page, shots = test_browser.browser, test_browser.page, test_browser.shots


def members_by_task(page):
    return {li.get_attribute("data-task"): li for li in
            page.locator("li.dbw-member").all()}


def test_workflow_page_shows_members_their_dependencies_and_statuses(page, shots):
    superuser()
    s = tasks.wf_step.step
    handle = chain(s(1), group(s(2), s(3, fail=True)), s(4)).enqueue(
        name="nightly report", on_complete=tasks.wf_callback.step(label="done"))
    one, two, three, four = handle.results
    run_until_idle(tasks=True, worker_names=[])  # 1, then 2 and 3 (3 fails), the callback
    assert TaskRecord.objects.get(pk=three.id).status == TaskStatus.FAILED
    log_in(page, "admin")

    page.goto("/admin/django_dbworker/workflow/")
    row = page.locator("#result_list tbody tr", has_text="nightly report")
    assert row.count() == 1
    assert "2 successful" in row.inner_text() and "1 failed" in row.inner_text()
    assert "1 cancelled" in row.inner_text()
    shots(page, "20-workflows-list")

    row.locator("th a").click()
    page.wait_for_selector("li.dbw-member")
    assert "4 of 4 ended" in page.locator(".field-progress_counts").inner_text()
    members = members_by_task(page)
    assert list(members) == [r.id for r in (one, two, three, four)]
    # indented under what they wait for: 1, then 2 and 3 side by side, then 4
    margins = [members[r.id].get_attribute("style") for r in (one, two, three, four)]
    assert margins == ["margin-left: 0em", "margin-left: 2em", "margin-left: 2em",
                       "margin-left: 4em"]
    assert members[one.id].locator(".dbw-status").first.inner_text() == "successful"
    assert members[three.id].locator(".dbw-status").first.inner_text() == "failed"
    # 4 waited for 2 (met) and 3 (broken): it was cancelled, naming 3
    last = members[four.id].inner_text()
    assert "cancelled" in last and "broken" in last and "met" in last
    assert page.locator(".field-callback .dbw-status").inner_text() == "successful"
    shots(page, "21-workflow-page")

    members[three.id].locator("a").first.click()
    assert "wf_step" in page.locator(".field-task_path").inner_text()
    page.locator(".field-workflow a").click()
    assert "nightly report" in page.locator(".field-name").inner_text()

    page.locator(".field-progress_counts a").click()
    page.wait_for_selector("#result_list tbody tr")  # (count() does not wait)
    # the members and the callback (it carries the workflow's id too)
    assert page.locator("#result_list tbody tr").count() == 5
    shots(page, "22-workflow-members-in-task-list")


def test_cancel_a_workflow_from_its_page_cancels_what_has_not_started(page, shots, runworkers):
    superuser()
    path = "/nonexistent/never"  # the first step waits until the test's end
    handle = chain(tasks.wf_wait.step(1, path), group(tasks.wf_step.step(2),
                                                      tasks.wf_step.step(3))).enqueue(
        name="to cancel", on_complete=tasks.wf_callback)
    worker = runworkers("--concurrency", "2", lease=3)
    wait_for(lambda: TaskRecord.objects.get(pk=handle.results[0].id).status
             == TaskStatus.RUNNING, what="the first step to start")
    log_in(page, "admin")
    page.goto(f"/admin/django_dbworker/workflow/{handle.id}/change/")
    assert "0 of 3 ended" in page.locator(".field-progress_counts").inner_text()
    shots(page, "23-workflow-running")
    run_action(page, "Cancel this workflow")
    assert "Cancel: 1 of 1 selected workflows changed." in \
        page.locator(".messagelist").inner_text()
    wait_for(lambda: handle.done(), timeout=20, what="the running step to be stopped")
    assert set(TaskRecord.objects.filter(pk__in=[r.id for r in handle.results])
               .values_list("status", flat=True)) == {TaskStatus.CANCELLED}
    # the callback still runs, once, after every member has ended
    wait_for(lambda: Effect.objects.filter(worker="wf_callback").exists(), timeout=20,
             what="the completion callback")
    assert list(Effect.objects.filter(worker="wf_callback").values_list("note", flat=True)) \
        == [handle.id]
    page.reload()
    assert "3 of 3 ended" in page.locator(".field-progress_counts").inner_text()
    assert Workflow.objects.get(pk=handle.id).cancelled_at is not None
    shots(page, "24-workflow-cancelled")
    worker.signal(15)
    assert worker.wait(30) == 0, worker.output()


def test_staff_without_change_permission_cannot_cancel_a_workflow(page, shots):
    handle = group(tasks.wf_step.step(1)).enqueue(name="viewed")
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_workflow", "view_taskrecord"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    log_in(page, "viewer")
    page.goto(f"/admin/django_dbworker/workflow/{handle.id}/change/")
    assert page.locator("li.dbw-member").count() == 1
    assert page.locator("select[name$=action]").count() == 0
    page.goto("/admin/django_dbworker/workflow/")
    assert page.locator("select[name=action]").count() == 0
    assert Workflow.objects.get().cancelled_at is None
