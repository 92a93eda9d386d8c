"""A round that an announcement woke claims what was announced: sources whose last claim
came back short, with nothing since that could have made more claimable (a child's
report, a duty, a poll, units given back), are left to the next round. Each claim is a
statement, and one running beside the child that starts the announced unit slows it
(bench/latency.py); with many workers an idle task made every worker's claim run."""

from __future__ import annotations

import time

import pytest

from django_dbworker.djtasks import TaskResultStatus
from django_dbworker.models import Execution, State
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Item

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def woken_rounds(trace_text: str, pid: int) -> list[list[str]]:
    """The claims (``"1 of tasks"``, ``"0 of touch"``) of each round a NOTIFY woke."""
    lines = [line.split(" ", 3) for line in trace_text.splitlines()]
    marks = [(line[2], line[3] if len(line) > 3 else "") for line in lines
             if int(line[1]) == pid]
    rounds: list[list[str]] = []
    woke = False
    current: list[str] | None = None
    for event, detail in marks:
        if event == "woke":
            woke = True
        elif event == "round":
            if current is not None:
                rounds.append(current)
            current = [] if woke else None
            woke = False
        elif event == "claimed" and current is not None:
            current.append(detail)
    return rounds


def test_a_round_woken_for_a_task_claims_only_tasks(vendor, runworkers, tmp_path):
    if vendor != "postgresql":
        pytest.skip("announcements are PostgreSQL's NOTIFY; elsewhere every wake-up claims all")
    trace = tmp_path / "trace.log"
    rw = runworkers("--worker", "touch", "--queue", "default", "--concurrency", "1",
                    extra_env={"DBWORKER_TRACE": str(trace)})
    wait_for(lambda: "runworkers:" in rw.output(), what="runworkers to start")
    time.sleep(1.5)  # past its first rounds, its first duties and a poll
    for n in range(6):
        result = tasks.add.enqueue(n, 1)

        def done(result=result) -> bool:  # type: ignore[no-untyped-def]
            result.refresh()
            return result.status == TaskResultStatus.SUCCESSFUL

        wait_for(done, what=f"task {n}")
        assert result.return_value == n + 1
        time.sleep(0.2)
    # Rows are announced too: the row worker's claim runs for them, and the row is done.
    item = Item.objects.create(kind="touch", enabled=True)
    wait_for(lambda: Execution.objects.filter(worker="touch", source_id=str(item.pk),
                                              state=State.FINISHED).exists(),
             what="the touch row")
    rw.stop()
    rounds = woken_rounds(trace.read_text(), rw.pid)
    # A round woken for a task that claimed it (another round may have been first: a
    # poll, a report, at times).
    for_tasks = [r for r in rounds if any(c.endswith(" of tasks") and not c.startswith("0 ")
                                          for c in r)]
    assert len(for_tasks) >= 4, rounds
    only_tasks = [r for r in for_tasks if all(c.endswith(" of tasks") for c in r)]
    # Most: a round after one that ran a duty claims every source once more.
    assert len(only_tasks) > len(for_tasks) // 2, \
        f"rounds woken for a task claimed other sources: {rounds}"
    assert any(c.endswith(" of touch") for r in rounds for c in r), \
        f"a round woken for a row claims the row worker's source: {rounds}"
