"""Processes a task starts and leaves behind (``Popen(..., start_new_session=True)``) do not
outlive runworkers: the supervisor is a child subreaper (Linux), stops them at stop, and a
child killed on timeout takes its processes with it."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from pathlib import Path

import pytest

from django_dbworker.models import TaskRecord, TaskStatus
from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [
    pytest.mark.processes,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="subreapers are Linux's"),
]


def alive(pid: int) -> bool:
    """Running, or exited and not collected by anyone (a zombie counts as not gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "X"


def started_pid(pidfile: Path) -> int:
    text = wait_for(lambda: pidfile.exists() and pidfile.read_text(), 30,
                    "the task to write the pid of the process it started")
    return int(text)


@pytest.fixture
def leftovers():
    """Pids the test must not leave running, whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def test_a_process_a_task_left_behind_is_stopped_with_runworkers(runworkers, tmp_path,
                                                                 leftovers):
    pidfile = tmp_path / "orphan.pid"
    result = tasks.guard_spawn_orphan.enqueue(str(pidfile))
    process = runworkers("--concurrency", "1")
    pid = started_pid(pidfile)
    leftovers.append(pid)
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.SUCCESSFUL,
             30, "the task to finish")
    assert alive(pid), "the process outlives its task while runworkers runs"
    process.signal(signal.SIGTERM)
    assert process.wait(60) == 0, process.output()
    wait_for(lambda: not alive(pid), 10, f"process {pid} started by the task to be gone")
    assert "orphans_stopped" in process.output() and str(pid) in process.output()


def test_a_child_killed_on_timeout_takes_the_processes_it_started(runworkers, tmp_path,
                                                                  leftovers):
    pidfile = tmp_path / "hang.pid"
    result = tasks.guard_spawn_and_hang.enqueue(str(pidfile))
    process = runworkers("--concurrency", "1")
    pid = started_pid(pidfile)
    leftovers.append(pid)
    wait_for(lambda: TaskRecord.objects.get(pk=result.id).status == TaskStatus.FAILED,
             30, "the task to time out")
    wait_for(lambda: not alive(pid), 10, f"process {pid} to be gone with its child")
    assert process.process.poll() is None, "runworkers goes on"
    process.signal(signal.SIGTERM)
    assert process.wait(60) == 0, process.output()


def test_a_tasks_own_subprocess_gets_its_exit_status(runworkers):
    result = tasks.guard_subprocess_status.enqueue()
    process = runworkers("--burst", "--concurrency", "1")
    assert process.wait(60) == 0, process.output()
    assert TaskRecord.objects.get(pk=result.id).return_value == 3
