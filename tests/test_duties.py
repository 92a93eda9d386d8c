"""The supervisor's duties (``supervisor/duties/``): one shape, ``due(now)`` / ``run(now)``,
driven here by a fake clock; then what renewal, reaping, discovery and retention do to
real rows, and the order the supervisor's loop runs them in (renewal is not among them:
its renewer thread runs it, tests/test_renewer.py)."""

from __future__ import annotations

import logging
from dataclasses import replace
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from django_dbworker import conf, workers
from django_dbworker.models import Execution, State, TaskRecord, TaskStatus
from django_dbworker.rows import planner
from django_dbworker.rows.sweep import Sweeper
from django_dbworker.supervisor import units
from django_dbworker.supervisor.duties.base import (
    FAILURE_LOG_INTERVAL,
    Duties,
    Every,
    Periodic,
)
from django_dbworker.supervisor.duties.discovery import Discovery
from django_dbworker.supervisor.duties.leases import Reaping, Renewal, Retries
from django_dbworker.supervisor.duties.outage import Outage
from django_dbworker.supervisor.duties.tasks import PRUNE_BATCH, PRUNE_POLL, Cron, Retention
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.units.claimant import Claimant
from tests.testapp import tasks
from tests.testapp.models import Item


class Clock:
    """Monotonic seconds that move only when a test moves them."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Counting(Periodic):
    def __init__(self, name: str, interval: float, seen: list[str],
                 error: Exception | None = None) -> None:
        super().__init__(interval)
        self.name = name  # type: ignore[misc]
        self.seen = seen
        self.error = error

    def work(self, now: float) -> None:
        self.seen.append(self.name)
        if self.error is not None:
            raise self.error


def _events(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event + " ")]


# ----- the shape, with a fake clock ------------------------------------------------------


def test_every_is_due_at_once_then_an_interval_after_it_ran():
    every = Every(10.0)
    assert every.due(0.0), "a new timer is due at once"
    every.ran(5.0)
    assert not every.due(14.9) and every.left(14.9) == pytest.approx(0.1)
    assert every.due(15.0)
    every.again()
    assert every.due(5.0), "again(): due at the next look"


def test_a_periodic_duty_is_due_its_interval_after_it_ran():
    seen: list[str] = []
    duty = Counting("tick", 3.0, seen)
    clock = Clock()
    duties = Duties([duty], clock)
    for _ in range(3):  # the same instant: run once
        duties.run_due()
    clock.now += 2.9
    duties.run_due()
    assert seen == ["tick"]
    clock.now += 0.1
    duties.run_due()
    assert seen == ["tick", "tick"]


def test_duties_run_in_their_order_and_only_when_due():
    seen: list[str] = []
    clock = Clock()
    duties = Duties([Counting("first", 1.0, seen), Counting("second", 5.0, seen),
                     Counting("third", 0.0, seen)], clock)
    duties.run_due()
    clock.now += 1.0
    duties.run_due()
    assert seen == ["first", "second", "third", "first", "third"]


def test_a_failing_duty_is_logged_once_per_interval_and_the_others_go_on(caplog):
    seen: list[str] = []
    clock = Clock()
    broken = Counting("broken", 1.0, seen, error=RuntimeError("duty broke"))
    duties = Duties([broken, Counting("after", 1.0, seen)], clock)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        for _ in range(5):
            duties.run_due()
            clock.now += 1.0
        clock.now += FAILURE_LOG_INTERVAL
        duties.run_due()
    assert seen == ["broken", "after"] * 6, "tried at each interval, never stops the others"
    lines = _events(caplog, "duty_failed")
    assert len(lines) == 2, lines
    assert "duty=broken" in lines[0] and "error=\"RuntimeError: duty broke\"" in lines[0]
    assert f"next_log_in={FAILURE_LOG_INTERVAL}" in lines[0]


def test_another_transactions_lock_defers_the_duty_and_the_others_go_on(caplog):
    """SQLite's write lock held past the loop's wait (a transactional handler), or a
    deadlock: not an outage; the duty runs again in the next round, said once a minute."""
    seen: list[str] = []
    clock = Clock()
    locked = Counting("discovery", 10.0, seen, error=OperationalError("database is locked"))
    duties = Duties([locked, Counting("later", 1.0, seen)], clock)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        duties.run_due()  # no outage raised
        assert seen == ["discovery", "later"] and locked.due(clock.now)
        duties.run_due()
    assert seen == ["discovery", "later", "discovery"], "deferred: again at the next round"
    lines = _events(caplog, "duty_deferred")
    assert len(lines) == 1 and "duty=discovery" in lines[0], lines
    assert not _events(caplog, "duty_failed")


def test_a_database_error_goes_up_to_the_outage_and_the_duty_is_due_again_at_once():
    seen: list[str] = []
    clock = Clock()
    failing = Counting("renewal", 10.0, seen, error=OperationalError("server closed"))
    duties = Duties([failing, Counting("later", 1.0, seen)], clock)
    with pytest.raises(OperationalError):
        duties.run_due()
    assert seen == ["renewal"], "the round stops: the rest would fail on it too"
    assert failing.due(clock.now), "what it did not do is still to be done"
    failing.error = None
    duties.run_due()
    assert seen == ["renewal", "renewal", "later"]
    assert not failing.due(clock.now + 9.9)


def test_outage_backoff_doubles_from_half_a_second_to_five(caplog):
    clock = Clock()
    outage = Outage(clock)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        waits = []
        for _ in range(7):
            waits.append(outage.failed(OperationalError("connection refused")))
            clock.now += waits[-1]
        outage.went_through(connected=False)  # a round that never touched the database
        assert outage.backoff == 0.0 and not _events(caplog, "reconnected")
        outage.went_through(connected=True)
        outage.went_through(connected=True)
    assert waits == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    errors = _events(caplog, "database_error")
    assert len(errors) == 7 and "retry_in=0.5" in errors[0] and "retry_in=5.0" in errors[-1]
    assert _events(caplog, "reconnected") == [
        f"reconnected down_for={round(sum(waits), 2)} attempts=7"]
    assert outage.failed(OperationalError("again")) == 0.5, "a new outage starts over"


def test_outage_backoff_does_not_double_for_rounds_that_fail_before_their_wait_is_over():
    """A supervisor woken early (its children report their own lost connections at the
    start of a restart) fails a round again within its wait: the wait stays, or a burst of
    such rounds would make it wait the longest at once, and find the database back late
    (issue 36's benchmark: 0.5 to 30 s within 0.1 s, then up to 30 s after the restart)."""
    clock = Clock()
    outage = Outage(clock)
    waits = []
    for _ in range(10):  # ten rounds, 10 ms apart
        waits.append(outage.failed(OperationalError("connection refused")))
        clock.now += 0.01
    assert waits == [0.5] * 10
    clock.now += 0.5  # the wait waited out
    assert outage.failed(OperationalError("connection refused")) == 1.0


class FakeSweeper:
    def __init__(self, name: str, steps: list[tuple[int, bool] | Exception],
                 background: list[int] | None = None) -> None:
        self.worker = type("W", (), {"name": name})()
        self.steps = steps
        self.restarts = 0
        self.backgrounds = background or []
        self.full_phase = "rows" if self.backgrounds else ""

    def restart(self) -> None:
        self.restarts += 1

    def step(self, now: float) -> tuple[int, bool]:
        result = self.steps.pop(0)
        if isinstance(result, Exception):
            raise result
        return result

    def next_step_in(self, now: float) -> float | None:
        return 0.25 if self.full_phase else None

    def background(self, now: float) -> int:
        added = self.backgrounds.pop(0)
        if not self.backgrounds:
            self.full_phase = ""
        return added


def test_discovery_starts_a_pass_each_interval_and_steps_it_each_round(caplog):
    clock = Clock()
    failed: list[str] = []
    paused = {"c"}
    sweepers = [FakeSweeper("a", [(2, False), (0, True), (0, True)]),
                FakeSweeper("b", [ValueError("no table"), (1, True), ValueError("again")]),
                FakeSweeper("c", [(9, True)])]
    discovery = Discovery(sweepers, 60.0,  # type: ignore[arg-type]
                          lambda name, now: name in paused,
                          lambda name, exc, raw: failed.append(name))
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        assert discovery.due(clock.now)
        discovery.run(clock.now)
        assert discovery.started == clock.now and discovery.sweeping == {0, 1, 2}
        assert failed == ["b"]
        clock.now += 1
        paused.clear()
        discovery.run(clock.now)
    assert discovery.sweeping == set() and not discovery.due(clock.now)
    assert _events(caplog, "swept") == ["swept worker=a added=2", "swept worker=b added=1",
                                        "swept worker=c added=9"]
    clock.now += 59
    assert discovery.due(clock.now)
    paused.add("c")
    discovery.run(clock.now)
    assert discovery.started == clock.now and discovery.sweeping == {1, 2}
    assert failed == ["b", "b"] and sweepers[2].steps == [], "c was left alone"
    assert [s.restarts for s in sweepers] == [2, 2, 2]


def test_a_full_pass_nothing_waits_for_takes_a_chunk_a_round_after_the_urgent_work(caplog):
    clock = Clock()
    sweeper = FakeSweeper("a", [(1, False), (0, True)], background=[3, 0, 4])
    discovery = Discovery([sweeper], 60.0,  # type: ignore[arg-type]
                          lambda name, now: False, lambda name, exc, raw: pytest.fail(str(exc)))
    assert discovery.left(clock.now) == 0.0, "the first pass is due"
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        for _ in range(5):
            assert discovery.due(clock.now)
            discovery.run(clock.now)
            if not discovery.sweeping and sweeper.full_phase:
                assert discovery.left(clock.now) == 0.25, "the supervisor wakes for its step"
            clock.now += 1
    assert not discovery.sweeping and sweeper.backgrounds == [] and not discovery.due(clock.now)
    assert discovery.left(clock.now) == 55.0, "then the next pass"
    assert _events(caplog, "swept") == ["swept worker=a added=1", "swept worker=a added=3",
                                        "swept worker=a added=4"]


# ----- what the duties do to real rows ----------------------------------------------------


pytest_db = pytest.mark.django_db(transaction=True)


def lease_until(c) -> Any:
    model = TaskRecord if hasattr(c, "task_id") else Execution
    return model.objects.get(pk=c.unit_pk).lease_expires_at


def lease_left(c) -> float:
    lease = lease_until(c)
    return (lease - timezone.now()).total_seconds() if lease is not None else 0.0


@pytest_db
def test_renewal_extends_every_lease_its_supervisor_holds_and_beats():
    """Found by the supervisor's id, with no list of units: a renewer thread has none."""
    for _ in range(3):
        Item.objects.create(kind="touch")
    tasks.add.enqueue_many([((i, i), {}) for i in range(2)])
    claimant, other = Claimant(), Claimant()
    held = [*planner.claim(workers["touch"], 2, claimant, 1.0),
            *taskplanner.claim(None, 1, claimant, 1.0)]
    given_back = taskplanner.claim(None, 1, claimant, 1.0)
    units.unclaim(given_back)
    theirs = planner.claim(workers["touch"], 1, other, 1.0)
    beats = []
    renewal = Renewal(claimant, 30.0, lambda: beats.append(1), tasks=True, heartbeat=2.0)
    claimed_until = lease_until(held[0])
    renewal.run(50.0)
    assert beats == [1] and lease_until(held[0]) == claimed_until, (
        "the beat first, a run of its own")
    assert renewal.due(50.0) and renewal.left(50.0) <= 0.0, "the renewal still due"
    renewal.run(50.0)
    assert all(lease_left(c) > 20 for c in held), "running, in a child or claimed ahead"
    assert lease_left(theirs[0]) < 2, "another supervisor's unit is not renewed"
    assert lease_left(given_back[0]) == 0.0, "what was given back is no longer held"
    assert beats == [1] and not renewal.due(50.0)
    assert not renewal.due(51.9) and renewal.due(52.0), "the next beat: a heartbeat interval"
    renewal.run(52.0)
    assert beats == [1, 1] and renewal.left(52.0) == 2.0, "the next beat first"
    assert renewal.renewing.left(52.0) == 8.0, "the renewal: a third of the lease"
    rows_only = Renewal(claimant, 60.0, lambda: None, tasks=False)
    assert rows_only.every.interval == 20.0, "no heartbeat interval: a third of the lease"
    rows_only.run(0.0)
    rows_only.run(0.0)
    assert lease_left(held[0]) > 50 and lease_left(held[2]) < 31, "tasks only when it runs them"


@pytest_db
def test_reaping_releases_an_expired_lease_and_says_so(caplog):
    Item.objects.create(kind="touch")
    (c,) = planner.claim(workers["touch"], 1, Claimant(), 30.0)
    Execution.objects.filter(pk=c.execution_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1))
    reaping = Reaping(30.0, 3, tasks=True, spare=Claimant())
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        Duties([reaping], Clock(0.0)).run_due()
    execution = Execution.objects.get(pk=c.execution_id)
    assert execution.state != State.WORKING and execution.crashes == 1
    assert _events(caplog, "reaped") == ["reaped units=1 reason=\"lease expired\""]
    assert not reaping.due(4.9) and reaping.due(5.0), "a third of the lease, 5 s at most"


@pytest_db
def test_reaping_spares_its_own_supervisors_units():
    """Its supervisor knows where they are (on SQLite a renewal may wait behind the write
    lock while the supervisor is healthy): released when their child exits, not reaped."""
    Item.objects.create(kind="touch")
    tasks.add.enqueue(1, 2)
    mine = Claimant()
    held = [*planner.claim(workers["touch"], 1, mine, 30.0),
            *taskplanner.claim(None, 1, mine, 30.0)]
    Execution.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    TaskRecord.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    Reaping(30.0, 3, tasks=True, spare=mine, held=lambda: held).run(0.0)
    assert status_of(held) == [State.WORKING, TaskStatus.RUNNING]
    Reaping(30.0, 3, tasks=True, spare=Claimant()).run(10.0)
    assert status_of(held) == [State.UNFINISHED, TaskStatus.READY]


@pytest_db
def test_reaping_gives_back_what_its_supervisor_holds_in_the_database_only(caplog):
    """A claim whose answer was lost with its connection: WORKING under the supervisor's
    id, unknown to its loop. Renewal (by the id) would keep it forever; it goes back, not as
    a crash, while the units the loop holds stay."""
    for _ in range(2):
        Item.objects.create(kind="touch")
    tasks.add.enqueue(1, 2)
    mine = Claimant()
    kept, lost = planner.claim(workers["touch"], 2, mine, 30.0)
    (lost_task,) = taskplanner.claim(None, 1, mine, 30.0)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        Reaping(30.0, 3, tasks=True, spare=mine, held=lambda: [kept]).run(0.0)
    assert Execution.objects.get(pk=kept.execution_id).state == State.WORKING
    unit = Execution.objects.get(pk=lost.execution_id)
    assert (unit.state, unit.crashes, unit.token) == (State.UNFINISHED, 0, None)
    assert TaskRecord.objects.get(pk=lost_task.task_id).status == TaskStatus.READY
    assert _events(caplog, "released_untracked") == [
        'released_untracked units=2 reason="held in the database by this supervisor, '
        'not in memory"']


def status_of(held) -> list[str]:
    return [Execution.objects.get(pk=held[0].unit_pk).state,
            TaskRecord.objects.get(pk=held[1].unit_pk).status]


@pytest_db
def test_discovery_finds_rows_written_without_save():
    Item.objects.bulk_create([Item(kind="touch") for _ in range(5)])
    assert not Execution.objects.filter(worker="touch").exists()
    discovery = Discovery([Sweeper(workers["touch"], 2)], 60.0, lambda name, now: False,
                          lambda name, exc, raw: pytest.fail(f"{name}: {exc}"))
    clock = Clock()
    duties = Duties([discovery], clock)
    rounds = 0
    while True:
        duties.run_due()
        rounds += 1
        if not discovery.sweeping:
            break
    assert Execution.objects.filter(worker="touch").count() == 5
    assert rounds > 1, "a chunk a round: claims go on between them"


@pytest_db
def test_retention_comes_back_at_once_while_its_batches_are_full():
    tasks.add.enqueue_many([((i, i), {}) for i in range(PRUNE_BATCH + 1)])
    TaskRecord.objects.update(status=TaskStatus.SUCCESSFUL,
                              finished_at=timezone.now() - timedelta(days=30))
    retention = Retention(replace(conf.get(), RETENTION=60.0))
    retention.run(0.0)
    assert TaskRecord.objects.count() == 1
    assert retention.due(0.0), "a full batch: more to do at the next round"
    retention.run(0.0)
    assert not TaskRecord.objects.exists()
    assert not retention.due(PRUNE_POLL - 0.1) and retention.due(PRUNE_POLL)
    assert not Retention(replace(conf.get(), RETENTION=None)).due(0.0)


@pytest_db
def test_retention_deletes_the_workflows_its_pruning_left_without_a_task():
    from django_dbworker.models import Workflow

    old = timezone.now() - timedelta(days=30)
    gone = tasks.add.enqueue_many([((i, i), {}) for i in range(3)], workflow=True)
    kept = tasks.add.enqueue_many([((i, i), {}) for i in range(2)], workflow=True)
    recent = tasks.add.enqueue_many([((1, 1), {})], workflow="recent")
    groups = {TaskRecord.objects.get(pk=r[0].id).workflow_id for r in (gone, kept, recent)}
    assert len(groups) == 3 and None not in groups
    Workflow.objects.exclude(pk=TaskRecord.objects.get(pk=recent[0].id).workflow_id) \
        .update(created_at=old)
    TaskRecord.objects.filter(pk__in=[r.id for r in [*gone, kept[0], *recent]]).update(
        status=TaskStatus.SUCCESSFUL, finished_at=old)
    Retention(replace(conf.get(), RETENTION=60.0)).run(0.0)
    assert [str(pk) for pk in TaskRecord.objects.values_list("pk", flat=True)] == [
        str(kept[1].id)]
    left = set(Workflow.objects.values_list("pk", flat=True))
    kept_group = TaskRecord.objects.get(pk=kept[1].id).workflow_id
    assert kept_group in left, "a member left: the workflow stays"
    assert len(left) == 2, "the recent workflow stays until it is older than the cutoff"
    TaskRecord.objects.all().delete()
    Workflow.objects.update(created_at=old)
    assert taskstore.prune(timedelta(seconds=60), 1000) == 2  # dbworker prune too
    assert not Workflow.objects.exists()


@pytest_db
def test_the_supervisors_loop_runs_maintenance_and_its_renewer_the_renewal():
    from django_dbworker.supervisor.supervisor import Options, Supervisor

    supervisor = Supervisor(Options(workers=[workers["touch"]], tasks=True, concurrency=1),
                            conf.get(), None)
    try:
        assert [d.name for d in supervisor.duties.duties] == [
            "retries", "task_stops", "cron", "retention", "timeouts", "reaping",
            "discovery", "row_dependencies"]
        assert isinstance(supervisor.duties.duties[0], Retries)
        assert isinstance(supervisor.duties.duties[2], Cron)
        assert supervisor.retry_release is supervisor.retries.releases
        assert isinstance(supervisor.renewer.renewal, Renewal)
        assert supervisor.renewer.renewal.tasks and not supervisor.renewer.alive()
        assert supervisor.reaping.spare is supervisor.claimant
        assert supervisor.reaping.held == supervisor._held
        # The heartbeat every HEARTBEAT_INTERVAL, witness of the reaper's takeovers.
        assert supervisor.reaping.witness is supervisor.heartbeat
        assert supervisor.heartbeat.interval == (
            conf.get().LEASE_SECONDS / 3 if connection.vendor == "sqlite"  # its own pace
            else conf.get().HEARTBEAT_INTERVAL)
        assert supervisor.renewer.renewal.every.interval == supervisor.heartbeat.interval
    finally:
        supervisor._wake_r.close()
        supervisor._wake_w.close()


@pytest.mark.django_db(transaction=True)
def test_a_sweep_that_met_an_ended_session_is_an_outage_not_a_broken_worker():
    """Leaving a sweep's ``atomic()`` after the server ended the session opens a new
    connection, which answers: only the connection the step began on tells an outage
    (reconnect at once) from a broken worker (left alone 30 s), as for claims."""
    from django.db import connection

    from django_dbworker.supervisor.supervisor import Supervisor

    connection.ensure_connection()

    class EndsSession(FakeSweeper):
        def step(self, now: float) -> tuple[int, bool]:
            connection.close()
            connection.ensure_connection()
            raise OperationalError("terminating connection due to administrator command")

    supervisor = SimpleNamespace(using=conf.get().DATABASE, _broken={})
    seen: list[str] = []

    def failed(name: str, exc: Exception, raw: object) -> None:
        try:
            Supervisor._broken_source(supervisor, name, exc, raw)  # type: ignore[arg-type]
        except OperationalError:
            seen.append("outage")
        else:
            seen.append("broken")

    discovery = Discovery([EndsSession("a", [])], 60.0,  # type: ignore[list-item]
                          lambda name, now: False, failed)
    discovery.run(0.0)
    assert seen == ["outage"] and supervisor._broken == {}


def _ends_session_then_raises(*args: object, **kwargs: object) -> int:
    """What a statement meets when the server ended the session, as seen after leaving
    its ``atomic()``: a new connection is open, which answers."""
    from django.db import connection

    connection.close()
    connection.ensure_connection()
    raise OperationalError("terminating connection due to administrator command")


@pytest.mark.django_db(transaction=True)
def test_a_cron_tick_that_met_an_ended_session_is_tried_again_not_skipped(monkeypatch):
    from datetime import UTC, datetime

    from django.db import connection

    from django_dbworker.tasks import scheduler as scheduling
    from django_dbworker.tasks.scheduler import Scheduler
    from django_dbworker.tasks.schedules import Schedule

    start = datetime(2026, 12, 1, tzinfo=UTC)
    scheduler = Scheduler({"m": Schedule(name="m", task_path="tests.testapp.tasks.add",
                                         cron="* * * * *")}, now=start)
    connection.ensure_connection()
    monkeypatch.setattr(scheduling, "enqueue_tick", _ends_session_then_raises)
    with pytest.raises(OperationalError):  # the supervisor's outage back-off
        scheduler.tick(start + timedelta(seconds=61))
    assert scheduler.last["m"] == start, "the tick is still due: tried again"


@pytest.mark.django_db(transaction=True)
def test_retention_that_met_an_ended_session_is_an_outage(monkeypatch, caplog):
    from django.db import connection

    connection.ensure_connection()
    monkeypatch.setattr(taskstore, "prune_batch", _ends_session_then_raises)
    with caplog.at_level(logging.ERROR, logger="django_dbworker"), \
            pytest.raises(OperationalError):
        Retention(replace(conf.get(), RETENTION=60.0)).run(0.0)
    assert not _events(caplog, "prune_failed")
