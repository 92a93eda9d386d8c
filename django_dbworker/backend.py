"""The ``django.tasks`` backend: ``DBWorkerBackend``, Django's adapter to our task store.
``DBWorkerTask`` (what ``@task`` makes for it) lives in ``tasks.task`` and is re-exported
here, its public path."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.inspect import get_func_args

from . import conf
from .djtasks import (
    DEFAULT_TASK_PRIORITY,
    TASK_MAX_PRIORITY,
    TASK_MIN_PRIORITY,
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    is_module_level_function,
)
from .tasks import enqueue
from .tasks import store as taskstore
from .tasks.newtasks import send_enqueued
from .tasks.results import to_result
from .tasks.task import (
    DBWorkerTask,
    validate_options,
)

if TYPE_CHECKING:
    from .tasks.results import DBWorkerTaskResult

__all__ = ["DBWorkerBackend", "DBWorkerTask", "send_enqueued"]

#: TaskRecord.queue_name's max_length.
MAX_QUEUE_NAME_LENGTH = 100
#: Options of ``TASKS[alias]["OPTIONS"]`` a DBWorkerBackend knows, and their types.
BACKEND_OPTIONS = {"ENQUEUE_ON_COMMIT": bool, "IMMEDIATE": bool}

class DBWorkerBackend(BaseTaskBackend):
    """Tasks stored in our database and run by ``manage.py runworkers``.

    ``OPTIONS``: ``ENQUEUE_ON_COMMIT`` (bool, default False) defers every enqueue of this
    backend to the commit of the caller's transaction. ``IMMEDIATE`` (bool, default
    False): each enqueue also runs its tasks in the caller before it returns, with our
    semantics (``tasks.immediate``; for tests and development, docs/testing.md).
    """

    #: ``@task`` makes a ``DBWorkerTask`` for this backend, with its options.
    task_class = DBWorkerTask
    #: A ``DBWorkerTask`` of this backend is stored and its options checked here
    #: (``validate_task``); any other backend ignores them (``tasks.task``).
    stores_dbworker_tasks = True
    #: run_after is kept in the row; the task is not claimed before it (available_at).
    supports_defer = True
    #: Coroutine functions run to completion in the child process (Task.call, async_to_sync).
    supports_async_task = True
    #: get_result() reads the task's row from any thread or process, until it is pruned.
    supports_get_result = True
    #: Claims take the highest priority first, then the longest available (claim index).
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: What is wrong with OPTIONS, if anything: backends are made lazily (at the first
        #: task of the alias, or by the system checks), so the error is raised by every
        #: validate_task() and reported by check() as django_dbworker.E011.
        self.options_error = _options_error(alias, self.options)
        value = self.options.get("ENQUEUE_ON_COMMIT", False) if isinstance(
            self.options, dict) else False
        self.enqueue_on_commit = value is True
        #: OPTIONS["IMMEDIATE"]: every enqueue runs its tasks in the caller too.
        self.immediate = isinstance(self.options, dict) and self.options.get(
            "IMMEDIATE", False) is True
        #: Whether TASKS[alias] sets QUEUES (otherwise Django allows only "default").
        self.queues_configured = "QUEUES" in params

    # ----- validation -----------------------------------------------------------------

    def validate_task(self, task: Task) -> None:
        """Raise ``InvalidTask`` (``ImproperlyConfigured`` for a bad ``OPTIONS``) saying what
        is wrong with the task or its options; ``@task`` and ``.using()`` call it."""
        if self.options_error:
            raise ImproperlyConfigured(self.options_error)
        # Each refusal starts with Django's own sentence (BaseTaskBackend.validate_task),
        # which users' tests and tools match on, then says which task and what to do.
        where = f"Task {getattr(task.func, '__qualname__', task.func)!r}"
        if not is_module_level_function(task.func):
            raise InvalidTask(f"Task function must be defined at a module level. {where} is "
                              "not: decorate a function defined at the top of a module (not "
                              "a method, a nested function, a lambda or a builtin).")
        # The backend's supports_* flags, which Django's own validate_task enforces: a
        # subclass that turns one off gets the refusal too.
        if not self.supports_async_task and iscoroutinefunction(task.func):
            raise InvalidTask(f"Backend does not support async Tasks. {where} is a coroutine "
                              f"function, and task backend {self.alias!r} does not support "
                              "async tasks (supports_async_task is False).")
        if not self.supports_priority and task.priority != DEFAULT_TASK_PRIORITY:
            raise InvalidTask(f"Backend does not support setting priority of tasks. {where}: "
                              f"priority={task.priority!r} was given, and task backend "
                              f"{self.alias!r} does not support priorities "
                              "(supports_priority is False).")
        if not self.supports_defer and task.run_after is not None:
            raise InvalidTask(f"Backend does not support run_after. {where}: run_after was "
                              f"given, and task backend {self.alias!r} does not support "
                              "run_after (supports_defer is False).")
        args = get_func_args(task.func)
        if task.takes_context and (not args or args[0] != "context"):
            raise InvalidTask("Task takes context but does not have a first argument of "
                              f"'context'. {where} takes context: name its first argument "
                              "context (def f(context, ...)).")
        priority = task.priority
        if (isinstance(priority, bool) or not isinstance(priority, int)
                or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY):
            raise InvalidTask(
                f"priority must be a whole number between {TASK_MIN_PRIORITY} and "
                f"{TASK_MAX_PRIORITY}. {where}: priority={priority!r} was given."
            )
        run_after = task.run_after
        if run_after is not None and not isinstance(run_after, datetime | timedelta):
            raise InvalidTask(f"{where}: run_after must be a datetime or a timedelta.")
        if (isinstance(run_after, datetime) and settings.USE_TZ
                and not timezone.is_aware(run_after)):
            raise InvalidTask(
                f"run_after must be an aware datetime. {where}: run_after={run_after!r} is "
                "naive; give an aware datetime (django.utils.timezone.now() + ...) or a "
                "timedelta."
            )
        if isinstance(run_after, timedelta) and not (
                timedelta(0) <= run_after <= timedelta(seconds=conf.MAX_DELAY)):
            raise InvalidTask(
                f"{where}: run_after={run_after!r} must be a timedelta from 0 to ten years "
                "(or an aware datetime)."
            )
        queue = task.queue_name
        if not isinstance(queue, str) or not 0 < len(queue) <= MAX_QUEUE_NAME_LENGTH:
            raise InvalidTask(
                f"{where}: queue_name={queue!r} must be a non-empty string of at most "
                f"{MAX_QUEUE_NAME_LENGTH} characters."
            )
        if self.queues and task.queue_name not in self.queues:
            raise InvalidTask(self._unknown_queue(where, task.queue_name))
        if isinstance(task, DBWorkerTask):
            validate_options(where, task)

    def _unknown_queue(self, where: str, queue: str) -> str:
        """What to do about a queue this backend does not know: add it to its QUEUES."""
        setting = f"TASKS[{self.alias!r}]['QUEUES']"
        known = sorted(self.queues)
        django_says = f"Queue '{queue}' is not valid for backend."  # Django's own sentence
        if self.queues_configured:
            return (f"{django_says} {where}: queue {queue!r} is not configured for task "
                    f"backend {self.alias!r}; {setting} is {known}. Add {queue!r} to "
                    f"{setting} in your settings, or use one of those queues.")
        return (f"{django_says} {where}: queue {queue!r} is not configured for task backend "
                f"{self.alias!r}, which has no QUEUES setting and so takes only {known}. Add "
                f"\"QUEUES\": {[*known, queue]!r} to TASKS[{self.alias!r}] in your settings.")

    # ----- enqueue --------------------------------------------------------------------

    def enqueue(self, task: Task, args: Sequence[Any], kwargs: dict[str, Any]) -> TaskResult:
        """Store one call of the task (what ``task.enqueue(...)`` calls)."""
        return self.enqueue_many(task, [(args, kwargs)])[0]

    def enqueue_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[DBWorkerTaskResult]:
        """Store one call per ``(args, kwargs)`` in one transaction; results in call order
        (``task.enqueue_many(...)`` calls it). A bad call raises, naming it, and stores
        nothing. In immediate mode the tasks then run in the caller, and the results are
        as they ended (``OPTIONS["IMMEDIATE"]``)."""
        results = self.store_many(task, calls)
        if not self.immediate or not results:
            return results
        from .tasks import immediate

        ids = [r.id for r in results]
        on_commit = getattr(task, "enqueue_on_commit", None)
        if on_commit is None:
            on_commit = self.enqueue_on_commit
        if on_commit:  # stored by the callback registered before this one: run after it
            transaction.on_commit(lambda: immediate.run(ids), using=conf.get().DATABASE)
            return results
        immediate.run(ids)
        for result in results:
            result.refresh()
        return results

    def store_many(
        self, task: Task, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]]
    ) -> list[DBWorkerTaskResult]:
        """``enqueue_many`` without the immediate mode's run: what stores the calls
        (``tasks.enqueue.store_many``)."""
        return enqueue.store_many(self, task, calls)

    # ----- results --------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id
        (or one pruned after ``RETENTION``)."""
        row = taskstore.get(result_id)
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result(row)

    def result(self, row: Any, task: Task | None = None) -> DBWorkerTaskResult:
        """The result of a stored row (``tasks.results.to_result``)."""
        return to_result(row, self.alias, task)

    def check(self, **kwargs: Any) -> list[CheckMessage]:
        errors: list[CheckMessage] = []
        if not apps.is_installed("django_dbworker"):
            errors.append(Error(
                f"Task backend {self.alias!r} is DBWorkerBackend, but 'django_dbworker' is not "
                "in INSTALLED_APPS.",
                hint="Add 'django_dbworker' to INSTALLED_APPS and run migrate.",
                id="django_dbworker.E010",
            ))
        if self.options_error:
            errors.append(Error(
                self.options_error,
                hint=f"Known OPTIONS: {', '.join(sorted(BACKEND_OPTIONS))}.",
                id="django_dbworker.E011",
            ))
        return errors


def _options_error(alias: str, options: Any) -> str | None:
    """What is wrong with ``TASKS[alias]["OPTIONS"]``, or None."""
    where = f"TASKS[{alias!r}]['OPTIONS']"
    if not isinstance(options, dict):
        return f"{where} is {type(options).__name__}; it must be a dict."
    unknown = sorted(set(options) - set(BACKEND_OPTIONS), key=str)
    if unknown:
        return (f"{where} has unknown keys {', '.join(map(repr, unknown))}; DBWorkerBackend "
                f"knows {', '.join(sorted(BACKEND_OPTIONS))}.")
    for key, kind in BACKEND_OPTIONS.items():
        if key in options and not isinstance(options[key], kind):
            return f"{where}[{key!r}] is {options[key]!r}; it must be True or False."
    return None
