"""Pausing a task queue or a row worker at runtime: ``pause()``, ``resume()``, ``paused()``.

A pause is a row of ``Pause`` (kind, name). Supervisors keep the set of pauses in memory
(``supervisor/pauses.py``), read again at every ``POLL_INTERVAL`` and at once when a change
is announced (PostgreSQL's NOTIFY, payload ``pause``); they claim nothing from a paused
queue or worker and give back what they had claimed ahead of it. Running units finish;
enqueueing into a paused queue and new source rows of a paused worker are kept as usual.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from . import conf
from .db.notify import announce
from .exceptions import InvalidPause
from .models import Pause, PauseKind
from .rows.registry import workers
from .tasks.names import configured_queues

#: The payload that tells listening supervisors to read the pauses again.
ANNOUNCEMENT = "pause"
REASON_MAX = Pause._meta.get_field("reason").max_length or 255


@dataclass(frozen=True, slots=True, kw_only=True)
class PauseInfo:
    """One pause: ``kind`` ("queue" or "worker"), ``name``, ``since``, ``reason``; ``new``
    is False when it was paused already (``pause()`` keeps the first time and reason)."""

    #: "queue" or "worker".
    kind: str
    #: The queue's or the worker's name.
    name: str
    #: When it was paused.
    since: datetime
    #: Why, as given to ``pause()`` ("" for none).
    reason: str
    #: True when this ``pause()`` paused it; False when it was paused already.
    new: bool = False

    def as_dict(self) -> dict[str, Any]:
        """``kind``, ``name``, ``since`` and ``reason`` as a dict (the CLI's JSON)."""
        return {"kind": self.kind, "name": self.name, "since": self.since,
                "reason": self.reason}


def known_queues() -> list[str]:
    """The queues of the configured DBWorkerBackends (``QUEUES``; only "default" without)."""
    return configured_queues()


def known_workers() -> list[str]:
    return sorted(workers)


def target(queue: str | None = None, worker: str | None = None, *,
           pausing: bool = True) -> tuple[str, str]:
    """``(kind, name)`` of what to pause or resume; InvalidPause when it is unknown, or
    when not exactly one of ``queue``, ``worker`` is given. ``pausing=False`` also accepts
    a name that is paused now, so a pause outlives a queue or worker removed since."""
    if (queue is None) == (worker is None):
        raise InvalidPause("Name exactly one of queue= or worker= (got "
                           f"queue={queue!r}, worker={worker!r}).")
    kind, name = (PauseKind.QUEUE, queue) if queue is not None else (PauseKind.WORKER, worker)
    assert name is not None
    known = known_queues() if kind == PauseKind.QUEUE else known_workers()
    if name in known:
        return kind.value, name
    if not pausing and _rows().filter(kind=kind, name=name).exists():
        return kind.value, name
    if kind == PauseKind.QUEUE:
        raise InvalidPause(f"Unknown queue {name!r}: the task queues are {known}. Use one of "
                           "those, or add it to TASKS[...]['QUEUES'] in your settings.")
    raise InvalidPause(f"Unknown worker {name!r}: the registered workers are {known}. Check "
                       "the spelling, and that its app is in INSTALLED_APPS with the worker "
                       "in its workers.py.")


def pause(queue: str | None = None, worker: str | None = None, reason: str = "") -> PauseInfo:
    """Pause the task queue ``queue`` or the row worker ``worker``: supervisors stop
    claiming from it (within a second on PostgreSQL, within ``POLL_INTERVAL`` elsewhere).
    Pausing what is paused already changes nothing and returns that pause (``new`` False).

    Name exactly one of ``queue`` and ``worker``; ``reason`` (at most 255 characters) is
    shown by the admin and the CLI. An unknown name raises ``InvalidPause``, naming the
    queues or workers there are; nothing is written then."""
    kind, name = target(queue, worker)
    reason = str(reason)
    if len(reason) > REASON_MAX:
        raise InvalidPause(f"The reason is {len(reason)} characters long; give at most "
                           f"{REASON_MAX}.")
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        row, created = _rows().get_or_create(kind=kind, name=name,
                                             defaults={"reason": reason})
        if created:
            announce(using, ANNOUNCEMENT)  # delivered when (and only if) this commits
    return _info(row, new=created)


def resume(queue: str | None = None, worker: str | None = None) -> PauseInfo | None:
    """Resume a paused queue or worker; returns the pause that ended, or None when it was
    not paused (not an error: resuming is idempotent). An unknown name is an error."""
    kind, name = target(queue, worker, pausing=False)
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        row = _rows().select_for_update().filter(kind=kind, name=name).first()
        if row is None:
            return None
        _rows().filter(pk=row.pk).delete()
        announce(using, ANNOUNCEMENT)
    return _info(row)


def paused(kind: str | None = None) -> list[PauseInfo]:
    """Every pause (of ``kind``, "queue" or "worker", if given), by kind and name."""
    rows = _rows() if kind is None else _rows().filter(kind=kind)
    return [_info(row) for row in rows.order_by("kind", "name")]


def _rows() -> Any:
    return Pause.objects.using(conf.get().DATABASE)


def _info(row: Pause, *, new: bool = False) -> PauseInfo:
    return PauseInfo(kind=row.kind, name=row.name, since=row.paused_at, reason=row.reason,
                     new=new)
