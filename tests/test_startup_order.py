"""What a starting runworkers does first, for work that waits already: children open their
connection before their first unit, and the first round claims before the duties (reaping,
sweeps, schedules, dependencies), except on SQLite, where those writes would wait for the
write lock of a handler the claim just started. With the database a few milliseconds away,
each of those is tens of milliseconds off the first units' path (bench/distance.py)."""

from __future__ import annotations

import os

import pytest
from django.db import connection

from tests.conftest import wait_for
from tests.testapp import tasks

pytestmark = [pytest.mark.processes, pytest.mark.django_db(transaction=True)]


def backends() -> int:
    """Other sessions on this test database (PostgreSQL)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                       " AND pid <> pg_backend_pid()")
        return cursor.fetchone()[0]


def settled(rw) -> int:  # type: ignore[no-untyped-def]
    """The number of other sessions once it stopped changing for a second."""
    wait_for(lambda: "runworkers:" in rw.output(), what="runworkers to start")
    seen: list[int] = []

    def steady() -> bool:
        seen.append(backends())
        return len(seen) > 20 and len(set(seen[-20:])) == 1

    wait_for(steady, what="the number of sessions to settle")
    return seen[-1]


def test_idle_children_hold_their_connection_before_any_unit(vendor, runworkers):
    if vendor != "postgresql":
        pytest.skip("counts sessions in pg_stat_activity")
    one = runworkers("--concurrency", "1", "--queue", "default")
    with_one = settled(one)
    one.stop()
    wait_for(lambda: backends() == 0, what="the first runworkers' sessions to end")
    three = runworkers("--concurrency", "3", "--queue", "default")
    assert settled(three) == with_one + 2, "each child connected before it ran anything"


def test_the_first_round_claims_before_the_duties(vendor, runworkers, tmp_path):
    trace = tmp_path / "trace.log"
    result = tasks.add.enqueue(1, 2)
    rw = runworkers("--burst", "--concurrency", "1", "--queue", "default",
                    extra_env={"DBWORKER_TRACE": str(trace)})
    assert rw.wait(60) == 0, rw.output()
    result.refresh()
    assert result.return_value == 3
    lines = [line.split(" ", 3) for line in trace.read_text().splitlines()]
    supervisor = [line for line in lines if int(line[1]) == rw.pid]
    first_claim = next(i for i, line in enumerate(supervisor) if line[2] == "claimed")
    assert supervisor[first_claim][3].startswith("1 of"), supervisor[first_claim]
    before = " ".join(line[3] for line in supervisor[:first_claim] if len(line) > 3)
    duties = [name for name in ("workflow", "taskdependency", "execution")
              if f"django_dbworker_{name}" in before]
    if vendor == "sqlite":
        assert duties, "SQLite: the duties first (their writes would wait for the handler)"
    else:
        assert not duties, f"statements of duties before the first claim: {duties}"
    assert os.path.getsize(trace) > 0
