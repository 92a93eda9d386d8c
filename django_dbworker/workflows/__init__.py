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

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .builder import Chain, Group, Shape, Step, chain, group
    from .handle import WorkflowHandle, get

__all__ = ["Chain", "Group", "Shape", "Step", "WorkflowHandle", "chain", "get", "group"]

#: The module of each public name, imported on first use: ``builder`` makes workflows,
#: which a supervisor and its children import this package for (``rows``, the duty that
#: releases tasks waiting for rows) never do; ``handle`` reads the models, once the app
#: registry is ready.
_HOMES = {"Chain": "builder", "Group": "builder", "Shape": "builder", "Step": "builder",
          "chain": "builder", "group": "builder", "WorkflowHandle": "handle", "get": "handle"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'django_dbworker.workflows' has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{home}"), name)
