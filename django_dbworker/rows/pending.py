"""The pending set: one PENDING execution per source row waiting for a worker.

Rows saved through the ORM get theirs in the same transaction (``post_save``); rows written
any other way (``bulk_create``, ``update()``, raw SQL, other programs) are found by the
sweep, which walks the source table by primary key in bounded chunks. Deleting a source
row removes its executions (``post_delete``); the sweep removes any that slip through.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import models
from django.db.models import OuterRef
from django.utils import timezone

from .. import conf
from ..db import notify
from ..models import Execution, State
from ..registry import Worker, workers
from . import keys
from .queries import Probe


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


class Sweeper:
    """Finds eligible source rows without an execution, one bounded chunk at a time.

    A chunk is a range of keys, ``(cursor, end]`` with ``end`` the ``batch``-th key after
    the cursor (one indexed lookup): the server probes the unique index of executions for
    each row of it (``Probe``: never a join the planner could misjudge on a table it has
    no statistics for yet), and no list of a thousand keys goes back and forth (that cost
    the supervisor ~6 ms of CPU per chunk; bench/README.md).
    """

    def __init__(self, worker: Worker, batch: int) -> None:
        self.worker = worker
        self.batch = batch
        self.cursor: Any = None
        self.orphan_cursor: int | None = None

    def step(self) -> tuple[int, bool]:
        """Sweep the next chunk; return (units added, whether a full pass just ended).

        A pass walks the source rows, then the worker's executions for orphans.
        """
        using = conf.get().DATABASE
        if self.orphan_cursor is not None:
            return 0, self._remove_orphans(using)
        model = self.worker.source
        rows = _after(model._base_manager.using(using), "pk", self.cursor)
        end = _chunk_end(rows, "pk", self.batch)
        if end is None:
            self.cursor = None
            self.orphan_cursor = 0
            return 0, False
        start, self.cursor = self.cursor, end
        has_unit = Execution.objects.filter(
            worker=self.worker.name, source_id=keys.key_expression(OuterRef("pk"))
        )
        missing = (
            _after(self.worker.eligible_queryset().using(using).order_by(), "pk", start)
            .filter(pk__lte=end)
            .filter(~Probe(has_unit))
            .values_list("pk", flat=True)
        )
        return add(self.worker, list(missing), using), False

    def sweep_all(self) -> int:
        self.cursor = self.orphan_cursor = None
        added = 0
        while True:
            n, done = self.step()
            added += n
            if done:
                return added

    def _remove_orphans(self, using: str) -> bool:
        """Delete one range of executions whose source row is gone; True when done.

        Running units are left alone: their handler finds the row gone and forgets them.
        """
        model = self.worker.source
        executions = Execution.objects.using(using).filter(worker=self.worker.name)
        end = _chunk_end(executions.filter(id__gt=self.orphan_cursor), "id", self.batch)
        if end is None:
            self.orphan_cursor = None
            return True
        source = model._base_manager.using(using).filter(
            pk=keys.pk_expression(model, OuterRef("source_id")))
        gone = list(executions.filter(id__gt=self.orphan_cursor, id__lte=end)
                    .filter(~Probe(source)).values_list("id", flat=True))
        if gone:  # a read first: a delete takes SQLite's write lock even for no rows
            Execution.objects.using(using).filter(id__in=gone).exclude(
                state=State.WORKING).delete()
        self.orphan_cursor = end
        return False


def _after(qs: Any, field: str, cursor: Any) -> Any:
    return qs if cursor is None else qs.filter(**{f"{field}__gt": cursor})


def _chunk_end(qs: Any, field: str, batch: int) -> Any:
    """The ``batch``-th value of ``field`` in ``qs`` in its order, or the last one when
    fewer follow; None when none does."""
    ordered = qs.order_by(field).values_list(field, flat=True)
    end = list(ordered[batch - 1:batch])
    if not end:
        end = list(qs.order_by(f"-{field}").values_list(field, flat=True)[:1])
    return end[0] if end else None
