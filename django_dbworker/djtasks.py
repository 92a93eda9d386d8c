"""Django's Tasks framework for every supported Django: ``django.tasks`` on Django 6.0 and
later, the ``django-tasks`` backport (module ``django_tasks``) on Django 5.2.

Every module of django-dbworker imports the framework's names from here, flat
(``from ..djtasks import InvalidTask, Task``), never from ``django.tasks`` or
``django_tasks`` itself; so do ``normalize_json`` and ``is_module_level_function``, which
Django 6.0 added beside the framework. The names are Django 6's: the backport's
``InvalidTaskError`` and ``InvalidTaskBackendError`` are ``InvalidTask`` and
``InvalidTaskBackend`` here (the same classes, so ``except`` works with either name).

What differs, and what is done about it (docs/compatibility.md):

- ``@task(...)`` passes options it does not know (``retries=5``, ``unique_key=...``) to the
  backend's Task class on Django 6.1 and in the backport, not on Django 6.0, whose
  ``task()`` has no ``**kwargs``. ``task`` here takes them everywhere (it is Django's own
  on 6.1 and the backport's on 5.2); ``django_dbworker.task`` is this one, and
  ``refuse_task_options`` turns Django 6.0's ``TypeError`` into an error naming it
  (``apps.DBWorkerConfig.ready``, where the ``tasks`` modules are imported).
- ``django.tasks`` imports its system checks and its signal receivers (the ``TASKS``
  setting-changed reset, the log lines) itself; the backport leaves that to its app's
  ``ready()``. They are imported here, so the ``django_tasks`` app need not be installed.
- The backport logs to the ``django_tasks`` logger, Django to ``django.tasks``:
  ``LOGGER_NAME``.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import django

__all__ = [
    "DEFAULT_TASK_BACKEND_ALIAS",
    "DEFAULT_TASK_PRIORITY",
    "DEFAULT_TASK_QUEUE_NAME",
    "FRAMEWORK",
    "LOGGER_NAME",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "TASK_REFRESH_ATTRS",
    "BaseTaskBackend",
    "InvalidTask",
    "InvalidTaskBackend",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultMismatch",
    "TaskResultStatus",
    "default_task_backend",
    "is_module_level_function",
    "normalize_json",
    "refuse_task_options",
    "task",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

#: The oldest Django we run on, and the oldest backport (its API is Django 6.0's).
MIN_DJANGO = (5, 2)
MIN_BACKPORT = (0, 12)
#: What a Django 5.2 project installs to get the backport with us.
INSTALL_BACKPORT = 'pip install "django-dbworker[django52]"'

if django.VERSION < MIN_DJANGO:  # pragma: no cover - refused by pip (Django>=5.2)
    raise ImportError(
        f"django-dbworker needs Django 5.2 or later; this is Django {django.get_version()}. "
        'Upgrade Django (pip install "Django>=5.2").'
    )

if TYPE_CHECKING or django.VERSION >= (6, 0):
    from django.tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        Task,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        default_task_backend,
        task_backends,
    )
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        TaskError,
    )
    from django.tasks.exceptions import (
        InvalidTask,
        InvalidTaskBackend,
        TaskResultDoesNotExist,
        TaskResultMismatch,
    )
    from django.tasks.signals import task_enqueued, task_finished, task_started
    from django.utils.inspect import is_module_level_function
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
    LOGGER_NAME = "django.tasks"
else:
    from importlib import metadata

    try:
        import django_tasks  # noqa: F401 - the backport, checked before the names are read
    except ImportError as exc:
        raise ImportError(
            f"django-dbworker on Django {django.get_version()} needs the django-tasks "
            "backport (Django's Tasks framework is built in from Django 6.0 on). Install it "
            f"with: {INSTALL_BACKPORT}, or upgrade to Django 6.0 or later."
        ) from exc
    _version = metadata.version("django-tasks")
    if tuple(int(n) for n in re.findall(r"\d+", _version)[:2]) < MIN_BACKPORT:
        raise ImportError(
            f"django-dbworker needs django-tasks 0.12 or later (Django 6.0's Tasks API); "
            f"this is django-tasks {_version}. Upgrade it: {INSTALL_BACKPORT}."
        )
    # Imported for what importing them does, as django.tasks does: the system checks
    # (backends' check()) and the receivers (TASKS setting-changed reset, log lines).
    from django_tasks import (
        DEFAULT_TASK_BACKEND_ALIAS,
        DEFAULT_TASK_QUEUE_NAME,
        TaskContext,
        TaskResult,
        TaskResultStatus,
        checks,  # noqa: F401
        default_task_backend,
        signals,  # noqa: F401
        task_backends,
    )
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.base import (
        DEFAULT_TASK_PRIORITY,
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        TASK_REFRESH_ATTRS,
        Task,
        TaskError,
    )
    from django_tasks.exceptions import InvalidTaskBackendError as InvalidTaskBackend
    from django_tasks.exceptions import InvalidTaskError as InvalidTask
    from django_tasks.exceptions import TaskResultDoesNotExist, TaskResultMismatch
    from django_tasks.signals import task_enqueued, task_finished, task_started
    from django_tasks.utils import is_module_level_function, normalize_json

    FRAMEWORK = "django_tasks"
    LOGGER_NAME = "django_tasks"

#: Whether the framework's ``task()`` passes unknown keyword arguments (our options) on to
#: the backend's Task class: not on Django 6.0 (6.1 added it; the backport has it).
TASK_TAKES_OPTIONS = not ((6, 0) <= django.VERSION < (6, 1))


def task(function: Any = None, *, priority: int = DEFAULT_TASK_PRIORITY,
         queue_name: str = DEFAULT_TASK_QUEUE_NAME, backend: str = DEFAULT_TASK_BACKEND_ALIAS,
         takes_context: bool = False, **options: Any) -> Any:
    """The framework's ``@task``, taking the backend's options (``retries=5``, ...) on every
    supported Django (Django 6.0's own ``task()`` takes none) and under every backend.

    The task is an instance of the backend's ``task_class``, as Django makes it. A backend
    whose ``task_class`` is Django's plain ``Task`` (``ImmediateBackend``,
    ``DummyBackend``: a user's test settings) takes no options, so when options are given
    the task is a ``DBWorkerTask`` instead: the module imports, ``.using()`` and
    ``.enqueue()`` work, and that backend ignores what it does not know (retries, flow
    control); the options are still validated (docs/testing.md)."""
    if "run_after" in options:  # as Django 6.1 says it
        raise TypeError(
            "run_after cannot be defined statically with the @task decorator. "
            "Use .using(run_after=...) to set it dynamically."
        )

    def wrapper(func: Any) -> Any:
        return task_class(backend, options)(
            func=func, priority=priority, queue_name=queue_name, backend=backend,
            takes_context=takes_context, run_after=None, **options)

    return wrapper(function) if function else wrapper


def task_class(alias: str, options: dict[str, Any]) -> Any:
    """The class ``@task(**options)`` makes for the backend ``alias``: its ``task_class``;
    ``DBWorkerTask`` if that is Django's plain ``Task`` and ``options`` are given."""
    cls = task_backends[alias].task_class
    if options and cls is Task:
        from .tasks.task import DBWorkerTask  # imported late: tasks.task imports this module

        return DBWorkerTask
    return cls


#: Django 6.0's message when ``@task(...)`` is given an option it does not take.
_NO_OPTIONS = re.compile(r"\btask\(\) got an unexpected keyword argument '(\w+)'")


def refuse_task_options(exc: TypeError) -> TypeError:
    """For Django 6.0: the ``TypeError`` of ``@django.tasks.task(retries=...)``, as one that
    names the module and the fix (``exc`` itself for any other ``TypeError``)."""
    found = _NO_OPTIONS.search(str(exc))
    if TASK_TAKES_OPTIONS or found is None:
        return exc
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next  # the innermost frame: the module whose @task call was refused
    where = tb.tb_frame.f_globals.get("__name__", "?") if tb is not None else "?"
    return TypeError(
        f"{where}: Django {django.get_version()}'s @task takes no backend options, so "
        f"{found.group(1)}=... cannot be given to it (Django 6.1 passes them on). Use "
        "django-dbworker's own decorator, which does on every Django: "
        "'from django_dbworker import task' instead of 'from django.tasks import task'."
    )
