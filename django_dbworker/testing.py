"""Helpers for our users' own tests: run queued work in-process (no subprocesses), see
what was enqueued, move time, run cron ticks; ``DBWorkerTestMixin`` for
``django.test.TestCase`` and the pytest fixtures of ``django_dbworker.pytest_plugin``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.utils import timezone

from . import conf
from .djtasks import Task, TaskResult, task_enqueued
from .rows import planner
from .rows.registry import Worker, workers
from .rows.sweep import Sweeper
from .supervisor import units
from .supervisor.pauses import Pauses
from .tasks import concurrency
from .tasks import planner as taskplanner
from .tasks.scheduler import Scheduler
from .tasks.schedules import schedules
from .tasks.stored_schedules import StoredSource
from .units import progress
from .units.claimant import Claimant
from .units.running import give_back
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
                claims += planner.claim(worker, 1, claimant, config.LEASE_SECONDS)
        if run_tasks:
            claims += taskplanner.claim(None, 1, claimant, config.LEASE_SECONDS,
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
        for n, claim in enumerate(claims):
            try:
                counts[units.run_here(claim)] += 1
            except KeyboardInterrupt:  # the user's Ctrl-C: the rest goes back unrun
                give_back(claims[n + 1:])
                raise
            if counts.total() >= max_units:
                raise RuntimeError(
                    f"run_until_idle() ran {max_units} units and work is still left; a "
                    "handler probably returns Unfinished() forever."
                )


# ----- what was enqueued ------------------------------------------------------------------


@dataclass
class Enqueued:
    """The tasks enqueued while it records (``record()``, the ``enqueued`` fixture,
    ``DBWorkerTestMixin.captureEnqueued``), in order: every backend's ``task_enqueued``
    signal, so ``enqueue_on_commit`` tasks appear when the transaction commits (in a
    ``TestCase``: under ``captureOnCommitCallbacks(execute=True)``) and an idempotency
    key that found its holder adds nothing."""

    #: The results of every task enqueued while it recorded, in enqueue order.
    results: list[TaskResult] = field(default_factory=list)

    def _add(self, sender: Any, task_result: TaskResult, **kwargs: Any) -> None:
        self.results.append(task_result)

    def of(self, task: Task) -> list[TaskResult]:
        """The results of ``task`` (any ``.using()`` variant of it), in enqueue order."""
        return [r for r in self.results if r.task.module_path == task.module_path]

    def calls(self, task: Task) -> list[tuple[list[Any], dict[str, Any]]]:
        """``(args, kwargs)`` of each call of ``task``, in enqueue order."""
        return [(list(r.args), dict(r.kwargs)) for r in self.of(task)]

    def assert_enqueued(self, task: Task, *args: Any, **kwargs: Any) -> TaskResult:
        """The first result of ``task`` called with exactly these arguments; otherwise an
        AssertionError listing what was enqueued of it."""
        for result in self.of(task):
            if list(result.args) == list(args) and dict(result.kwargs) == kwargs:
                return result
        seen = self.calls(task)
        raise AssertionError(
            f"{task.module_path} was not enqueued with args={list(args)!r}, "
            f"kwargs={kwargs!r}; it was enqueued {len(seen)} time(s)"
            + (": " + "; ".join(f"args={a!r}, kwargs={k!r}" for a, k in seen) if seen else ".")
        )

    def assert_not_enqueued(self, task: Task) -> None:
        """AssertionError, listing the calls, if ``task`` was enqueued at all."""
        seen = self.calls(task)
        if seen:
            raise AssertionError(f"{task.module_path} was enqueued {len(seen)} time(s): "
                                 + "; ".join(f"args={a!r}, kwargs={k!r}" for a, k in seen))

    def clear(self) -> None:
        """Forget what was recorded so far (recording goes on)."""
        self.results.clear()


@contextmanager
def record() -> Iterator[Enqueued]:
    """Record the tasks enqueued inside the ``with`` block."""
    enqueued = Enqueued()
    task_enqueued.connect(enqueued._add, dispatch_uid=id(enqueued), weak=False)
    try:
        yield enqueued
    finally:
        task_enqueued.disconnect(dispatch_uid=id(enqueued))


# ----- time and cron ------------------------------------------------------------------------


class Clock:
    """The time our code reads, moved by the test (``dbworker_clock`` fixture,
    ``DBWorkerTestMixin.freezeTime``), through time-machine: ``timezone.now()`` everywhere in
    this process (run_after, retry delays, ``Unfinished(delay=...)``, cron ticks,
    retention), as no database reads its own clock for them. It stands still unless
    moved."""

    def __init__(self, traveller: Any) -> None:
        self._traveller = traveller

    def now(self) -> datetime:
        """The time it stands at (what ``timezone.now()`` returns meanwhile)."""
        return timezone.now()

    def advance(self, by: float | timedelta) -> datetime:
        """Move ``by`` seconds (or a timedelta) forward; the new now."""
        seconds = by.total_seconds() if isinstance(by, timedelta) else float(by)
        if not seconds >= 0:
            raise ValueError(f"Clock.advance({by!r}): give 0 or more seconds; time does not "
                             "go back under a running queue.")
        self._traveller.shift(timedelta(seconds=seconds))
        return timezone.now()


@contextmanager
def frozen_time(start: datetime | None = None) -> Iterator[Clock]:
    """A ``Clock`` standing at ``start`` (default: now) inside the ``with`` block."""
    try:
        import time_machine
    except ImportError:
        raise ImportError(
            "django_dbworker.testing.frozen_time() needs time-machine: "
            "pip install \"django-dbworker[testing]\" (or time-machine)."
        ) from None
    with time_machine.travel(start or timezone.now(), tick=False) as traveller:
        yield Clock(traveller)


class Schedules:
    """The cron schedules (``@cron``, ``DBWORKER["SCHEDULES"]``, stored ones) as a supervisor
    runs them, driven by the test: ``tick()`` enqueues every tick that came due since the
    last call (the first call: since this object was made), once each, as a supervisor
    looking every second would have. Use it with a ``Clock`` to make a day pass."""

    #: Ticks one ``tick()`` walks through at most (a schedule every second for hours).
    MAX_TICKS = 100_000

    def __init__(self) -> None:
        self._last = timezone.now()
        self._scheduler = Scheduler(schedules(), now=self._last, stored=StoredSource())
        self._scheduler.refresh(self._last)

    def tick(self) -> int:
        """How many tasks it enqueued."""
        now = timezone.now()
        self._scheduler.refresh(now)
        due = sorted({t for s in self._scheduler.schedules.values()
                      for t in s.ticks(self._last, now, self.MAX_TICKS + 1)})
        if len(due) > self.MAX_TICKS:
            raise RuntimeError(f"Schedules.tick(): more than {self.MAX_TICKS} ticks came due "
                               "since the last call; call tick() more often.")
        enqueued = sum(self._scheduler.tick(now=t) for t in due)
        enqueued += self._scheduler.tick(now=now)
        self._last = now
        return enqueued


# ----- django.test.TestCase -----------------------------------------------------------------


class DBWorkerTestMixin:
    """For ``django.test.TestCase`` (or ``TransactionTestCase``) classes:
    ``self.runUntilIdle()``, ``with self.captureEnqueued() as enqueued``,
    ``self.assertEnqueued(task, *args, **kwargs)`` (inside that ``with`` or after it, for
    the last capture), ``with self.freezeTime() as clock`` and ``self.cronSchedules()``."""

    _dbworker_enqueued: Enqueued | None = None

    def runUntilIdle(self, worker_names: Iterable[str] | None = None, *,
                     tasks: bool | None = None) -> Counter[str]:
        """``run_until_idle(worker_names, tasks=tasks)``."""
        return run_until_idle(worker_names, tasks=tasks)

    @contextmanager
    def captureEnqueued(self) -> Iterator[Enqueued]:
        """A context manager recording the tasks enqueued inside it (``Enqueued``); the
        assertions below read the last one."""
        with record() as enqueued:
            self._dbworker_enqueued = enqueued
            yield enqueued

    def assertEnqueued(self, task: Task, *args: Any, **kwargs: Any) -> TaskResult:
        """``Enqueued.assert_enqueued`` on the last capture."""
        if self._dbworker_enqueued is None:
            raise AssertionError("assertEnqueued() needs a capture first: "
                                 "with self.captureEnqueued(): ...")
        return self._dbworker_enqueued.assert_enqueued(task, *args, **kwargs)

    def assertNotEnqueued(self, task: Task) -> None:
        """``Enqueued.assert_not_enqueued`` on the last capture."""
        if self._dbworker_enqueued is None:
            raise AssertionError("assertNotEnqueued() needs a capture first: "
                                 "with self.captureEnqueued(): ...")
        self._dbworker_enqueued.assert_not_enqueued(task)

    def freezeTime(self, start: datetime | None = None) -> Any:
        """``frozen_time(start)``: ``with self.freezeTime() as clock: ...``."""
        return frozen_time(start)

    def cronSchedules(self) -> Schedules:
        """``Schedules()``: the cron schedules, ticked by the test."""
        return Schedules()
