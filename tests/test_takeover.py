"""A dead supervisor's units come back in seconds (issue 36, item 2).

A supervisor silent past the bound its heartbeat declared (three ``HEARTBEAT_INTERVAL``\\s,
by the database's clock) is dead: another supervisor's reaper takes its units back at
once, fenced by their tokens as the lease reaper does, without waiting for their leases
(``supervisor/takeover.py``). First the heartbeat itself, then the reaper on real rows
(its own supervisor's heartbeat, the witness, stands in as a small double so that a test
says how long it has been beating), then two real ``runworkers``: one killed mid-drain, the
other takes its units back while the killed one's leases still run. Never by a wall clock:
by what the database says happened first.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from django_dbworker import workers
from django_dbworker.models import (
    Execution,
    State,
    Supervisor,
    TaskRecord,
    TaskStatus,
    database_now,
)
from django_dbworker.rows import planner, store
from django_dbworker.rows.runner import run
from django_dbworker.supervisor.duties.leases import Reaping, Renewal
from django_dbworker.supervisor.heartbeat import MISSED_BEATS, Heartbeat, takes_over
from django_dbworker.supervisor.renewer import Renewer
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks.runner import run_task
from django_dbworker.units.claimant import Claimant
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect, Item

pytest_db = pytest.mark.django_db(transaction=True)
LEASE_LOST = "django_dbworker.exceptions.LeaseLost"


def _events(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event + " ")]


class Witness:
    """The reaper's own supervisor's heartbeat, beating (without a break) for ``beating``
    seconds: what ``Heartbeat`` tells the reaper."""

    def __init__(self, beating: float, *, interval: float = 2.0) -> None:
        self.interval = interval
        self.takes_over = takes_over("default")
        self.beating = beating

    def beating_for(self) -> float:
        return self.beating


def row_of(claimant: Claimant, *, silent: float, bound: float = 6.0,
           stopped: bool = False) -> Supervisor:
    """``claimant``'s heartbeat row, its last beat ``silent`` seconds ago by the database's
    clock, declaring itself dead ``bound`` seconds after it."""
    return Supervisor.objects.create(
        id=claimant.supervisor_id, host=claimant.host, pid=claimant.pid,
        started_at=timezone.now(), concurrency=1,
        last_heartbeat=database_now(timedelta(seconds=-silent)),
        heartbeat_expires_at=database_now(timedelta(seconds=bound - silent)),
        stopped_at=timezone.now() if stopped else None)


def held_by(claimant: Claimant) -> tuple[store.Claim, taskstore.TaskClaim]:
    """One execution and one task claimed by ``claimant``, with a 30 s lease."""
    Item.objects.create(kind="touch")
    tasks.add.enqueue(1, 2)
    (row,) = planner.claim(workers["touch"], 1, claimant, 30.0)
    (task,) = taskplanner.claim(None, 1, claimant, 30.0)
    return row, task


def states(row: store.Claim, task: taskstore.TaskClaim) -> tuple[str, str]:
    return (Execution.objects.get(pk=row.execution_id).state,
            TaskRecord.objects.get(pk=task.task_id).status)


# ----- the heartbeat ----------------------------------------------------------------------


@pytest_db
def test_the_heartbeat_is_the_databases_clock_and_declares_its_bound():
    claimant = Claimant(pid=4321)
    beat = Heartbeat(claimant, lease=30.0, concurrency=1, workers=["touch"], queues=None,
                     tasks=False, burst=False, interval=2.0)
    slow = Heartbeat(claimant, lease=3.0, concurrency=1, workers=[], queues=None,
                     tasks=False, burst=False, interval=2.0)
    assert slow.interval == 1.0, "at most a third of the lease, as renewal"
    if connection.vendor == "sqlite":
        assert beat.interval == 10.0, "SQLite: the renewal's pace (each beat takes the lock)"
    else:
        assert beat.interval == 2.0
    beat.beat([], 0)
    beat.beat([], 1)  # the UPDATE, after the first INSERT
    row = Supervisor.objects.judged().get()
    declared = (row.heartbeat_expires_at - row.last_heartbeat).total_seconds()
    if connection.vendor == "sqlite":
        assert not beat.takes_over and declared == 30.0, "SQLite: the lease is the bound"
    else:
        assert beat.takes_over and declared == MISSED_BEATS * 2.0 == 6.0
    assert row.last_heartbeat <= row.database_now, "written by the database's clock"
    # Judged by the database's clock: ahead there, it is alive everywhere (no bound on how
    # long this test takes between the beat and the read).
    Supervisor.objects.update(heartbeat_expires_at=database_now(timedelta(hours=1)))
    row = Supervisor.objects.judged().get()
    assert row.state() == "alive" and Supervisor.objects.alive().count() == 1
    assert row.units_done == 1
    # Judged by the database's clock: gone stale there, it is dead everywhere.
    Supervisor.objects.update(heartbeat_expires_at=database_now(timedelta(seconds=-1)))
    assert Supervisor.objects.dead().count() == 1 and not Supervisor.objects.alive().exists()
    assert Supervisor.objects.judged().get().state() == "dead"


@pytest_db
def test_beating_for_counts_an_unbroken_run_of_beats():
    beat = Heartbeat(Claimant(), lease=30.0, concurrency=1, workers=[], queues=None,
                     tasks=False, burst=False, interval=2.0)
    assert beat.beating_for() == 0.0, "not beating yet"
    beat.beat([], 0)
    first = beat.beating_for()
    beat.beat([], 0)
    assert beat.beating_for() >= first >= 0.0
    _, last = beat._run
    two = 2 * beat.interval
    assert beat.beating_for(last + two - 0.1) >= two - 0.1, "the next beat is not late yet"
    assert beat.beating_for(last + two + 0.1) == 0.0, "two intervals without a beat: not now"


@pytest.mark.django_db(transaction=True)
def test_a_renewal_that_waits_in_vain_for_a_lock_takes_no_beat_back(caplog):
    """The beat and the renewal are transactions of their own. As one (on PostgreSQL a
    round was one transaction) a renewal that waited in vain for a lock took the beat back
    with it: a supervisor busy but alive would have looked dead."""
    if connection.vendor == "sqlite":
        pytest.skip("SQLite: the one write lock holds up the beat too; the lease is the "
                    "bound there (heartbeat.takes_over)")
    Item.objects.create(kind="touch")
    claimant = Claimant(pid=os.getpid())
    (c,) = planner.claim(workers["touch"], 1, claimant, 30.0)
    claimed = Execution.objects.get(pk=c.execution_id).lease_expires_at
    beat = Heartbeat(claimant, lease=30.0, concurrency=1, workers=["touch"], queues=None,
                     tasks=False, burst=False, interval=2.0)
    r = Renewer(Renewal(claimant, 30.0, lambda: beat.beat([], 0), tasks=False,
                        heartbeat=beat.interval), "default")
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        try:
            with transaction.atomic():
                Execution.objects.select_for_update().get(pk=c.execution_id)  # the lock
                r.start()
                wait_for(lambda: any(e.endswith("part=renewer") or "renewal_delayed" in e
                                     for e in _events(caplog, "database_error")
                                     + _events(caplog, "renewal_delayed")),
                         what="the renewal to wait in vain for the row's lock")
                assert Supervisor.objects.filter(pk=claimant.supervisor_id).exists(), \
                    "the beat went through"
                assert Execution.objects.get(pk=c.execution_id).lease_expires_at == claimed
            wait_for(lambda: Execution.objects.get(pk=c.execution_id).lease_expires_at
                     != claimed, what="the renewal once the lock is gone")
        finally:
            r.stop()
    assert beat.beating_for() > 0, "its beats went on"


# ----- the reaper on real rows ------------------------------------------------------------


@pytest_db
def test_a_dead_supervisors_units_come_back_at_once_fenced_by_their_tokens(caplog):
    if not takes_over("default"):
        pytest.skip("SQLite: silence is not death (a write transaction holds up every "
                    "heartbeat); test_on_sqlite_the_lease_stays_the_bound")
    mine, alive, dead = Claimant(pid=1), Claimant(pid=2), Claimant(host="gone-host", pid=3)
    also = Claimant(host="gone-too", pid=5)
    row_of(mine, silent=60.0)  # even stale, its own units are never taken
    row_of(alive, silent=1.0)
    row_of(dead, silent=10.0)
    row_of(also, silent=20.0)
    own, live, lost, too = held_by(mine), held_by(alive), held_by(dead), held_by(also)
    tokens = {c.unit_pk: c.token for c in [*own, *live]}

    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(60.0)).run(0.0)

    assert states(*lost) == (State.UNFINISHED, TaskStatus.READY), "taken back at once"
    execution = Execution.objects.get(pk=lost[0].execution_id)
    assert (execution.crashes, execution.token) == (1, None), "a crash, as a lease lost"
    task = TaskRecord.objects.get(pk=lost[1].task_id)
    assert task.crashes == 1 and task.token is None
    [error] = task.errors
    assert error["exception_class_path"] == LEASE_LOST
    assert re.search(r"gone-host:3, stopped beating its heartbeat 1\d\.\d s ", error["message"])
    for c in [*own, *live]:
        model = TaskRecord if hasattr(c, "task_id") else Execution
        assert model.objects.get(pk=c.unit_pk).token == tokens[c.unit_pk], "untouched"
    assert states(*own) == (State.WORKING, TaskStatus.RUNNING)
    assert states(*live) == (State.WORKING, TaskStatus.RUNNING)
    assert states(*too) == (State.UNFINISHED, TaskStatus.READY)
    assert "gone-too:5, stopped beating its heartbeat 2" in TaskRecord.objects.get(
        pk=too[1].task_id).errors[0]["message"], "each with its own holder's crash"
    lines = sorted(_events(caplog, "reaped"))
    assert len(lines) == 2, lines
    assert re.fullmatch(r'reaped units=2 reason="supervisor dead" supervisor=gone-host:3 '
                        r"silent_for=1\d\.\d", lines[0]), lines
    assert re.fullmatch(r'reaped units=2 reason="supervisor dead" supervisor=gone-too:5 '
                        r"silent_for=2\d\.\d", lines[1]), lines

    # The dead one was only paused: back, it cannot record what it held.
    assert run(lost[0]).outcome == "lease_lost"
    assert run_task(lost[1]).outcome == "lease_lost"
    assert not Effect.objects.filter(item_id=Execution.objects.get(
        pk=lost[0].execution_id).source_id).exists(), "its transaction rolled back"
    assert states(*lost) == (State.UNFINISHED, TaskStatus.READY)


@pytest_db
def test_silence_counts_only_while_the_reapers_own_heartbeat_went_through(caplog):
    """After an outage that silenced everyone (a restart, a failover), every last beat is
    old; the others come back within an interval or two. A reaper takes a silent one's
    units only once its own beats have gone through for longer than that one's bound."""
    if not takes_over("default"):
        pytest.skip("SQLite: silence is not death")
    mine, dead = Claimant(pid=1), Claimant(host="gone-host", pid=3)
    row_of(dead, silent=40.0, bound=30.0)  # an older version's row: the lease as bound
    lost = held_by(dead)
    for beating in (0.0, 5.0, 30.0):
        Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(beating)).run(0.0)
        assert states(*lost) == (State.WORKING, TaskStatus.RUNNING), beating
    Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(31.0)).run(0.0)
    assert states(*lost) == (State.UNFINISHED, TaskStatus.READY)


@pytest_db
def test_units_of_a_supervisor_without_a_row_or_gone_long_ago_are_left_to_the_lease():
    mine, unknown, old = Claimant(pid=1), Claimant(pid=2), Claimant(pid=3)
    row_of(old, silent=61.0)  # beyond two leases: its leases expired (the lease reaper's)
    left = [held_by(unknown), held_by(old)]
    Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(600.0)).run(0.0)
    assert all(states(*units) == (State.WORKING, TaskStatus.RUNNING) for units in left)


@pytest_db
def test_a_stopped_supervisors_units_go_back_without_a_crash(caplog):
    """One that marked itself stopped while still holding units (giving them back failed):
    they go back at once on every database, not as a crash (its own shutdown would have
    given them back so)."""
    mine, stopped = Claimant(pid=1), Claimant(host="gone-host", pid=4)
    row_of(stopped, silent=1.0, stopped=True)
    lost = held_by(stopped)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(0.0)).run(0.0)
    assert states(*lost) == (State.UNFINISHED, TaskStatus.READY)
    assert Execution.objects.get(pk=lost[0].execution_id).crashes == 0
    assert TaskRecord.objects.get(pk=lost[1].task_id).crashes == 0
    [line] = _events(caplog, "reaped")
    assert line.startswith('reaped units=2 reason="supervisor stopped" supervisor=gone-host:4')


@pytest_db
def test_on_sqlite_the_lease_stays_the_bound():
    """SQLite: a write transaction (a claim, a transactional handler) holds up every other
    connection's heartbeat for as long as it lasts, so silence does not tell death; a
    silent supervisor's units wait for their leases there (the lease reaper's)."""
    if takes_over("default"):
        pytest.skip("PostgreSQL, MariaDB: silence past the bound is death")
    mine, dead = Claimant(pid=1), Claimant(pid=3)
    row_of(dead, silent=10.0)
    lost = held_by(dead)
    Reaping(30.0, 3, tasks=True, spare=mine, witness=Witness(60.0)).run(0.0)
    assert states(*lost) == (State.WORKING, TaskStatus.RUNNING)


def test_the_reaper_looks_every_heartbeat_interval():
    assert Reaping(30.0, 3, tasks=True).every.interval == 5.0, "alone: the lease's pace"
    reaping = Reaping(30.0, 3, tasks=True, spare=Claimant(), witness=Witness(0.0))
    assert reaping.every.interval == 2.0


# ----- two real runworkers ----------------------------------------------------------------


@pytest.mark.processes
def test_a_killed_supervisors_units_are_taken_back_before_their_leases_expire(runworkers):
    """Killed mid-drain (SIGKILL to its process group: the supervisor and its children),
    with a 60 s lease: the other supervisor takes its units back once its heartbeat is
    three intervals old, and everything is done while the killed one's leases, as the
    database holds them, still run."""
    if not takes_over("default"):
        pytest.skip("SQLite: the lease stays the bound (test_on_sqlite_the_lease_stays_the_"
                    "bound); a 60 s lease would be this test's length")
    slow = [Item.objects.create(action="sleep_first:25") for _ in range(2)]
    task = tasks.slow_first.enqueue(7, 25)
    one_each = {"DBWORKER_TEST_PREFETCH": "0"}  # a unit per child: none claimed ahead
    args = ("--worker", "touch", "--queue", "default", "--concurrency", "3")
    first = runworkers(*args, lease=60, extra_env=one_each)
    mine = Execution.objects.filter(worker="touch", claimed_pid=first.pid, state=State.WORKING)
    wait_for(lambda: mine.count() == 2 and TaskRecord.objects.filter(
        pk=task.id, status=TaskStatus.RUNNING, claimed_pid=first.pid).exists(),
        what="the first supervisor to hold both rows and the task")
    second = runworkers(*args, "-v", "2", lease=60, extra_env=one_each)
    wait_for(lambda: Supervisor.objects.filter(pid=second.pid).alive().exists(),
             what="the second supervisor's heartbeat")

    first.signal_group(signal.SIGKILL)
    first.wait(10)
    leases = {**{e.pk: e.lease_expires_at for e in Execution.objects.filter(
        worker="touch", claimed_pid=first.pid)},
        task.id: TaskRecord.objects.get(pk=task.id).lease_expires_at}
    assert len(leases) == 3
    more = [Item.objects.create() for _ in range(3)]  # the drain goes on

    wait_for(lambda: all(Execution.objects.get(worker="touch", source_id=str(i.pk)).state
                         == State.FINISHED for i in slow + more)
             and TaskRecord.objects.get(pk=task.id).status == TaskStatus.SUCCESSFUL,
             timeout=55, what="the takeover and the re-runs")

    for item in slow:
        unit = Execution.objects.get(worker="touch", source_id=str(item.pk))
        assert unit.claimed_pid == second.pid and (unit.attempts, unit.crashes) == (2, 1)
        assert unit.finished_at < leases[unit.pk], "done while the killed one's lease ran"
        [effect] = Effect.objects.filter(item_id=item.pk, worker="touch")  # the killed
        assert effect.pid != first.pid  # run's write was rolled back with its process
    record = TaskRecord.objects.get(pk=task.id)
    assert (record.attempts, record.crashes, record.claimed_pid) == (2, 1, second.pid)
    assert record.finished_at < leases[task.id]
    assert record.errors[0]["exception_class_path"] == LEASE_LOST
    assert f"{socket.gethostname()}:{first.pid}, stopped beating" in record.errors[0]["message"]
    assert Supervisor.objects.judged().get(pid=first.pid).state() == "dead"

    out = second.output()
    assert re.search(rf'reaped units=3 reason="supervisor dead" supervisor=\S+:{first.pid} '
                     r"silent_for=\d+\.\d", out), out
    assert 'reason="lease expired"' not in out
    second.signal(signal.SIGTERM)
    assert second.wait(30) == 0, second.output()

