"""The immediate mode of ``DBWorkerBackend`` (``OPTIONS: {"IMMEDIATE": True}``): each
enqueue stores its tasks as ever, then runs them in the caller before it returns, with our
semantics (retries, results, errors, callbacks, transactional tasks, dependencies).

What differs from ``runworkers`` (docs/testing.md, "Immediate mode"): a retry runs at once
(its delay is not waited), a task that waits for its ``run_after``, a snooze or a
dependency not met stays stored for a supervisor (or ``run_until_idle()``); rate limits,
concurrency limits and paused queues are not applied; ``timeout`` is not enforced (no
child to stop).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from .. import conf
from ..models import TaskDependency, TaskRecord, TaskStatus
from ..units import progress
from ..units.claimant import Claimant
from ..units.running import give_back, run_here
from . import planner
from . import store as taskstore

#: Most attempts one enqueue runs in the caller (a task with retries=1_000_000 that always
#: fails would otherwise hold the caller for its million attempts).
MAX_ATTEMPTS = 10_000


def run(ids: Iterable[Any]) -> int:
    """Run the tasks ``ids`` (and the dependents their ends release) in this process until
    none of them is claimable now; returns how many attempts ran."""

    config = conf.get()
    using = config.DATABASE
    claimant = Claimant()
    todo = set(ids)
    attempts = 0
    try:
        while todo:
            with transaction.atomic(using=using):
                claims = planner.claim_ids(list(todo), claimant, config.LEASE_SECONDS,
                                             timezone.now(), held=False)
            if not claims:
                return attempts
            if attempts + len(claims) > MAX_ATTEMPTS:
                taskstore.unclaim(claims)  # back as they were, their attempt taken back
                raise RuntimeError(
                    f"immediate mode ran {attempts} attempts for one enqueue and tasks are "
                    "still due (a task retried that many times, or dependents without "
                    "end); the rest stays stored for runworkers "
                    "(django_dbworker.tasks.immediate.MAX_ATTEMPTS).")
            ran = [c.unit_pk for c in claims]
            ordered = sorted(claims, key=taskstore.claim_order)
            for n, claim in enumerate(ordered):
                try:
                    run_here(claim)
                except KeyboardInterrupt:  # the user's Ctrl-C: the rest goes back unrun
                    give_back(ordered[n + 1:])
                    raise
                attempts += 1
            records = TaskRecord.objects.using(using)
            # A retry runs at once: the caller waits for the task's end, not its delay.
            records.filter(pk__in=ran, status=TaskStatus.RETRYING).update(
                available_at=timezone.now())
            todo.update(TaskDependency.objects.using(using).filter(
                dependency_id__in=ran).values_list("dependent_id", flat=True))
    finally:
        progress.close()
    return attempts
