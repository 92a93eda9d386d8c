"""Lease renewal that nothing else in the supervisor can hold up (issue 23, item 3).

First the renewer (``supervisor/renewer.py``) on its own: its rounds driven by a fake
clock, then its thread (its own connection, paused around forks, stopped and joined).
Then a real ``runworkers`` runs a unit whose handler outlasts a short lease beside a
worker, ``slow_eligible``, whose claim sleeps three leases inside the database every time
it is tried (``tests/testapp/workers.py``). The unit's lease must stay renewed meanwhile:
it commits FINISHED on its first attempt, nothing is reaped and no commit is refused.
"""

from __future__ import annotations

import logging
import signal
import threading

import pytest
from django.db import OperationalError, connection, connections
from django.utils import timezone

from django_dbworker import workers
from django_dbworker.models import Execution, State
from django_dbworker.rows import planner
from django_dbworker.supervisor.duties.base import FAILURE_LOG_INTERVAL, Periodic
from django_dbworker.supervisor.duties.leases import Renewal
from django_dbworker.supervisor.renewer import MAIN_THREAD_SIGNALS, RETRY_PAUSE, Renewer
from django_dbworker.units.claimant import Claimant
from tests.conftest import wait_for
from tests.testapp.models import Effect, Item, Slow
from tests.testapp.slow_sql import SLEPT

LEASE = 1.0


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Scripted(Periodic):
    """A renewal whose runs raise what a test lines up (None: goes through)."""

    name = "renewal"

    def __init__(self, interval: float, errors: list[Exception | None]) -> None:
        super().__init__(interval)
        self.errors = errors
        self.runs = 0

    def work(self, now: float) -> None:
        self.runs += 1
        error = self.errors.pop(0) if self.errors else None
        if error is not None:
            raise error


def _events(caplog, event: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith(event + " ")]


def renewer(interval: float, errors: list[Exception | None]) -> tuple[Renewer, Clock]:
    clock = Clock()
    return Renewer(Scripted(interval, errors), "default", clock), clock  # type: ignore[arg-type]


# ----- its rounds, with a fake clock -----------------------------------------------------


def test_a_round_renews_when_due_and_says_when_the_next_is():
    r, clock = renewer(10.0, [])
    assert r.round() == 10.0 and r.renewal.runs == 1
    clock.now += 4.0
    assert r.round() == 6.0 and r.renewal.runs == 1, "not due: nothing done"
    clock.now += 6.0
    assert r.round() == 10.0 and r.renewal.runs == 2


def test_a_lost_database_backs_off_at_most_an_interval_then_says_it_is_back(caplog):
    lost = OperationalError("server closed the connection unexpectedly")
    r, clock = renewer(0.4, [lost, lost, lost, None])
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        waits = []
        for _ in range(4):
            waits.append(r.round())
            clock.now += waits[-1]
    assert waits == pytest.approx([0.4] * 4), "0.5 s would be longer than an interval"
    assert r.renewal.runs == 4, "tried again at each back-off: due again after a failure"
    errors = _events(caplog, "database_error")
    assert len(errors) == 3 and all(e.endswith("part=renewer") for e in errors), errors
    assert _events(caplog, "reconnected") == ["reconnected down_for=1.2 attempts=3 part=renewer"]


def test_a_lock_held_elsewhere_is_waited_for_again_at_once_and_said_once_a_minute(caplog):
    locked = OperationalError("database is locked")
    r, clock = renewer(10.0, [locked] * 5 + [None])
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        for _ in range(5):
            assert r.round() == RETRY_PAUSE
            clock.now += RETRY_PAUSE
        assert r.round() == 10.0
    assert len(_events(caplog, "renewal_delayed")) == 1
    assert not _events(caplog, "database_error"), "a lock is not an outage"


def test_anything_else_is_logged_once_a_minute_and_never_stops_it(caplog):
    r, clock = renewer(10.0, [ValueError("broken")] * 4)
    with caplog.at_level(logging.INFO, logger="django_dbworker"):
        for _ in range(3):
            assert r.round() == 10.0
            clock.now += 10.0
        clock.now += FAILURE_LOG_INTERVAL
        r.round()
    lines = _events(caplog, "duty_failed")
    assert len(lines) == 2 and 'error="ValueError: broken"' in lines[0], lines


# ----- its thread ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_thread_renews_on_its_own_connection_outside_forks():
    Item.objects.create(kind="touch")
    claimant = Claimant()
    (c,) = planner.claim(workers["touch"], 1, claimant, 1.0)
    seen: list[tuple[object, object, set]] = []
    beat = threading.Event()

    def on_beat() -> None:
        connections["default"].ensure_connection()  # as the beat's UPDATE would
        seen.append((connections["default"], connections["default"].connection,
                     signal.pthread_sigmask(signal.SIG_BLOCK, set())))
        beat.set()

    r = Renewer(Renewal(claimant, 30.0, on_beat, tasks=False), "default")
    with r.paused():  # as around a fork: no round meanwhile
        r.start()
        assert not beat.wait(0.3), "a round ran while paused"
    assert beat.wait(10), "no round after the fork"
    r.stop()
    assert not r.alive()
    wrapper, raw, mask = seen[0]
    assert wrapper is not connections["default"] and raw is not None, "a connection of its own"
    assert wrapper.connection is None, "closed after its round"
    assert mask >= MAIN_THREAD_SIGNALS, "the main thread's signals never reach it"
    lease = Execution.objects.get(pk=c.execution_id).lease_expires_at
    assert (lease - timezone.now()).total_seconds() > 20


# ----- with real runworkers --------------------------------------------------------------


def slow_claim_running(mark) -> bool:
    """Whether ``slow_eligible``'s claim is sleeping in the database now (PostgreSQL) or
    has slept (SQLite: its ``pg_sleep`` touches ``mark``)."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid() AND state = 'active' "
                "AND query LIKE '%%pg_sleep%%'")
            return cursor.fetchone()[0] > 0
    if connection.vendor == "mysql":
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() "
                "AND ID <> CONNECTION_ID() AND COMMAND = 'Query' "
                "AND INFO LIKE 'DO SLEEP(%%'")  # the statement pg_sleep() runs now
            return cursor.fetchone()[0] > 0
    return mark.exists()


def mariadb_pg_sleep() -> None:
    """MariaDB: ``pg_sleep(seconds)`` as a stored function of the test database (0 after
    ``SLEEP``), so ``slow_eligible``'s queryset sleeps in the server there too."""
    with connection.cursor() as cursor:
        cursor.execute("DROP FUNCTION IF EXISTS pg_sleep")
        cursor.execute("CREATE FUNCTION pg_sleep(seconds DOUBLE) RETURNS INT "
                       "NOT DETERMINISTIC NO SQL BEGIN DO SLEEP(seconds); RETURN 0; END")


@pytest.mark.processes
@pytest.mark.processes
def test_a_slow_claim_does_not_delay_renewals(runworkers, tmp_path):
    if connection.vendor == "mysql":
        mariadb_pg_sleep()
    item = Item.objects.create(kind="ahead", action=f"sleep:{4 * LEASE}")
    mark = tmp_path / "slept"
    rw = runworkers("--worker", "ahead", "--worker", "slow_eligible", "--concurrency", "2",
                    lease=LEASE, extra_env={"DBWORKER_TEST_SLOW_ELIGIBLE": str(3 * LEASE),
                                            SLEPT: str(mark)})
    unit = Execution.objects.filter(worker="ahead", source_id=str(item.pk))
    wait_for(lambda: Effect.objects.filter(worker="ahead").exists(),
             what="the unit's handler to run")
    Slow.objects.create()  # waits for slow_eligible: each claim of it sleeps on this row
    wait_for(lambda: slow_claim_running(mark), what="a claim sleeping in the database")
    lapsed = 0.0  # the longest the lease was seen expired while the unit ran
    while (row := unit.get()).state == State.WORKING:  # the handler sleeps 4 leases
        if connection.vendor != "sqlite" and row.lease_expires_at < timezone.now():
            # SQLite: the sleeping claim holds the only write lock, so no renewal can be
            # written meanwhile (nor can anyone reap); PostgreSQL and MariaDB renew beside
            # it.
            lapsed = max(lapsed, (timezone.now() - row.lease_expires_at).total_seconds())
        assert rw.process.poll() is None, rw.output()
    out = rw.output()
    assert (row.state, row.attempts, row.crashes) == (State.FINISHED, 1, 0), out
    assert not lapsed, f"the lease lapsed for {lapsed:.2f} s while the unit ran"
    assert "reaped" not in out and "lease_lost" not in out, out
    assert Execution.objects.get(worker="slow_eligible").state == State.PENDING
    Slow.objects.all().delete()  # no claim sleeps after the one under way
    rw.signal(signal.SIGTERM)
    assert rw.wait(30) == 0, rw.output()
