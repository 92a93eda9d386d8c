"""Which task functions may run: only tasks registered by ``@task`` in modules already imported.

A task row names its function by dotted path. A row never causes an import: a path resolves
only to a ``DBWorkerTask`` created in this process (``@task`` of a DBWorkerBackend registers
it, ``register``) by a module imported for another reason: each installed app's ``tasks``
module (imported at start-up, ``apps.DBWorkerConfig.ready``), or a module an app imports in
its own ``AppConfig.ready()``. Anything else fails with ``UnknownTask``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..exceptions import UnknownTask

if TYPE_CHECKING:
    from .task import DBWorkerTask

_tasks: dict[str, DBWorkerTask] = {}

HOW_TO_REGISTER = (
    "define it with @task in the tasks.py module of an app in INSTALLED_APPS, or import the "
    "module defining it in that app's AppConfig.ready(); a task row never imports a module"
)


def register(task: DBWorkerTask) -> None:
    _tasks.setdefault(task.module_path, task)


def known() -> dict[str, DBWorkerTask]:
    return dict(_tasks)


def resolve(path: str) -> DBWorkerTask:
    """The registered task named ``path``; UnknownTask saying how to register it if none.

    Nothing is imported: ``path`` comes from a row, which may have been changed by anyone
    who can write to the table."""
    task = _tasks.get(path) if isinstance(path, str) else None
    if task is None:
        shown = repr(path) if len(repr(path)) <= 300 else repr(path)[:300] + "..."
        raise UnknownTask(f"{shown} is not a registered task; {HOW_TO_REGISTER}.")
    return task
