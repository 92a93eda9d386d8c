"""Pausing and resuming a task queue or a row worker at runtime: the Python API, the
command, the admin, what health/metrics/stats show, claims in process and under a real
runworkers."""

import json
import time
import uuid
from collections import Counter
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

import django_dbworker
from django_dbworker import conf, pause, paused, resume, workers
from django_dbworker.exceptions import InvalidPause
from django_dbworker.insight import health, snapshot
from django_dbworker.models import Execution, Pause, State, Supervisor, TaskRecord, TaskStatus
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.testing import run_until_idle
from django_dbworker.units.claimant import Claimant
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Item

db = pytest.mark.django_db


def mark(queue, label="x", seconds=0.0):
    return tasks.pausing_mark.using(queue_name=queue).enqueue(label, seconds)


# ----- the Python API ---------------------------------------------------------------------


@db
def test_pause_twice_keeps_the_first_and_resume_says_whether_it_was_paused():
    first = pause(queue="emails", reason="mail server down")
    assert first.new and first.kind == "queue" and first.name == "emails"
    again = pause(queue="emails", reason="another reason")
    assert not again.new and again.since == first.since and again.reason == "mail server down"
    pause(worker="touch")
    assert [(p.kind, p.name) for p in paused()] == [("queue", "emails"), ("worker", "touch")]
    assert [p.name for p in paused("worker")] == ["touch"]
    ended = resume(queue="emails")
    assert ended is not None and ended.since == first.since
    assert resume(queue="emails") is None, "resuming what is not paused is not an error"
    assert resume(worker="touch") is not None and not Pause.objects.exists()
    assert django_dbworker.pause is pause and "resume" in django_dbworker.__all__


@db
@pytest.mark.parametrize(("call", "message"), [
    (lambda: pause(queue="nope"), r"Unknown queue 'nope': the task queues are \['default', "
     r"'emails', 'slow'\]\. Use one of those, or add it to TASKS\[\.\.\.\]\['QUEUES'\]"),
    (lambda: pause(worker="nope"), r"Unknown worker 'nope': the registered workers are "
     r"\[.*'touch'.*\]\. Check the spelling"),
    (lambda: pause(), r"Name exactly one of queue= or worker= \(got queue=None, worker=None\)"),
    (lambda: pause(queue="emails", worker="touch"), r"Name exactly one of queue= or worker="),
    (lambda: pause(queue="emails", reason="x" * 256), r"The reason is 256 characters long; "
     r"give at most 255"),
    (lambda: resume(queue="nope"), r"Unknown queue 'nope'"),
    (lambda: resume(worker="nope"), r"Unknown worker 'nope'"),
])
def test_bad_input_is_refused_naming_the_value_and_nothing_is_written(call, message):
    with pytest.raises(InvalidPause, match=message):
        call()
    assert not Pause.objects.exists()


@db
def test_a_pause_of_a_queue_removed_from_the_settings_can_still_be_resumed():
    Pause.objects.create(kind="queue", name="gone")
    with pytest.raises(InvalidPause, match="Unknown queue 'gone'"):
        pause(queue="gone")
    assert resume(queue="gone").name == "gone" and not Pause.objects.exists()


# ----- claims in process ----------------------------------------------------------------------


@db
def test_run_until_idle_leaves_paused_queues_and_workers_alone_until_resumed():
    mail, default = mark("emails"), mark("default")
    touched, loose = Item.objects.create(kind="touch"), Item.objects.create(kind="loose")
    pause(queue="emails")
    pause(worker="touch")
    run_until_idle()
    assert TaskRecord.objects.get(pk=mail.id).status == TaskStatus.READY
    assert TaskRecord.objects.get(pk=default.id).status == TaskStatus.SUCCESSFUL
    assert workers["touch"].state(touched.pk)["execution_status"] is None
    assert workers["loose"].state(loose.pk)["execution_status"] == "FINISHED"
    resume(queue="emails")
    resume(worker="touch")
    run_until_idle()
    assert TaskRecord.objects.get(pk=mail.id).status == TaskStatus.SUCCESSFUL
    assert workers["touch"].state(touched.pk)["execution_status"] == "FINISHED"


@db
def test_a_claim_of_every_queue_excludes_the_paused_ones_rate_limited_too():
    mail, default = mark("emails"), mark("default")
    paused_queues = frozenset({"emails"})
    claims = taskplanner.claim_limited(None, 10, Claimant(), 30, limits={
        "tests.testapp.tasks.pausing_mark": "100/s"}, global_limit=None,
        exclude_queues=paused_queues)
    assert [str(c.task_id) for c in claims] == [default.id]
    assert taskplanner.claim(None, 10, Claimant(), 30, exclude_queues=paused_queues) == []
    assert [str(c.task_id) for c in taskplanner.claim(["emails"], 10, Claimant(), 30)] == [mail.id]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("queues", [None, ["default", "slow", "emails"]])
def test_claims_around_a_paused_backlog_keep_the_claim_order(queues):
    """With tasks waiting in a paused queue, a claim of several queues goes queue by queue
    (``byqueue``, where the engine does) or filters: either way in claim order, none of
    the paused queue."""
    from django_dbworker.supervisor.pauses import Pauses
    from django_dbworker.supervisor.taskwork import TaskWork

    emails = tasks.pausing_mark.using(queue_name="emails", priority=9)
    emails.enqueue_many([(("e",), {})] * 5)
    default = [mark("default", f"d{i}") for i in range(3)]
    slow = tasks.pausing_mark.using(queue_name="slow", priority=5)
    urgent = [slow.enqueue(f"s{i}") for i in range(3)]
    pauses = Pauses(conf.get().DATABASE, 60.0)
    pauses.refresh(0.0)
    assert not pauses.backlog
    pause(queue="emails")
    pauses.refresh(0.0, announced=True)
    assert pauses.backlog and pauses.queues == {"emails"}
    work = TaskWork(queues, conf.get(), Claimant(), schedule=False)
    work.limits = {}  # the test app's rate-limited tasks are not these
    claims = work.claim(4, pauses.queues, backlog=pauses.backlog)
    assert [str(c.task_id) for c in claims] == [r.id for r in urgent] + [default[0].id]
    assert TaskRecord.objects.filter(queue_name="emails", status=TaskStatus.READY).count() == 5
    from django_dbworker.tasks import byqueue

    assert byqueue.shares(["default", "slow"], 2) == {"default": 2}


@pytest.mark.django_db(transaction=True)
def test_the_supervisor_claims_around_pauses_and_gives_back_what_it_claimed_ahead():
    from django_dbworker.supervisor.supervisor import Options
    from django_dbworker.supervisor.supervisor import Supervisor as Sup

    sup = Sup(Options(workers=[workers["touch"], workers["loose"]], tasks=True,
                      concurrency=1), conf.get(), None)
    by_name = {source.name: source for source in sup.sources}
    tasks_, touch = by_name["tasks"], by_name["touch"]
    try:
        mail, default = mark("emails"), mark("default")
        Item.objects.create(kind="touch")
        # claimed ahead before the pause: they wait here, not started
        ahead = sup._claim(tasks_, 10, Counter()) + sup._claim(touch, 10, Counter())
        assert len(ahead) == 3
        sup.prefetch.put(ahead, time.monotonic())
        pause(queue="emails")
        pause(worker="touch")
        sup._check_pauses(time.monotonic())  # read at once: its first read
        assert {str(getattr(c, "task_id", None)) for c in sup.prefetch.units()} == {default.id}
        assert TaskRecord.objects.get(pk=mail.id).status == TaskStatus.READY
        assert Execution.objects.get(worker="touch").state == State.PENDING
        sup._give_back(sup.prefetch.drain())
        assert sup._claim(touch, 10, Counter()) == []
        assert [str(c.task_id) for c in sup._claim(tasks_, 10, Counter())] == [default.id]
        resume(queue="emails")
        assert sup._claim(tasks_, 10, Counter()) == [], "not read again before POLL_INTERVAL"
        sup._announced.add("pause")  # what NOTIFY delivers
        sup._check_pauses(time.monotonic())
        assert [str(c.task_id) for c in sup._claim(tasks_, 10, Counter())] == [mail.id]
        assert sup._claim(touch, 10, Counter()) == []
        resume(worker="touch")
        sup._check_pauses(time.monotonic() + conf.get().POLL_INTERVAL)  # due again
        assert len(sup._claim(touch, 10, Counter())) == 1
    finally:
        sup._wake_r.close()
        sup._wake_w.close()


# ----- health, metrics, stats -------------------------------------------------------------


def beating():
    now = timezone.now()
    Supervisor.objects.create(id=uuid.uuid4(), host="h", pid=1, started_at=now,
                              last_heartbeat=now, heartbeat_expires_at=now + timedelta(seconds=30))


@db
def test_a_paused_queues_backlog_is_not_a_health_problem_and_shows_as_paused(client):
    beating()
    result = mark("emails")
    TaskRecord.objects.filter(pk=result.id).update(
        available_at=timezone.now() - timedelta(minutes=10))
    with override_settings(DBWORKER={"HEALTH_MAX_LAG": 60}):
        assert not health.verdict()["healthy"]
        info = pause(queue="emails")
        verdict = health.verdict()
        response = client.get(reverse("django_dbworker:health"))
    assert verdict["healthy"], verdict["problems"]
    assert verdict["lag_seconds"]["queue:emails"] >= 599, "its lag is still shown"
    assert verdict["paused"] == {"queue:emails": info.since.isoformat()}
    assert response.status_code == 200
    line = next(q for q in snapshot.take().queues if q.name == "emails")
    assert line.paused_since == info.since
    text = client.get(reverse("django_dbworker:metrics")).content.decode()
    samples = {(s.name, *s.labels.items()): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples["dbworker_paused_since_seconds", ("queue", "emails")] == pytest.approx(
        info.since.timestamp())
    assert ("dbworker_paused_since_seconds", ("queue", "default")) not in samples


# ----- the command ----------------------------------------------------------------------------


def run(*args):
    out = StringIO()
    call_command("dbworker", *args, stdout=out)
    return out.getvalue()


def run_json(*args):
    doc = json.loads(run(*args, "--json"))
    version = 2 if args[0] == "stats" and "--exact" not in args else 1  # docs/cli.md
    assert doc["version"] == version and doc["command"] == args[0]
    return doc


@db
def test_command_pause_resume_and_paused():
    doc = run_json("pause", "--queue", "emails", "--reason", "maintenance")
    assert doc["changed"] and doc["pause"]["name"] == "emails"
    assert doc["pause"]["kind"] == "queue" and doc["pause"]["reason"] == "maintenance"
    assert not run_json("pause", "--queue", "emails")["changed"]
    assert "was paused already" in run("pause", "--queue", "emails")
    assert run("pause", "--worker", "touch").startswith("Paused worker 'touch'")
    assert [(p["kind"], p["name"]) for p in run_json("paused")["pauses"]] == [
        ("queue", "emails"), ("worker", "touch")]
    assert "maintenance" in run("paused")
    stats = run_json("stats")
    assert next(q for q in stats["queues"] if q["name"] == "emails")["paused_since"]
    assert "Paused" in run("stats")
    doc = run_json("resume", "--queue", "emails")
    assert doc["changed"] and doc["pause"]["reason"] == "maintenance"
    again = run_json("resume", "--queue", "emails")
    assert not again["changed"] and again["pause"] is None and again["name"] == "emails"
    assert "was not paused: nothing changed" in run("resume", "--queue", "emails")
    run("resume", "--worker", "touch")
    assert run("paused") == "Nothing is paused.\n"


@db
@pytest.mark.parametrize(("args", "message"), [
    (["pause", "--queue", "nope"], "Unknown queue 'nope'"),
    (["pause", "--worker", "nope"], "Unknown worker 'nope'"),
    (["resume", "--queue", "nope"], "Unknown queue 'nope'"),
    (["pause", "--queue", "emails", "--reason", "x" * 300], "give at most 255"),
    (["pause"], "one of the arguments --queue --worker is required"),
    (["pause", "--queue", "emails", "--worker", "touch"], "not allowed with argument"),
])
def test_command_bad_input_is_a_command_error_and_writes_nothing(args, message):
    with pytest.raises(CommandError, match=message):
        run(*args)
    assert not Pause.objects.exists()


# ----- the admin ------------------------------------------------------------------------------

ADD = reverse("admin:django_dbworker_pause_add")


@db
def test_admin_adds_a_pause_validating_the_name_and_deleting_it_resumes(admin_client):
    page = admin_client.post(ADD, {"kind": "queue", "name": "nope", "reason": ""})
    assert page.status_code == 200 and "Unknown queue &#x27;nope&#x27;" in page.content.decode()
    assert not Pause.objects.exists()
    response = admin_client.post(ADD, {"kind": "worker", "name": "touch", "reason": "why"})
    assert response.status_code == 302
    row = Pause.objects.get()
    assert (row.kind, row.name, row.reason) == ("worker", "touch", "why")
    again = admin_client.post(ADD, {"kind": "worker", "name": "touch", "reason": ""})
    assert "is paused already" in again.content.decode() and Pause.objects.count() == 1
    listing = admin_client.get(reverse("admin:django_dbworker_pause_changelist"))
    assert "touch" in listing.content.decode() and "why" in listing.content.decode()
    delete = reverse("admin:django_dbworker_pause_delete", args=[row.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 302
    assert not Pause.objects.exists()


@db
def test_admin_bulk_delete_resumes_every_selected_pause(admin_client):
    pause(queue="emails")
    pause(worker="touch")
    response = admin_client.post(reverse("admin:django_dbworker_pause_changelist"), {
        "action": "delete_selected", "post": "yes", "index": "0",
        "_selected_action": [str(pk) for pk in Pause.objects.values_list("pk", flat=True)]})
    assert response.status_code == 302 and not paused()


@db
def test_dashboard_shows_paused_since_with_resume_and_pause_links(admin_client):
    info = pause(queue="emails")
    page = admin_client.get(reverse("admin:django_dbworker_dashboard_changelist")).content.decode()
    assert f"since {info.since:%Y-%m-%d %H:%M:%S}</span>" in page
    row = Pause.objects.get()
    assert reverse("admin:django_dbworker_pause_delete", args=[row.pk]) in page
    assert f"{ADD}?kind=queue&amp;name=default" in page
    assert f"{ADD}?kind=worker&amp;name=touch" in page
    prefilled = admin_client.get(ADD, {"kind": "queue", "name": "default"}).content.decode()
    assert 'value="default"' in prefilled


# ----- under a real runworkers ------------------------------------------------------------


def statuses(ids):
    return Counter(TaskRecord.objects.filter(pk__in=ids).values_list("status", flat=True))


@pytest.mark.processes
def test_a_queue_paused_while_tasks_flow_starts_nothing_more_until_resumed(runworkers):
    """Pause a queue while its tasks run: the running one finishes, none of the queue
    starts after the pause reached the supervisor (PostgreSQL: NOTIFY, tested with a 5 s
    POLL_INTERVAL so that only NOTIFY can be quick; elsewhere POLL_INTERVAL, 0.1 s here),
    other queues keep flowing, and after resume every task runs."""
    postgres = connection.vendor == "postgresql"
    poll = 5.0 if postgres else conf.get().POLL_INTERVAL
    reach = 1.0 if postgres else poll + 0.5
    long = mark("emails", "long", 1.5)
    flow = [mark("emails", f"e{i}", 0.05) for i in range(60)]
    ids = [long.id, *(r.id for r in flow)]
    p = runworkers("--concurrency", "2", "--queue", "emails", "--queue", "default",
                   extra_env={"DBWORKER_TEST_POLL": str(poll), "DBWORKER_TEST_PREFETCH": "4"})
    wait_for(lambda: statuses(ids)[TaskStatus.SUCCESSFUL] >= 5
             and TaskRecord.objects.get(pk=long.id).status == TaskStatus.RUNNING,
             timeout=60, what="tasks of emails to flow, the long one running")
    pause(queue="emails")
    paused_at = timezone.now()
    others = [mark("default", f"d{i}") for i in range(5)]
    wait_for(lambda: statuses([r.id for r in others])[TaskStatus.SUCCESSFUL] == 5, timeout=30,
             what="another queue to keep flowing")
    wait_for(lambda: TaskRecord.objects.get(pk=long.id).status != TaskStatus.RUNNING,
             timeout=30, what="the running task to finish")
    assert TaskRecord.objects.get(pk=long.id).status == TaskStatus.SUCCESSFUL
    time.sleep(reach + 0.5)
    late = TaskRecord.objects.filter(pk__in=ids, started_at__gt=paused_at + timedelta(
        seconds=reach))
    assert not late.exists(), (list(late.values_list("started_at", flat=True)), paused_at,
                               p.output())
    waiting = statuses(ids)
    assert waiting[TaskStatus.READY] > 0, waiting
    assert set(waiting) <= {TaskStatus.READY, TaskStatus.SUCCESSFUL}, waiting
    resume(queue="emails")
    wait_for(lambda: statuses(ids)[TaskStatus.SUCCESSFUL] == len(ids), timeout=60,
             what="every task of emails to run after resume")
