"""``manage.py dbworker``: reports, changes with confirmation, --json, and errors that name
the wrong ids, workers and queues."""

import json
import subprocess
import sys
import uuid
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from django_dbworker.models import Execution, State, Supervisor, TaskRecord, TaskStatus
from django_dbworker.testing import run_until_idle
from tests.conftest import ROOT
from tests.testapp import tasks
from tests.testapp.models import Item

pytestmark = pytest.mark.django_db


def run(*args, answer=None, monkeypatch=None):
    out = StringIO()
    if answer is not None:
        monkeypatch.setattr("builtins.input", lambda prompt="": answer)
    call_command("dbworker", *args, stdout=out)
    return out.getvalue()


def run_json(*args, **kwargs):
    doc = json.loads(run(*args, "--json", **kwargs))
    version = 2 if args[0] == "stats" and "--exact" not in args else 1  # docs/cli.md
    assert doc["version"] == version and doc["command"] == args[0]
    return doc


@pytest.fixture
def work():
    bad, good = Item.objects.create(action="raise"), Item.objects.create(action="ok")
    failing = tasks.always_fails.enqueue()
    ok = tasks.add.enqueue(1, 2)
    run_until_idle()
    return {"bad": bad, "good": good, "failing": failing, "ok": ok,
            "failed": Execution.objects.get(worker="touch", source_id=str(bad.pk))}


def test_stats_json_and_table(work):
    doc = run_json("stats")
    touch = next(w for w in doc["workers"] if w["name"] == "touch")
    assert touch["counts"]["FAILED"] == 1 and touch["counts"]["FINISHED"] == 1
    assert touch["throughput"]["15m"] == 2 and len(touch["per_minute"]) == 15
    default = next(q for q in doc["queues"] if q["name"] == "default")
    assert default["counts"]["SUCCESSFUL"] == 1 and default["counts"]["FAILED"] == 1
    classes = {(g["kind"], g["exception_class"]) for g in doc["failures"]}
    assert classes == {("execution", "builtins.ValueError"), ("task", "builtins.ValueError")}
    text = run("stats")
    assert "worker" in text and "touch" in text and "builtins.ValueError" in text
    only = run_json("stats", "--worker", "touch")
    assert [w["name"] for w in only["workers"]] == ["touch"] and only["queues"] == []


def test_dead_lists_executions_and_tasks_failed_for_good(work):
    doc = run_json("dead")
    assert [e["id"] for e in doc["executions"]] == [work["failed"].pk]
    assert [t["id"] for t in doc["tasks"]] == [str(work["failing"].id)]
    assert doc["executions"][0]["errors"][0]["exception_class"] == "builtins.ValueError"
    text = run("dead", "--tracebacks")
    assert "Traceback (most recent call last)" in text
    assert "1 execution(s) and 1 task(s) failed for good." in text
    assert run_json("dead", "--queue", "emails")["tasks"] == []


# Committed: MariaDB 10.11, inside the transaction that changed them, finds none of these
# rows through the claim index on its virtual column (a range scan that then reads
# ``status``), which its plan uses for --limit 2.
@pytest.mark.django_db(transaction=True)
def test_failed_lists_both_what_will_be_tried_again_and_what_failed_for_good(work):
    """PyBgWorker's words: ``failed`` lists what failed, the retrying (RETRYING, or given
    back after a crash) first, then the dead, each saying whether it will be tried again;
    ``dead`` lists the dead only. The meaning changed: the document is version 2."""
    later = tasks.slow_retry.enqueue()  # fails once, retried in an hour
    crashed = tasks.add.enqueue(2, 2)
    run_until_idle()
    TaskRecord.objects.filter(pk=crashed.id).update(status=TaskStatus.READY, crashes=1)
    doc = json.loads(run("failed", "--json"))
    assert doc["version"] == 2 and doc["command"] == "failed"
    assert [(t["id"], t["will_retry"]) for t in doc["tasks"]] == [
        (str(crashed.id), True), (str(later.id), True), (str(work["failing"].id), False)]
    assert [(e["id"], e["will_retry"]) for e in doc["executions"]] == [
        (work["failed"].pk, False)]
    assert doc["counts"] == {"executions": 1, "tasks": 3,
                             "will_retry": {"executions": 0, "tasks": 2}}
    text = run("failed")
    assert "will retry" in text and str(work["failing"].id) in text
    assert ("1 execution(s) and 3 task(s) failed: 0 and 2 will be tried again, the others "
            "failed for good.") in text
    limited = json.loads(run("failed", "--json", "--limit", "2"))
    assert [t["id"] for t in limited["tasks"]] == [str(crashed.id), str(later.id)]
    assert limited["counts"]["tasks"] == 3
    assert [t["id"] for t in run_json("dead")["tasks"]] == [str(work["failing"].id)]


def test_failed_retrying_is_the_version_1_document(work):
    """``failed --retrying`` keeps version 1's meaning: only what will be tried again."""
    later = tasks.slow_retry.enqueue()
    run_until_idle()
    doc = run_json("failed", "--retrying")
    assert [(t["id"], t["will_retry"]) for t in doc["tasks"]] == [(str(later.id), True)]
    assert doc["executions"] == [] and doc["counts"] == {"executions": 0, "tasks": 1}
    text = run("failed", "--retrying")
    assert "next try" in text and "0 execution(s) and 1 task(s) to be tried again." in text
    assert str(work["failing"].id) not in text


def test_inspect_units_and_overview(work):
    doc = run_json("inspect", str(work["failed"].pk), str(work["ok"].id))
    assert [u["kind"] for u in doc["units"]] == ["execution", "task"]
    assert doc["units"][1]["result"] == 3
    overview = run_json("inspect")
    assert {w["name"] for w in overview["workers"]} >= {"touch", "after_touch"}
    assert "emails" in overview["queues"]
    assert "Traceback" in run("inspect", str(work["failed"].pk))


def test_wrong_ids_workers_and_queues_are_named(work):
    missing = uuid.uuid4()
    with pytest.raises(CommandError, match=rf"999999 \(no execution has this id\); "
                                           rf"nope \(neither.*; {missing} \(no task has"):
        run("retry", "999999", "nope", str(missing), "--yes")
    with pytest.raises(CommandError, match=r"Unknown worker 'nobody' \(registered workers: "):
        run("reset", "nobody", "1", "--yes")
    with pytest.raises(CommandError, match=r"Unknown source row\(s\): 424242 \(worker 'touch'"):
        run("reset", "touch", "424242", "--yes")
    with pytest.raises(CommandError, match=r"abc \(not a primary key of testapp.Item\)"):
        run("reset", "touch", "abc", "--yes")
    with pytest.raises(CommandError, match=r"Unknown queue\(s\) 'nope' \(known: default, "):
        run("purge", "--queue", "nope", "--yes")
    with pytest.raises(CommandError, match=r"Unknown worker\(s\) 'ghost'"):
        run("stats", "--worker", "ghost")
    with pytest.raises(CommandError, match="Only tasks can be cancelled"):
        run("cancel", str(work["failed"].pk), "--yes")
    assert Execution.objects.get(pk=work["failed"].pk).state == State.FAILED


def test_retry_asks_and_changes_nothing_without_yes(work, monkeypatch):
    with pytest.raises(CommandError, match="Nothing was changed: not confirmed"):
        run("retry", str(work["failed"].pk), answer="n", monkeypatch=monkeypatch)
    assert Execution.objects.get(pk=work["failed"].pk).state == State.FAILED
    text = run("retry", str(work["failed"].pk), str(work["failing"].id), str(work["ok"].id),
               answer="y", monkeypatch=monkeypatch)
    assert "Retry 1 failed execution(s) and 1 failed or cancelled task(s)" in text
    assert "Changed 2." in text
    assert Execution.objects.get(pk=work["failed"].pk).state == State.UNFINISHED
    assert TaskRecord.objects.get(pk=work["failing"].id).status == TaskStatus.READY
    assert TaskRecord.objects.get(pk=work["ok"].id).status == TaskStatus.SUCCESSFUL


def test_reset_by_worker_and_source_row(work):
    doc = run_json("reset", "touch", str(work["bad"].pk), str(work["good"].pk), "--yes")
    assert doc["changed"] == 1 and doc["would_change"] == 1
    assert {i["id"]: i["will_change"] for i in doc["items"]} == {
        work["failed"].pk: True,
        Execution.objects.get(worker="touch", source_id=str(work["good"].pk)).pk: False}
    doc = run_json("reset", "touch", str(work["good"].pk), "--finished", "--yes")
    assert doc["changed"] == 1
    assert run_until_idle(["touch"])["finished"] == 1


def test_cancel_purge_and_prune(work):
    later = timezone.now() + timezone.timedelta(hours=1)
    waiting = [tasks.add.using(run_after=later).enqueue(i, i) for i in range(3)]
    email = tasks.send_email.using(run_after=later).enqueue("a@example.com")
    doc = run_json("cancel", str(waiting[0].id), "--yes")
    assert doc["changed"] == 1
    assert TaskRecord.objects.get(pk=waiting[0].id).status == TaskStatus.CANCELLED
    doc = run_json("purge", "--queue", "default", "--yes")
    assert doc["changed"] == 2 and TaskRecord.objects.filter(pk=email.id).exists()
    TaskRecord.objects.filter(pk=work["ok"].id).update(
        finished_at=timezone.now() - timezone.timedelta(days=30))
    now = timezone.now() - timezone.timedelta(days=30)
    Supervisor.objects.create(id=uuid.uuid4(), host="old", pid=1, started_at=now,
                              last_heartbeat=now, heartbeat_expires_at=now, stopped_at=now)
    doc = run_json("prune", "--older-than", str(7 * 86400), "--yes")
    assert doc["changed"] == 2
    assert not TaskRecord.objects.filter(pk=work["ok"].id).exists()
    assert not Supervisor.objects.exists()
    assert run_json("prune", "--yes")["changed"] == 0


def test_supervisors_and_the_dead_ones_with_what_they_held(work):
    now = timezone.now()
    Supervisor.objects.create(
        id=uuid.uuid4(), host="gone", pid=9, started_at=now, last_heartbeat=now,
        heartbeat_expires_at=now - timezone.timedelta(seconds=5), concurrency=1,
        running=[{"worker": "touch", "execution": work["failed"].pk, "source": "1",
                  "attempt": 1, "child": 10, "since": now.isoformat()}])
    Supervisor.objects.create(
        id=uuid.uuid4(), host="here", pid=8, started_at=now, last_heartbeat=now,
        heartbeat_expires_at=now + timezone.timedelta(seconds=30), concurrency=2)
    doc = run_json("supervisors", "--dead")
    assert [s["host"] for s in doc["supervisors"]] == ["gone"]
    assert doc["supervisors"][0]["running"][0]["status_now"] == "FAILED"
    assert "gone:9" in run("supervisors", "--dead")
    every = run_json("supervisors")
    assert {(s["host"], s["state"]) for s in every["supervisors"]} == {
        ("gone", "dead"), ("here", "alive")}
    assert "here:8" in run("supervisors")


@pytest.mark.processes
def test_real_command_line_exit_codes_and_prompt(runworkers):
    """A subprocess: CommandError exits non-zero; the question is answered on stdin."""
    from django.db import connection

    result = tasks.add.enqueue(1, 1)
    TaskRecord.objects.filter(pk=result.id).update(status=TaskStatus.FAILED)
    env = {"DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"], "PYTHONPATH": str(ROOT)}

    def cli(*args, stdin=""):
        import os

        return subprocess.run(
            [sys.executable, "-m", "django", "dbworker", "--settings=tests.settings", *args],
            cwd=ROOT, env={**os.environ, **env}, input=stdin, capture_output=True, text=True,
            timeout=60)

    wrong = cli("retry", "12345")
    assert wrong.returncode != 0 and "12345 (no execution has this id)" in wrong.stderr
    refused = cli("retry", str(result.id))
    assert refused.returncode != 0 and "not confirmed" in refused.stderr
    assert "Retry 0 failed execution(s) and 1" in refused.stdout
    done = cli("retry", str(result.id), "--json", stdin="y\n")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["changed"] == 1
    assert TaskRecord.objects.get(pk=result.id).status == TaskStatus.READY


# ----- ids, numbers and durations that once raised tracebacks --------------------------------


@pytest.mark.parametrize("raw, why", [
    ("²", r"'?²'? \(not an id: an execution id is a whole number written with the digits "
          r"0-9, a task id a UUID\)"),
    ("١٢", r"١٢ \(not an id: an execution id is a whole number written with the digits 0-9"),
    ("99999999999999999999", r"99999999999999999999 \(out of range: execution ids are "
                             r"whole numbers from 1 to 9223372036854775807\)"),
    ("9223372036854775808", r"9223372036854775808 \(out of range"),
    ("0", r"0 \(out of range"),
    ("a\x00b", r"'a\\x00b' \(neither an execution id"),
])
@pytest.mark.parametrize("command", ["retry", "cancel", "inspect"])
def test_bad_ids_are_command_errors_naming_the_value(work, command, raw, why):
    args = [command, raw] + (["--yes"] if command != "inspect" else [])
    with pytest.raises(CommandError, match=rf"Unknown id\(s\): {why}"):
        run(*args)


def test_an_execution_id_at_the_top_of_the_range_is_looked_up(work):
    with pytest.raises(CommandError, match=r"9223372036854775807 \(no execution has this id\)"):
        run("retry", "9223372036854775807", "--yes")


@pytest.mark.parametrize("raw", ["²", "99999999999999999999", "-1"])
def test_bad_source_keys_are_command_errors(work, raw):
    with pytest.raises(CommandError, match=r"Unknown source row\(s\): "):
        run("reset", "touch", "--yes", "--", raw)


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "-5", "0", "1e300"])
def test_prune_older_than_must_be_a_finite_positive_duration(work, raw):
    with pytest.raises(CommandError, match=r"--older-than .*: give a number of seconds greater "
                                           r"than 0 and at most 3153600000 \(100 years\)"):
        run("prune", f"--older-than={raw}", "--yes")
    assert TaskRecord.objects.count() == 2


def test_prune_older_than_the_longest_allowed_runs(work):
    assert "Changed 0" in run("prune", "--older-than", "3153600000", "--yes")


@pytest.mark.parametrize("raw", ["99999999999999999999", "-1"])
def test_failed_limit_out_of_range_is_a_command_error(work, raw):
    with pytest.raises(CommandError, match=rf"--limit {raw}: give a whole number from 0 to "):
        run("failed", f"--limit={raw}")


@pytest.mark.parametrize("raw", ["nan", "inf", "-1"])
def test_runworkers_grace_period_must_be_finite(raw):
    with pytest.raises(CommandError, match=r"--grace-period .*: give 0 or more seconds, at "
                                           r"most 31536000 \(one year\)"):
        call_command("runworkers", f"--grace-period={raw}", "--burst")


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_bad_values_on_a_real_command_line_exit_without_a_traceback():
    import os

    from django.db import connection

    env = {**os.environ, "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
           "PYTHONPATH": str(ROOT)}
    for args, named in [(["retry", "²", "--yes"], "²"),
                        (["cancel", "99999999999999999999", "--yes"], "99999999999999999999"),
                        (["prune", "--older-than", "nan", "--yes"], "--older-than nan")]:
        done = subprocess.run(
            [sys.executable, "-m", "django", "dbworker", "--settings=tests.settings", *args],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode != 0, done
        assert "Traceback" not in done.stderr, done.stderr
        assert named in done.stderr and "CommandError" in done.stderr, done.stderr
