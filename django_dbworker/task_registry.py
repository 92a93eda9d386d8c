"""Which task functions may run: only ``django.tasks`` tasks from installed apps.

A task row names its function by dotted path. We never import an arbitrary path from the
database: a path resolves only to a task already created in this process, or to a module
inside an installed app whose attribute is a ``django.tasks.Task``.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from django.apps import apps
from django.tasks import Task

from .exceptions import UnknownTask

if TYPE_CHECKING:
    from .backend import DBWorkerTask

_tasks: dict[str, DBWorkerTask] = {}


def register(task: DBWorkerTask) -> None:
    _tasks.setdefault(task.module_path, task)


def known() -> dict[str, DBWorkerTask]:
    return dict(_tasks)


def resolve(path: str) -> Task:
    """The task named ``path``; UnknownTask saying why if it is not one we may run."""
    task = _tasks.get(path)
    if task is not None:
        return task
    module_name, _, attribute = path.rpartition(".")
    if not module_name or apps.get_containing_app_config(module_name) is None:
        raise UnknownTask(
            f"{path!r} is not a task of an installed app; only django.tasks tasks defined in "
            "INSTALLED_APPS modules run."
        )
    try:
        module = import_module(module_name)
    except ImportError as exc:
        raise UnknownTask(f"{path!r} cannot be imported: {exc}") from exc
    task = getattr(module, attribute, None)
    if not isinstance(task, Task):
        raise UnknownTask(
            f"{path!r} is not a django.tasks task (decorate the function with @task)."
        )
    return task
