"""Workflows: tasks that wait for other tasks (and rows), docs/workflows.md.

``dependencies`` stores a dependent with its edges (``task.using(after=[...])``);
``release`` resolves the edges of a task that ends, in the transaction of its final
status; ``builder`` makes workflows of steps (``chain``, ``group``) and ``handle`` shows
and cancels them as units.

    from django_dbworker.workflows import chain, group

    handle = chain(fetch.step(url), group(resize.step(1), resize.step(2)),
                   report.step()).enqueue(name="nightly", on_complete=notify)
    handle.progress()       # {"READY": 1, "WAITING": 3, ..., "total": 4}
    handle.cancel()
    django_dbworker.workflows.get(handle.id)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .builder import Chain, Group, Shape, Step, chain, group

if TYPE_CHECKING:
    from .handle import WorkflowHandle, get

__all__ = ["Chain", "Group", "Shape", "Step", "WorkflowHandle", "chain", "get", "group"]


def __getattr__(name: str) -> Any:
    # handle.py reads the models: imported on first use, once the app registry is ready.
    if name in ("get", "WorkflowHandle"):
        from . import handle

        return getattr(handle, name)
    raise AttributeError(f"module 'django_dbworker.workflows' has no attribute {name!r}")
