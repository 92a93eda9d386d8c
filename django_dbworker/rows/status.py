"""Execution status for one row, and as an expression inside ordinary querysets."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Exists, OuterRef
from django.db.models.functions import Cast

from .. import conf
from ..db import keys
from ..models import Execution, ExecutionStatus, State, no_execution
from .registry import Worker, workers


def _worker(worker: str | Worker) -> Worker:
    return worker if isinstance(worker, Worker) else workers[worker]


def execution_status(*, worker: str | Worker, source_id: Any) -> ExecutionStatus | None:
    """The status of ``worker``'s execution on the row ``source_id``; None if unclaimed."""
    w = _worker(worker)
    alias = conf.get().DATABASE
    state = (
        Execution.objects.using(alias)
        .filter(worker=w.name, source_id=keys.to_key(w.source, source_id, alias))
        .values_list("state", flat=True)
        .first()
    )
    return None if state in (None, State.PENDING) else ExecutionStatus(state)


def _statuses(statuses: Iterable[ExecutionStatus | str] | None) -> list[str]:
    if statuses is None:
        return list(ExecutionStatus.values)
    if isinstance(statuses, str):
        statuses = [statuses]
    result = []
    for status in statuses:
        if status not in ExecutionStatus.values:
            raise ValueError(
                f"{status!r} is not an execution status; use one of "
                f"{', '.join(ExecutionStatus.names)} (ExecutionStatus.FINISHED, ...)."
            )
        result.append(str(ExecutionStatus(status).value))
    if not result:
        raise ValueError("statuses= is empty; pass at least one ExecutionStatus.")
    return result


def has_execution_status(
    *,
    worker: str | Worker,
    statuses: Iterable[ExecutionStatus | str] | None = None,
    source_id: Any = None,
) -> Exists:
    """True where ``worker``'s execution on the row has one of ``statuses``.

    Use it in ``.filter()``, ``.exclude()``, ``Q`` combinations and another worker's
    ``eligible``. ``source_id`` defaults to ``OuterRef("pk")``; ``statuses`` to all four.
    """
    w = _worker(worker)
    if source_id is None:
        source_id = OuterRef("pk")
    key: Cast | str
    if hasattr(source_id, "resolve_expression"):
        key = keys.key_expression(source_id)
    else:
        key = keys.to_key(w.source, source_id, conf.get().DATABASE)
    return Exists(
        Execution.objects.filter(worker=w.name, state__in=_statuses(statuses), source_id=key)
    )


def execution_state(worker: Worker, pk: Any) -> dict[str, Any]:
    """``Execution.as_dict()`` of ``worker``'s execution on the row ``pk`` (the same keys
    when there is none), with ``source_id`` the ``pk`` as given and ``execution_id`` an
    alias of ``id`` (kept since the first release)."""
    alias = conf.get().DATABASE
    execution = (
        Execution.objects.using(alias)
        .filter(worker=worker.name, source_id=keys.to_key(worker.source, pk, alias))
        .first()
    )
    doc = no_execution(worker.name, pk) if execution is None else execution.as_dict()
    return {**doc, "source_id": pk, "execution_id": doc["id"]}
