"""The pending set: one PENDING execution per source row waiting for a worker.

Rows saved through the ORM get theirs in the same transaction (``post_save``); rows written
any other way (``bulk_create``, ``update()``, raw SQL, other programs) are found by
discovery (``sweep``). Deleting a source row removes its executions (``post_delete``); the
full sweep removes any that slip through.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.utils import timezone

from .. import conf
from ..db import notify
from ..models import Execution, State
from ..registry import Worker, workers
from . import keys


@dataclass
class Running:
    """The unit this process is running, so a handler may delete its own source row."""

    execution_id: int
    worker: str
    source_key: str
    deleted: bool = False


running: ContextVar[Running | None] = ContextVar("dbworker_running", default=None)


def add(worker: Worker, pks: Iterable[Any], using: str) -> int:
    """Make ``pks`` pending for ``worker`` unless they already have an execution."""
    now = timezone.now()
    units = [
        Execution(
            worker=worker.name,
            source_id=keys.to_key(worker.source, pk, using),
            sort_key=keys.sort_key(worker.source, pk),
            state=State.PENDING,
            available_at=now,
            created_at=now,
        )
        for pk in pks
    ]
    if units:
        Execution.objects.using(using).bulk_create(units, ignore_conflicts=True)
    return len(units)


def add_siblings(worker: Worker, source_key: str, using: str) -> None:
    """Make the row pending for the other workers over the same model.

    Called when ``worker`` records a status for the row: a worker waiting on that status
    (``has_execution_status`` in its eligible) can then claim it at once, even when the
    row was written without ``save()`` and no sweep has seen it yet.
    """
    siblings = [w for w in workers.for_model(worker.source) if w.name != worker.name]
    if siblings:
        pk = keys.from_key(worker.source, source_key)
        for sibling in siblings:
            add(sibling, [pk], using)
        notify.announce(using, "rows")


def on_save(sender: type[models.Model], instance: models.Model, raw: bool, using: str,
            **kwargs: Any) -> None:
    if raw:
        return
    interested = workers.for_model(sender)
    if not interested or using != conf.get().DATABASE:
        return
    for worker in interested:
        add(worker, [instance.pk], using)
    notify.announce(using, "rows")


def on_delete(sender: type[models.Model], instance: models.Model, using: str,
              **kwargs: Any) -> None:
    interested = workers.for_model(sender)
    if not interested or using != conf.get().DATABASE or instance.pk is None:
        return
    key = keys.to_key(sender, instance.pk, using)
    executions = Execution.objects.using(using).filter(
        worker__in=[w.name for w in interested], source_id=key
    )
    current = running.get()
    if current is not None and current.source_key == key:
        # The running handler deletes its own row: the runner removes the execution
        # when it completes, still guarded by the claim's token.
        current.deleted = True
        executions = executions.exclude(id=current.execution_id)
    executions.delete()
