"""``django_dbworker.start()``: the workers run from the caller's own process and stop
gracefully with ``stop()`` (issue 21), real supervisors and children."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from django.db import connection

import django_dbworker
from django_dbworker.models import Supervisor, TaskRecord, TaskStatus
from django_dbworker.supervisor.embedding import StartFailed
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]
ROOT = Path(__file__).resolve().parent.parent


def env() -> dict[str, str]:
    return {"DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"]}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet waited for) counts as gone.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[-1][0] != "Z"


def status(result) -> str:
    return TaskRecord.objects.get(pk=result.id).status


def slow_began() -> bool:
    """Whether ``long_running`` began in a child (its first line writes an Effect). Its
    status RUNNING says only that it was claimed: a unit claimed ahead, still waiting when
    the supervisor is asked to stop, is given back and the stop is at once (CI, loaded)."""
    return Effect.objects.filter(worker="long_running").exists()


def test_start_returns_while_the_workers_run_and_stop_is_graceful(tmp_path):
    log = (tmp_path / "out.log").open("wb")
    with django_dbworker.start(queues=["default", "slow"], concurrency=1, env=env(),
                               stdout=log, stderr=log) as workers:
        assert workers.running
        row = Supervisor.objects.get(pid=workers.pid)
        assert row.stopped_at is None and row.concurrency == 1
        done = [tasks.add.enqueue(i, i) for i in range(5)]
        wait_for(lambda: all(status(r) == TaskStatus.SUCCESSFUL for r in done),
                 what="the tasks to run")
        slow = tasks.long_running.enqueue(1.5)
        wait_for(slow_began, what="the slow task to start")  # RUNNING: claimed, maybe not started
        started = time.monotonic()
        assert workers.stop() == 0  # waits for the running task: a graceful stop
        assert time.monotonic() - started >= 0.5
        assert status(slow) == TaskStatus.SUCCESSFUL
        assert not workers.running
    assert Supervisor.objects.get(pid=workers.pid).stopped_at is not None


def test_stop_with_a_timeout_kills_what_does_not_stop_in_time(tmp_path):
    log = (tmp_path / "out.log").open("wb")
    workers = django_dbworker.start(queues=["slow"], concurrency=1, grace_period=60,
                                    env=env(), stdout=log, stderr=log)
    tasks.long_running.enqueue(60)
    wait_for(slow_began, what="the slow task to start")
    children = [int(p) for p in Path(f"/proc/{workers.pid}/task/{workers.pid}/children")
                .read_text().split()]
    assert children
    assert workers.stop(timeout=1.0) == -signal.SIGKILL
    wait_for(lambda: not any(alive(c) for c in children), timeout=10,
             what="the children to be killed with their supervisor")


def test_a_bad_option_fails_start_with_runworkers_message(tmp_path):
    out = tmp_path / "out.log"
    with open(out, "wb") as log, pytest.raises(StartFailed, match="exited with status"):
        django_dbworker.start(workers=["nope"], env=env(), stdout=log, stderr=log)
    assert "No worker named 'nope'" in out.read_text()


def test_a_burst_run_ends_by_itself():
    tasks.add.enqueue(1, 1)
    workers = django_dbworker.start(queues=["default"], burst=True, env=env(),
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert workers.wait(60) == 0
    assert TaskRecord.objects.get().status == TaskStatus.SUCCESSFUL


def test_the_workers_stop_when_the_embedding_process_dies(tmp_path):
    """kill -9 of the process that called start(): its supervisor gets SIGTERM (Linux's
    parent-death signal) and stops gracefully; nothing is left running."""
    script = tmp_path / "service.py"
    script.write_text(textwrap.dedent("""
        import subprocess, time, django
        django.setup()
        import django_dbworker
        workers = django_dbworker.start(queues=["default"], concurrency=1,
                                        stdout=subprocess.DEVNULL)
        print(workers.pid, flush=True)
        time.sleep(600)
    """))
    service = subprocess.Popen(
        [sys.executable, str(script)], cwd=ROOT, stdout=subprocess.PIPE,
        stderr=(tmp_path / "service.log").open("wb"),
        env={**os.environ, **env(), "PYTHONPATH": str(ROOT),
             "DJANGO_SETTINGS_MODULE": "tests.settings"})
    try:
        supervisor = int(service.stdout.readline())
        assert alive(supervisor)
        service.kill()
        service.wait(10)
        wait_for(lambda: not alive(supervisor), timeout=30,
                 what="the supervisor to stop after its embedding process died")
        assert Supervisor.objects.get(pid=supervisor).stopped_at is not None  # graceful
    finally:
        service.kill()
