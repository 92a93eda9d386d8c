"""Snoozing: a running task that raised ``Snooze(delay)`` goes back to READY for later.

A snooze is not an attempt: the claim's ``attempts + 1`` and the worker id it appended are
taken back (Django's ``TaskResult.attempts`` is the number of worker ids), so a task that
snoozes then succeeds has used one attempt. ``crashes``, ``errors``, ``started_at`` and the
progress are kept; ``snoozes`` goes up by one. It is written at once, one guarded UPDATE
fenced by the claim's token (and its lease, where records check it), never batched with
successes (``completions``): snoozes are rare and their delay starts now.

The bound: a task may snooze ``max_snoozes`` times (``DBWorkerTask``, default 100); the
next snooze is a failed attempt with ``SnoozeLimitExceeded`` (``limit_exceeded``), which the
runner records like any other failure (retries apply).
"""

from __future__ import annotations

from typing import Any

from django.db.models import F, Func, JSONField
from django.utils import timezone

from .. import conf
from ..db import engine
from ..exceptions import SnoozeLimitExceeded
from ..models import TaskRecord, TaskStatus
from ..rows.store import lease_live
from . import retry
from .store import TRANSITIONS, TaskClaim

#: The default of ``DBWorkerTask.max_snoozes``, for a task of another class.
DEFAULT_MAX_SNOOZES = 100


def _guarded(c: TaskClaim, using: str) -> Any:
    """The claim's row while it is RUNNING with the claim's token and, where records check
    it, an unexpired lease (as every record of the child that ran it)."""
    qs = TaskRecord.objects.using(using).filter(
        pk=c.task_id, token=c.token, status__in=TRANSITIONS["snooze"])
    return qs.filter(lease_expires_at__gt=timezone.now()) if lease_live(using) else qs


def record(c: TaskClaim, seconds: float) -> int:
    """RUNNING -> READY, available ``seconds`` from now, the attempt taken back and
    ``snoozes + 1``; the rows changed (0: the claim was lost, or a cancel was asked for:
    ``cancel_requested``)."""
    using = conf.get().DATABASE
    last_removed = Func(F("worker_ids"), template=engine(using).json_drop_last(),
                        output_field=JSONField())
    return _guarded(c, using).filter(cancel_requested_at__isnull=True).update(
        status=TaskStatus.READY,
        available_at=retry.at(timezone.now(), seconds),
        attempts=F("attempts") - 1,
        worker_ids=last_removed,
        snoozes=F("snoozes") + 1,
        token=None,
        lease_expires_at=None,
    )


def cancel_requested(c: TaskClaim) -> bool:
    """Whether the claim still holds its task and someone asked to cancel it: a snooze then
    ends it CANCELLED instead (the person asked it to stop; it did not finish)."""
    using = conf.get().DATABASE
    return _guarded(c, using).filter(cancel_requested_at__isnull=False).exists()


def limit_exceeded(task: Any, c: TaskClaim, snoozed: int) -> SnoozeLimitExceeded | None:
    """The error to fail this attempt with when the task, which snoozed ``snoozed`` times
    before, may not snooze again; None while it may."""
    most = getattr(task, "max_snoozes", DEFAULT_MAX_SNOOZES)
    if snoozed < most:
        return None
    return SnoozeLimitExceeded(
        f"task {c.task_path!r} raised Snooze again after {snoozed} snoozes, its max_snoozes "
        f"({most}): this snooze counts as a failed attempt. Raise max_snoozes in its "
        "@task(...), or stop snoozing: fail, or finish with what can be done now."
    )
