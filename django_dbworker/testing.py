"""Helpers for our users' own tests: run queued work in-process, no subprocesses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from django.db import DatabaseError

from . import conf, progress
from .registry import Worker, workers
from .rows import store
from .rows.store import Claimant
from .rows.sweep import Sweeper
from .supervisor import units
from .supervisor.pauses import Pauses
from .tasks import concurrency
from .tasks import store as taskstore
from .workflows.rows import release_ended_rows


def run_until_idle(
    worker_names: Iterable[str] | None = None,
    *,
    tasks: bool | None = None,
    max_units: int = 10_000,
) -> Counter[str]:
    """Run every claimable unit in this process until none is left; return outcome counts.

    Runs the named workers (default: all) and, unless ``tasks=False``, the ready tasks of
    every queue (default: only when no worker names are given); paused queues and workers
    (``django_dbworker.pause``) are left alone, as supervisors leave them. A task's
    ``timeout`` is not enforced here (there is no child process to stop).

    Works inside Django's ``TestCase`` (each unit runs in a savepoint of the test's
    transaction). Units with ``Unfinished(delay=...)`` wait for their delay, so they are
    not re-run here until it has passed. ``max_units`` guards against a handler that always
    returns ``Unfinished()``.
    """
    selected: list[Worker] = (
        list(workers.values()) if worker_names is None else [workers[n] for n in worker_names]
    )
    config = conf.get()
    sweepers = [Sweeper(worker, config.SWEEP_BATCH) for worker in selected]
    run_tasks = worker_names is None if tasks is None else tasks
    claimant = Claimant()
    keyed = concurrency.declared()  # tasks with a concurrency limit are claimed too
    counts: Counter[str] = Counter()
    pauses = Pauses(config.DATABASE, 0.0)  # paused queues and workers are left alone
    while True:
        pauses.refresh(0.0, announced=True)
        claims: list = []
        for worker in selected:
            if worker.name not in pauses.workers:
                claims += store.claim(worker, 1, claimant, config.LEASE_SECONDS)
        if run_tasks:
            claims += taskstore.claim(None, 1, claimant, config.LEASE_SECONDS,
                                      exclude_queues=pauses.queues, keyed=keyed)
        if not claims:
            # Rows written without save() that became eligible meanwhile (say, through
            # another worker's status) have no pending unit yet: sweep before giving up.
            if sum(sweeper.sweep_all() for sweeper in sweepers):
                continue
            # Tasks waiting for rows that ended (after_row), as a supervisor's duty would
            # release them: then they are claimable.
            if run_tasks and release_ended_rows(config.DATABASE):
                continue
            progress.close()
            return counts
        for claim in claims:
            counts[_run(claim)] += 1
            if counts.total() >= max_units:
                raise RuntimeError(
                    f"run_until_idle() ran {max_units} units and work is still left; a "
                    "handler probably returns Unfinished() forever."
                )


def _run(claim: units.Unit) -> str:
    """Run one unit as a runworkers child would: anything but a database error that
    escapes it becomes its FAILED record (a database error is raised: inside a test's
    transaction nothing more can be written)."""
    try:
        result = claim.run()  # with no one to keep its success, a task records it now
        assert result is not None
        return result.outcome
    except DatabaseError:
        raise
    except Exception as exc:
        return "failed" if units.fail(claim, units.fallback(claim, exc)) else "lease_lost"
