"""``dbworker pause``, ``resume`` and ``paused``: pauses of task queues and row workers
(``django_dbworker.pausing``), as documents."""

from __future__ import annotations

from typing import Any

from .. import pausing
from ..exceptions import InvalidPause
from . import OperationError


def pause(queue: str | None, worker: str | None, reason: str) -> dict[str, Any]:
    """``changed`` False when it was paused already (its first time and reason are kept)."""
    try:
        info = pausing.pause(queue=queue, worker=worker, reason=reason)
    except InvalidPause as exc:
        raise OperationError(str(exc)) from None
    return {"changed": info.new, "pause": info.as_dict()}


def resume(queue: str | None, worker: str | None) -> dict[str, Any]:
    """``changed`` False when it was not paused (``pause``: None then)."""
    try:
        info = pausing.resume(queue=queue, worker=worker)
    except InvalidPause as exc:
        raise OperationError(str(exc)) from None
    return {"changed": info is not None,
            "kind": "queue" if queue is not None else "worker",
            "name": queue if queue is not None else worker,
            "pause": None if info is None else info.as_dict()}


def paused() -> dict[str, Any]:
    return {"pauses": [info.as_dict() for info in pausing.paused()]}
