"""The completion callback runs exactly once when the last two members of a workflow end
at the same instant in two supervisors (real runworkers processes, many rounds).

Each workflow is a group of two ``wf_wait`` steps, one in the queue "default" (run by the
first supervisor only) and one in "emails" (the second only), both waiting for the same
file: the test creates it once every member of the round is RUNNING, so each pair ends in
two processes at about the same instant, and both completions look for the callback."""

from __future__ import annotations

import os

import pytest

from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.workflows import group
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = [pytest.mark.processes]

ROUNDS = int(os.environ.get("DBWORKER_WORKFLOW_ROUNDS", "5"))
PER_ROUND = 6  # workflows per round: each supervisor runs PER_ROUND members at once


def test_callback_runs_once_when_the_last_two_members_end_together(runworkers, tmp_path):
    first = runworkers("--queue", "default", "--concurrency", str(PER_ROUND), lease=10)
    second = runworkers("--queue", "emails", "--concurrency", str(PER_ROUND), lease=10)
    handles = []
    for r in range(ROUNDS):
        path = str(tmp_path / f"go-{r}")
        round_handles = [
            group(tasks.wf_wait.step(2 * i, path),
                  tasks.wf_wait.using(queue_name="emails").step(2 * i + 1, path)).enqueue(
                name=f"race {r}.{i}", on_complete=tasks.wf_callback)
            for i in range(PER_ROUND)]
        members = [m.id for h in round_handles for m in h.results]
        wait_for(lambda members=members: TaskRecord.objects.filter(
            pk__in=members, status=TaskStatus.RUNNING).count() == len(members),
            timeout=60, what=f"round {r}: every member running")
        open(path, "w").close()  # all of them end now
        wait_for(lambda hs=round_handles: Effect.objects.filter(
            worker="wf_callback", note__in=[h.id for h in hs]).count() >= len(hs),
            timeout=60, what=f"round {r}: every callback")
        handles += round_handles
    # a late duplicate would show within a poll or two
    wait_for(lambda: not TaskRecord.objects.filter(
        status__in=[TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.WAITING]).exists(),
        timeout=30, what="nothing left to run")
    runs = list(Effect.objects.filter(worker="wf_callback").values_list("note", flat=True))
    assert sorted(runs) == sorted(h.id for h in handles), "a callback ran twice or never"
    callbacks = TaskRecord.objects.filter(pk__in=[h.row.callback_id for h in handles])
    assert set(callbacks.values_list("status", "attempts")) == {(TaskStatus.SUCCESSFUL, 1)}
    # both supervisors ended members (the race was between two processes)
    pids = set(Effect.objects.filter(worker="wf_wait").values_list("pid", flat=True))
    assert len(pids) >= 2
    for worker in (first, second):
        worker.signal(15)
        assert worker.wait(30) == 0, worker.output()
