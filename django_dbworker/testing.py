"""Helpers for our users' own tests: run queued work in-process, no subprocesses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from . import conf
from .claims import pending, store
from .claims.store import Claimant
from .registry import Worker, workers
from .runner import run


def run_until_idle(
    worker_names: Iterable[str] | None = None, *, max_units: int = 10_000
) -> Counter[str]:
    """Run every claimable unit in this process until none is left; return outcome counts.

    Works inside Django's ``TestCase`` (each unit runs in a savepoint of the test's
    transaction). Units with ``Unfinished(delay=...)`` wait for their delay, so they are
    not re-run here until it has passed. ``max_units`` guards against a handler that always
    returns ``Unfinished()``.
    """
    selected: list[Worker] = (
        list(workers.values()) if worker_names is None else [workers[n] for n in worker_names]
    )
    config = conf.get()
    for worker in selected:
        pending.Sweeper(worker, config.SWEEP_BATCH).sweep_all()
    claimant = Claimant()
    counts: Counter[str] = Counter()
    while True:
        claimed = False
        for worker in selected:
            for claim in store.claim(worker, 1, claimant, config.LEASE_SECONDS):
                claimed = True
                counts[run(claim).outcome] += 1
                if counts.total() >= max_units:
                    raise RuntimeError(
                        f"run_until_idle() ran {max_units} units and work is still left; a "
                        "handler probably returns Unfinished() forever."
                    )
        if not claimed:
            return counts
