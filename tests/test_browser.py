"""The admin in a real headless Chromium (Debian's, driven by Playwright): log in, see a
failed execution with its traceback, retry it and see it finish after a real runworkers,
confirm a bulk action, cancel a running task, and the permission case.

Screenshots (1280x800) go to test-output/screenshots/<database>/ (DBWORKER_SCREENSHOTS
overrides the folder). Without /usr/bin/chromium these tests are skipped loudly, except
under CI=true, where they fail: scripts/test installs Chromium when it can.
"""

import os
import re
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.utils import timezone

from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.conftest import ROOT, wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
VIEWPORT = {"width": 1280, "height": 800}

pytestmark = [pytest.mark.browser, pytest.mark.processes, pytest.mark.on_database(
    "postgres", "the pages in a browser; the admin's statements on each database are "
    "test_admin.py's and test_admin_plans.py's")]


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install -e '.[dev]')"
    if not CHROMIUM.exists():
        return (f"{CHROMIUM} is missing; install Debian's chromium (apt-get install chromium)"
                " or run scripts/test, which installs it when run as root")
    return None


@pytest.fixture(scope="module")
def browser():
    missing = _missing()
    if missing:
        banner = f"\n{'!' * 78}\nBROWSER TESTS NOT RUN: {missing}\n{'!' * 78}"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(banner + "\nUnder CI=true this is a failure.", pytrace=False)
        pytest.skip(banner)
    from playwright.sync_api import sync_playwright

    # Playwright's sync API runs an event loop in this thread; the ORM calls the tests make
    # between page actions are synchronous and safe.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS)
            yield chromium
            chromium.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.fixture
def shots():
    base = Path(os.environ.get("DBWORKER_SCREENSHOTS") or ROOT / "test-output" / "screenshots")
    folder = base / connection.vendor
    folder.mkdir(parents=True, exist_ok=True)

    def shot(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=str(path), full_page=False)
        return path

    return shot


@pytest.fixture
def page(browser, live_server):
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    context.set_default_timeout(15_000)
    page = context.new_page()
    yield page
    context.close()


def log_in(page, username, shots=None):
    page.goto("/admin/login/?next=/admin/")
    page.fill("#id_username", username)
    page.fill("#id_password", "pw")
    if shots:
        shots(page, "01-login")
    page.click("input[type=submit]")
    page.wait_for_selector("#site-name")


def superuser():
    return User.objects.create_superuser("admin", "admin@example.com", "pw")


def run_action(page, label):
    """Choose an action by its label in the page's (first) action select and run it."""
    select = page.locator("select[name$=action]").first
    select.select_option(label=label)
    page.locator("button[name=index]").first.click()
    page.wait_for_load_state()


def test_failed_execution_traceback_retry_then_finished(page, shots, runworkers):
    superuser()
    item = Item.objects.create(action="raise")
    Item.objects.create(action="ok")
    run_until_idle(["touch"])
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    assert execution.state == State.FAILED
    log_in(page, "admin", shots)
    shots(page, "02-admin-index")

    page.goto("/admin/django_dbworker/execution/?worker=touch")
    row = page.locator("#result_list tbody tr", has_text="ValueError")
    assert row.count() == 1
    assert "failed" in row.locator(".dbw-status").inner_text()
    shots(page, "03-executions-list")

    row.locator("th a").click()
    traceback = page.locator(".dbw-traceback").first
    assert "Traceback (most recent call last)" in traceback.inner_text()
    assert f"item {item.pk} is broken" in page.locator(".dbw-message").first.inner_text()
    page.locator(".inline-group").first.scroll_into_view_if_needed()
    shots(page, "04-execution-traceback")

    Item.objects.filter(pk=item.pk).update(action="ok")  # fixed: the retry will succeed
    run_action(page, "Retry the selected failed execution")
    assert "Retry: 1 of 1 selected failed executions changed." in \
        page.locator(".messagelist").inner_text()
    assert page.locator(".field-status .dbw-status").inner_text() == "unfinished"
    shots(page, "05-execution-retried")

    worker = runworkers("--burst", "--worker", "touch", "--concurrency", "1")
    assert worker.wait(60) == 0, worker.output()
    page.reload()
    assert page.locator(".field-status .dbw-status").inner_text() == "finished"
    assert page.locator(".field-attempts .readonly").inner_text() == "2"
    shots(page, "06-execution-finished")

    page.goto("/admin/testapp/item/")
    assert page.locator(".field-dbworker_touch_status .dbw-status-finished").count() == 2
    shots(page, "07-source-model-with-status-column")


def test_bulk_retry_asks_for_confirmation(page, shots):
    superuser()
    items = [Item.objects.create(action="raise") for _ in range(3)]
    run_until_idle(["touch"])
    log_in(page, "admin")
    page.goto("/admin/django_dbworker/execution/?worker=touch")
    page.locator("#action-toggle").check()
    run_action(page, "Retry the selected failed executions")
    assert "Retry 3 failed executions?" in page.locator("h1").inner_text()
    assert Execution.objects.filter(worker="touch", state=State.FAILED).count() == 3
    shots(page, "08-bulk-retry-confirmation")
    page.locator("input[type=submit][value^='Yes']").click()
    page.wait_for_load_state()
    assert "Retry: 3 of 3 selected failed executions changed." in \
        page.locator(".messagelist").inner_text()
    assert Execution.objects.filter(worker="touch", state=State.UNFINISHED).count() == len(items)


def test_cancel_a_running_task_and_see_supervisors_and_dashboard(page, shots, runworkers):
    superuser()
    tasks.always_fails.enqueue()
    run_until_idle(tasks=True, worker_names=[])  # a failure for the dashboard
    later = tasks.add.using(run_after=timezone.now() + timezone.timedelta(hours=1)).enqueue(1, 2)
    TaskRecord.objects.filter(pk=later.id).update(progress=42.0, progress_message="half way")
    result = tasks.long_running.enqueue(60)
    worker = runworkers("--queue", "slow", "--concurrency", "1", lease=3)
    wait_for(lambda: Effect.objects.filter(worker="long_running").exists(),
             what="the task to start")
    log_in(page, "admin")

    page.goto("/admin/django_dbworker/supervisor/")
    wait_for(lambda: page.reload() or "1 of 1" in page.locator(".field-busy").inner_text(),
             what="the supervisor's heartbeat to show the running task")
    assert "alive" in page.locator("#result_list .dbw-status").first.inner_text()
    shots(page, "09-supervisors")
    page.locator("#result_list tbody tr th a").first.click()
    assert "long_running" in page.locator(".field-running_table").inner_text()
    shots(page, "10-supervisor-detail")

    page.goto("/admin/django_dbworker/dashboard/")
    assert page.locator("#dbw-queues").count() == 1
    assert "builtins.ValueError" in page.locator("#dbw-failures").inner_text()
    shots(page, "11-dashboard")

    page.goto("/admin/django_dbworker/taskrecord/")
    assert page.locator("[role=progressbar][aria-valuenow='42']").count() == 1
    shots(page, "12-tasks-list")

    page.goto(f"/admin/django_dbworker/taskrecord/{result.id}/change/")
    assert page.locator(".field-status_badge .dbw-status").inner_text() == "running"
    run_action(page, "Cancel this task")
    assert "Cancel: 1 of 1 selected tasks changed." in page.locator(".messagelist").inner_text()
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.CANCELLED,
             timeout=15, what="the supervisor to stop the cancelled task")
    page.reload()
    assert page.locator(".field-status_badge .dbw-status").inner_text() == "cancelled"
    assert "TaskCancelled" in page.locator(".field-errors_display").inner_text()
    shots(page, "13-task-cancelled")
    worker.signal(15)
    assert worker.wait(30) == 0, worker.output()


def test_staff_without_change_permission_sees_no_action_and_a_forged_post_gets_403(page, shots):
    item = Item.objects.create(action="raise")
    run_until_idle(["touch"])
    execution = Execution.objects.get(worker="touch", source_id=str(item.pk))
    user = User.objects.create_user("viewer", password="pw", is_staff=True)
    for codename in ("view_execution", "view_taskrecord"):
        user.user_permissions.add(Permission.objects.get(codename=codename))
    log_in(page, "viewer")
    page.goto("/admin/django_dbworker/execution/?worker=touch")
    assert page.locator("select[name=action]").count() == 0
    assert page.locator("#result_list .dbw-status-failed").count() == 1
    shots(page, "14-view-only-list")
    page.goto(f"/admin/django_dbworker/execution/{execution.pk}/change/")
    assert page.locator("select[name$=action]").count() == 0
    assert "Traceback" in page.locator(".dbw-traceback").inner_text()
    # Forge the action form the page does not offer, with this session's CSRF token.
    token = page.context.cookies()
    csrf = next(c["value"] for c in token if c["name"] == "csrftoken")
    with page.expect_navigation() as navigation:
        page.evaluate("""([csrf, pk]) => {
            const form = document.createElement('form');
            form.method = 'post';
            form.action = '/admin/django_dbworker/execution/';
            for (const [name, value] of [['csrfmiddlewaretoken', csrf],
                    ['action', 'retry_failed'], ['index', '0'], ['_selected_action', pk]]) {
                const input = document.createElement('input');
                input.type = 'hidden'; input.name = name; input.value = value;
                form.appendChild(input);
            }
            document.body.appendChild(form);
            form.submit();
        }""", [csrf, str(execution.pk)])
    assert navigation.value.status == 403
    assert re.search(r"403|Forbidden", page.content())
    shots(page, "15-forged-post-403")
    execution.refresh_from_db()
    assert execution.state == State.FAILED


def test_delete_selected_leaves_a_running_task_and_says_to_cancel_first(page, shots):
    superuser()
    running, ready = tasks.add.enqueue(1, 1), tasks.add.enqueue(2, 2)
    TaskRecord.objects.filter(pk=running.id).update(status=TaskStatus.RUNNING)
    log_in(page, "admin")
    page.goto("/admin/django_dbworker/taskrecord/")
    page.locator("#action-toggle").check()
    page.locator("select[name$=action]").first.select_option(value="delete_selected")
    page.locator("button[name=index]").first.click()
    page.wait_for_load_state()
    assert "1 running task(s) not deleted: they are running; cancel them first" in \
        page.locator(".messagelist").inner_text()
    shots(page, "12-delete-selected-skips-running")
    page.locator("input[type=submit]").last.click()  # "Yes, I'm sure"
    page.wait_for_load_state()
    assert "Successfully deleted 1" in page.locator(".messagelist").inner_text()
    assert list(TaskRecord.objects.values_list("pk", flat=True)) == [
        TaskRecord.objects.get(pk=running.id).pk]
    assert not TaskRecord.objects.filter(pk=ready.id).exists()


def test_pause_a_queue_from_the_dashboard_and_resume_it(page, shots):
    from django_dbworker.models import Pause

    superuser()
    log_in(page, "admin")
    page.goto("/admin/django_dbworker/dashboard/")
    row = page.locator("#dbw-queues tr", has=page.locator("th a", has_text="emails"))
    row.locator("a.dbw-pause-link", has_text="pause").click()
    assert page.locator("#id_name").input_value() == "emails"
    page.fill("#id_reason", "mail server down")
    page.click("input[name=_save]")
    page.wait_for_load_state()
    pause = Pause.objects.get()
    assert (pause.kind, pause.name, pause.reason) == ("queue", "emails", "mail server down")
    page.goto("/admin/django_dbworker/dashboard/")
    assert "since" in row.locator(".dbw-status-paused").inner_text()
    shots(page, "14-dashboard-paused")
    row.locator("a.dbw-pause-link", has_text="resume").click()
    page.click("input[type=submit]")  # "Yes, I'm sure"
    page.wait_for_load_state()
    assert not Pause.objects.exists()
