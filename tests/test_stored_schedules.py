"""Schedules stored in the database: one validation for the admin form, the CLI and the
supervisors; a change takes effect at the next tick without a restart; once per tick across
supervisors; name clashes with code schedules; wrong rows logged and skipped at run time."""

import json
import logging
import signal
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from django_dbworker.checks import check_stored_schedules
from django_dbworker.exceptions import InvalidSchedule
from django_dbworker.models import StoredSchedule, Supervisor, TaskRecord, TaskStatus
from django_dbworker.tasks.scheduler import Scheduler
from django_dbworker.tasks.stored_schedules import StoredSource, problems, to_schedule
from tests.conftest import wait_for
from tests.testapp.models import Effect

T0 = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
ADD = "tests.testapp.tasks.add"
LIST = reverse("admin:django_dbworker_storedschedule_changelist")
ADD_PAGE = reverse("admin:django_dbworker_storedschedule_add")


def row(name="sched_m", saved=T0 - timedelta(hours=1), **fields):
    """A row written directly (no validation), saved at ``saved``."""
    values = {"task_path": ADD, "cron": "* * * * *", "args": [1, 2], **fields}
    return StoredSchedule.objects.create(name=name, created_at=saved, updated_at=saved,
                                         **values)


def saved_at(name, when, **changes):
    StoredSchedule.objects.filter(name=name).update(updated_at=when, **changes)


def scheduler(now=T0, **kwargs):
    return Scheduler({}, now=now, stored=StoredSource(), **kwargs)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def keys(name="sched_m"):
    return [k[len(f"cron:{name}:"):] for k in TaskRecord.objects.filter(schedule=name)
            .order_by("idempotency_key").values_list("idempotency_key", flat=True)]


@pytest.fixture
def code_schedule(settings):
    settings.DBWORKER = {**settings.DBWORKER, "SCHEDULES": {
        "sched_code": {"task": ADD, "cron": "0 3 * * *", "args": [5, 5]}}}


def run(*args, answer=None, monkeypatch=None):
    out = StringIO()
    if answer is not None:
        monkeypatch.setattr("builtins.input", lambda prompt="": answer)
    call_command("dbworker", "schedules", *args, stdout=out)
    return out.getvalue()


def run_json(*args, **kwargs):
    doc = json.loads(run(*args, "--json", **kwargs))
    assert doc["version"] == 1 and doc["command"] == "schedules"
    return doc


# ----- validation --------------------------------------------------------------------------

def test_every_wrong_field_is_named_with_its_value_and_the_fix():
    bad = StoredSchedule(name="bad name!", task_path="tests.testapp.tasks.sched_gone",
                         cron="61 * * * *", time_zone="Mars/Olympus", args={"a": 1},
                         kwargs=[1], misfire="often", misfire_window=-1.0)
    found = problems(bad)
    assert set(found) == {"name", "task_path", "cron", "time_zone", "args", "kwargs",
                          "misfire", "misfire_window"}
    assert "'bad name!'" in found["name"] and "letters, digits" in found["name"]
    assert "'tests.testapp.tasks.sched_gone' is not a registered task" in found["task_path"]
    assert "'61 * * * *' is not a valid cron expression" in found["cron"]
    assert "out of range" in found["cron"], "croniter's reason"
    assert "'Mars/Olympus' is not a known time zone" in found["time_zone"]
    assert "{'a': 1} is not a JSON list" in found["args"]
    assert "[1] is not a JSON object" in found["kwargs"]
    assert "'often'" in found["misfire"] and "skip, latest, all" in found["misfire"]
    assert "-1.0" in found["misfire_window"] and "31 days" in found["misfire_window"]
    with pytest.raises(InvalidSchedule, match="Stored schedule 'bad name!' is invalid") as e:
        to_schedule(bad)
    assert e.value.problems == found
    never = StoredSchedule(name="n", task_path=ADD, cron="0 0 30 2 *")
    assert "never fires" in problems(never)["cron"]
    assert "Exactly 5, 6 or 7 columns" in problems(
        StoredSchedule(name="n", task_path=ADD, cron="every day"))["cron"]
    nul = StoredSchedule(name="n", task_path=ADD, cron="* * * * *", args=["a\x00b"])
    assert "NUL" in problems(nul)["args"]
    good = StoredSchedule(name="n", task_path=ADD, cron="0 9 * * *", time_zone="Asia/Tokyo",
                          args=[1, 2])
    assert problems(good) == {}
    assert to_schedule(good).next(T0) == datetime(2026, 12, 1, 0, 0, tzinfo=UTC)


# ----- the command -------------------------------------------------------------------------

@pytest.mark.django_db
def test_cli_add_list_edit_enable_disable_remove(code_schedule, monkeypatch):
    doc = run_json("add", "sched_nightly", "--task", ADD, "--cron", "0 3 * * *",
                   "--args", "[1, 2]", "--kwargs", "{}", "--timezone", "Europe/Paris")
    s = doc["schedule"]
    assert doc["action"] == "add" and doc["changed"] is True
    assert (s["name"], s["source"], s["enabled"], s["problem"]) == (
        "sched_nightly", "stored", True, None)
    assert s["next_run"].endswith(("T03:00:00+01:00", "T03:00:00+02:00"))
    listed = run_json("list")["schedules"]
    assert [(x["name"], x["source"]) for x in listed] == [
        ("sched_code", "code"), ("sched_nightly", "stored")]
    assert listed[0]["next_run"] is not None and listed[0]["args"] == [5, 5]
    text = run()
    assert "sched_code" in text and "code" in text and "sched_nightly" in text
    doc = run_json("edit", "sched_nightly", "--cron", "*/5 * * * *", "--args", "[3, 4]")
    assert doc["schedule"]["cron"] == "*/5 * * * *"
    r = StoredSchedule.objects.get(name="sched_nightly")
    assert (r.cron, r.args, r.time_zone) == ("*/5 * * * *", [3, 4], "Europe/Paris")
    assert run_json("disable", "sched_nightly")["schedule"]["next_run"] is None
    assert not StoredSchedule.objects.get(name="sched_nightly").enabled
    assert "was disabled already" in run("disable", "sched_nightly")
    assert run_json("enable", "sched_nightly")["changed"] is True
    with pytest.raises(CommandError, match="not confirmed"):
        run("remove", "sched_nightly", answer="n", monkeypatch=monkeypatch)
    assert StoredSchedule.objects.filter(name="sched_nightly").exists()
    assert "Removed 'sched_nightly'" in run("remove", "sched_nightly", "--yes")
    assert not StoredSchedule.objects.exists()


BAD_CLI = [
    (["--cron", "61 * * * *"],
     r"--cron: '61 \* \* \* \*' is not a valid cron expression \(\[61 \* \* \* \*\] is not "
     r"acceptable, out of range\)"),
    (["--cron", "0 0 30 2 *"], "never fires"),
    (["--timezone", "Mars/Olympus"], "--timezone: 'Mars/Olympus' is not a known time zone"),
    (["--task", "tests.testapp.tasks.sched_gone"],
     "--task: 'tests.testapp.tasks.sched_gone' is not a registered task"),
    (["--args", '{"a": 1}'], r"--args: \{'a': 1\} is not a JSON list"),
    (["--args", "[1,"], r"--args '\[1,' is not JSON"),
    (["--kwargs", "[1]"], r"--kwargs: \[1\] is not a JSON object"),
    (["--misfire", "often"], "--misfire: 'often' is not a misfire policy"),
    (["--misfire-window", "nan"], "--misfire-window: nan is not a misfire window"),
    (["--misfire-window", "abc"], "--misfire-window 'abc' is not a number"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("options", "message"), BAD_CLI)
def test_cli_refuses_bad_values_and_writes_nothing(options, message):
    good = {"--task": ADD, "--cron": "* * * * *"}
    given = dict(zip(options[::2], options[1::2], strict=True))
    args = [x for k, v in {**good, **given}.items() for x in (k, v)]
    with pytest.raises(CommandError, match=message):
        run("add", "sched_x", *args)
    assert not StoredSchedule.objects.exists()
    run("add", "sched_x", "--task", ADD, "--cron", "* * * * *", "--args", "[1, 2]")
    before = StoredSchedule.objects.values().get()
    with pytest.raises(CommandError, match=message):
        run("edit", "sched_x", *options)
    assert StoredSchedule.objects.values().get() == before, "the row is as it was"


@pytest.mark.django_db
def test_cli_refuses_names_that_are_taken_missing_or_in_code(code_schedule):
    with pytest.raises(CommandError, match="'sched_code' is the name of a schedule declared "
                       "in code"):
        run("add", "sched_code", "--task", ADD, "--cron", "* * * * *")
    with pytest.raises(CommandError, match="'sched_code' is declared in code"):
        run("edit", "sched_code", "--cron", "* * * * *")
    with pytest.raises(CommandError, match="No stored schedule is named 'sched_none'"):
        run("disable", "sched_none")
    with pytest.raises(CommandError, match="needs --cron"):
        run("add", "sched_x", "--task", ADD)
    with pytest.raises(CommandError, match="needs the schedule's NAME"):
        run("add")
    with pytest.raises(CommandError, match="'bad name' is not a schedule name"):
        run("add", "bad name", "--task", ADD, "--cron", "* * * * *")
    run("add", "sched_x", "--task", ADD, "--cron", "* * * * *")
    with pytest.raises(CommandError, match="a stored schedule named 'sched_x' exists already"):
        run("add", "sched_x", "--task", ADD, "--cron", "0 * * * *")
    assert StoredSchedule.objects.get().cron == "* * * * *"


# ----- the admin ---------------------------------------------------------------------------

def form(**fields):
    return {"name": "sched_a", "task_path": ADD, "cron": "0 8 * * *", "time_zone": "",
            "args": "[1, 2]", "kwargs": "{}", "enabled": "on", "misfire": "skip",
            "misfire_window": "3600", **fields}


@pytest.mark.django_db
def test_admin_form_refuses_bad_values_field_by_field(admin_client, code_schedule):
    page = admin_client.post(ADD_PAGE, form(
        cron="61 * * * *", time_zone="Mars/Olympus", task_path="tests.testapp.tasks.gone",
        args='{"a": 1}', name="sched_code"))
    assert page.status_code == 200
    errors = page.context["adminform"].form.errors
    assert set(errors) == {"name", "task_path", "cron", "time_zone", "args"}
    assert "out of range" in errors["cron"][0]
    assert "declared in code" in errors["name"][0]
    assert not StoredSchedule.objects.exists()
    page = admin_client.post(ADD_PAGE, form(args="[1,"))
    assert "Enter a valid JSON." in page.context["adminform"].form.errors["args"]
    assert not StoredSchedule.objects.exists()


@pytest.mark.django_db
def test_admin_saves_lists_next_run_and_enables_disables(admin_client):
    assert admin_client.get(ADD_PAGE).status_code == 200
    page = admin_client.post(ADD_PAGE, form(kwargs=""))
    assert page.status_code == 302, page.context["adminform"].form.errors
    r = StoredSchedule.objects.get()
    assert (r.args, r.kwargs, r.enabled) == ([1, 2], {}, True)
    assert r.updated_at > T0
    listing = admin_client.get(LIST).content.decode()
    assert "sched_a" in listing and "0 8 * * *" in listing and " 08:00:00 " in listing
    change = reverse("admin:django_dbworker_storedschedule_change", args=[r.pk])
    assert " 08:00:00 " in admin_client.get(change).content.decode(), "next run on its page"
    post = {"action": "disable_schedules", "index": "0", "_selected_action": [str(r.pk)]}
    admin_client.post(LIST, post)
    assert not StoredSchedule.objects.get().enabled
    assert "disabled" in admin_client.get(LIST).content.decode()
    admin_client.post(LIST, {**post, "action": "enable_schedules"})
    assert StoredSchedule.objects.get().enabled
    row("sched_broken", task_path="tests.testapp.tasks.gone")
    listing = admin_client.get(LIST).content.decode()
    assert "not run: Stored schedule &#x27;sched_broken&#x27; is invalid" in listing


@pytest.mark.django_db
def test_admin_actions_need_the_change_permission(client):
    from django.contrib.auth.models import Permission, User

    user = User.objects.create_user("staff", password="pw", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_storedschedule"))
    client.force_login(user)
    r = row("sched_v")
    page = client.get(LIST).content.decode()
    assert "sched_v" in page and "disable_schedules" not in page
    forged = client.post(LIST, {"action": "disable_schedules", "index": "0",
                                "_selected_action": [str(r.pk)]})
    assert forged.status_code == 403 and StoredSchedule.objects.get().enabled


# ----- at run time -------------------------------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_a_stored_schedule_enqueues_each_tick():
    row()
    s = scheduler()
    assert s.tick(at(61)) == 1
    assert s.tick(at(125)) == 1
    assert keys() == ["2026-11-30T12:01:00+00:00", "2026-11-30T12:02:00+00:00"]
    assert all(r.args == [1, 2] for r in TaskRecord.objects.all())


@pytest.mark.django_db(transaction=True)
def test_edit_disable_enable_delete_take_effect_at_the_next_tick():
    row()
    s = scheduler()
    assert s.tick(at(61)) == 1                                       # 12:01
    saved_at("sched_m", at(90), args=[7, 8])
    assert s.tick(at(121)) == 1                                      # 12:02, new args
    assert TaskRecord.objects.get(idempotency_key__endswith="12:02:00+00:00").args == [7, 8]
    saved_at("sched_m", at(150), cron="*/5 * * * *")
    assert s.tick(at(181)) == 0 and s.tick(at(301)) == 1             # 12:05 only
    saved_at("sched_m", at(310), enabled=False)
    assert s.tick(at(601)) == 0                                      # 12:10 not run
    saved_at("sched_m", at(620), enabled=True)
    assert s.tick(at(901)) == 1                                      # 12:15
    StoredSchedule.objects.all().delete()
    assert s.tick(at(1201)) == 0 and "sched_m" not in s.schedules    # 12:20 not run
    assert keys() == ["2026-11-30T12:01:00+00:00", "2026-11-30T12:02:00+00:00",
                      "2026-11-30T12:05:00+00:00", "2026-11-30T12:15:00+00:00"]
    row("sched_new", saved=at(1210))
    assert s.tick(at(1261)) == 1, "a new row runs from its next tick"


@pytest.mark.django_db(transaction=True)
def test_misfires_reach_back_to_the_last_save_and_an_edit_fires_no_burst():
    row(saved=T0 - timedelta(minutes=30), misfire="all", misfire_window=3600.0)
    s = scheduler()
    assert s.tick(at(1)) == 30, "11:31 to 12:00: from the save, not the hour before"
    saved_at("sched_m", at(600), cron="*/2 * * * *")
    # nothing ran since 12:00:01; the edit counts from its save at 12:10, not from then
    assert s.tick(at(601)) == 0
    assert s.tick(at(721)) == 1                                      # 12:12
    saved_at("sched_m", T0 - timedelta(days=1), cron="* * * * *")   # edited behind our back
    assert s.tick(at(900)) == 1, "no further back than the last minute: 12:14 only"


@pytest.mark.django_db(transaction=True)
def test_each_tick_once_across_two_supervisors():
    row()
    a, b = scheduler(), scheduler()
    assert a.tick(at(61)) + b.tick(at(61)) == 1
    saved_at("sched_m", at(90), cron="*/2 * * * *")
    assert b.tick(at(125)) + a.tick(at(125)) == 1
    assert keys() == ["2026-11-30T12:01:00+00:00", "2026-11-30T12:02:00+00:00"]


@pytest.mark.django_db(transaction=True)
def test_the_code_schedule_wins_a_name_clash_and_it_is_logged_once(code_schedule, caplog):
    from django_dbworker.tasks.schedules import schedules

    row("sched_code")  # written behind the CLI's and the admin's back
    s = Scheduler(schedules(), now=T0, stored=StoredSource())
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        assert s.tick(at(61)) == 0 and s.tick(at(121)) == 0
    assert s.schedules["sched_code"].cron == "0 3 * * *"
    lines = [r.getMessage() for r in caplog.records
             if r.getMessage().startswith("stored_schedule_shadowed")]
    assert len(lines) == 1 and "schedule=sched_code" in lines[0]


@pytest.mark.django_db(transaction=True)
def test_wrong_rows_are_logged_once_and_skipped_the_others_go_on(caplog):
    row("sched_gone", task_path="tests.testapp.tasks.sched_gone")
    row("sched_cron", cron="61 * * * *")
    row("sched_zone", time_zone="Mars/Olympus")
    row("sched_args", args={"a": 1})
    row("sched_kwargs", kwargs="x")
    row("sched_good")
    s = scheduler()
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        assert s.tick(at(61)) == 1 and s.tick(at(121)) == 1
    lines = {r.getMessage().split()[1]: r.getMessage() for r in caplog.records
             if r.getMessage().startswith("stored_schedule_invalid")}
    assert len([r for r in caplog.records if "stored_schedule_invalid" in r.getMessage()]) == 5
    assert "is not a registered task" in lines["schedule=sched_gone"]
    assert "out of range" in lines["schedule=sched_cron"]
    assert "Mars/Olympus" in lines["schedule=sched_zone"]
    assert "is not a JSON list" in lines["schedule=sched_args"]
    assert "is not a JSON object" in lines["schedule=sched_kwargs"]
    assert set(TaskRecord.objects.values_list("schedule", flat=True)) == {"sched_good"}
    saved_at("sched_cron", at(130), cron="*/2 * * * *")            # fixed: runs next tick
    assert s.tick(at(181)) == 1 and s.tick(at(241)) == 2


@pytest.mark.django_db
def test_an_enabled_row_whose_task_is_not_registered_is_system_check_w006():
    """``save()`` does not refuse such a row (a model cannot know the tasks, and a deploy may
    remove a task after its row was saved): the admin and the command refuse to save one,
    and one that is wrong later is W006 of ``check --database``, beside its problem in the
    admin and in ``dbworker schedules``; supervisors log it once per version."""
    row("sched_gone", task_path="tests.testapp.tasks.sched_gone")
    row("sched_off", task_path="tests.testapp.tasks.sched_gone", enabled=False)
    row("sched_good")
    warnings = check_stored_schedules(databases=["default"])
    assert [(w.id, w.obj.name) for w in warnings] == [("django_dbworker.W006", "sched_gone")]
    assert warnings[0].msg.startswith(
        "Stored schedule 'sched_gone' (task 'tests.testapp.tasks.sched_gone') is enabled but "
        "not run: task_path: 'tests.testapp.tasks.sched_gone' is not a registered task")
    assert "dbworker schedules edit sched_gone --task PATH" in warnings[0].hint
    assert check_stored_schedules(databases=None) == []  # a database check only
    err = StringIO()
    call_command("check", "--database", "default", stdout=StringIO(), stderr=err)
    assert "django_dbworker.W006" in err.getvalue()
    (listed,) = [s for s in run_json()["schedules"] if s["name"] == "sched_gone"]
    assert "is not a registered task" in listed["problem"]


@pytest.mark.processes
def test_a_schedule_stored_while_two_supervisors_run(runworkers):
    a = runworkers("--concurrency", "1")
    b = runworkers("--concurrency", "1")
    wait_for(lambda: Supervisor.objects.alive().count() == 2, timeout=30,
             what="both supervisors up")
    call_command("dbworker", "schedules", "add", "sched_sec", "--task",
                 "tests.testapp.tasks.tick", "--cron", "* * * * * *", stdout=StringIO())
    wait_for(lambda: TaskRecord.objects.filter(schedule="sched_sec",
                                               status=TaskStatus.SUCCESSFUL).count() >= 3,
             timeout=30, what="three ticks of the stored schedule run")
    call_command("dbworker", "schedules", "disable", "sched_sec", stdout=StringIO())
    stopped = TaskRecord.objects.filter(schedule="sched_sec").count()
    for p in (a, b):
        p.signal(signal.SIGTERM)
        assert p.wait(30) == 0
    rows = list(TaskRecord.objects.filter(schedule="sched_sec").order_by("idempotency_key"))
    assert len(rows) <= stopped + 2, "disabled: at most the round under way enqueues"
    assert len({r.idempotency_key for r in rows}) == len(rows)
    span = (rows[-1].enqueued_at - rows[0].enqueued_at).total_seconds()
    assert len(rows) <= span + 2, "one task per tick, not two"
    done = TaskRecord.objects.filter(schedule="sched_sec", status=TaskStatus.SUCCESSFUL)
    assert Effect.objects.filter(worker="tick").count() == done.count()
