"""The ``django.tasks`` backend: ``DBWorkerBackend``, Django's adapter to our task store.
``DBWorkerTask`` (what ``@task`` makes for it) lives in ``tasks.task`` and is re-exported
here, its public path."""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any, cast

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.inspect import get_func_args

from . import conf
from .db import refuse_unusable
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
    task_enqueued,
)
from .exceptions import InvalidTaskArguments
from .tasks.task import (
    DBWorkerTask,
    unique_wanted,
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
        where = f"Task {getattr(task.func, '__qualname__', task.func)!r}"
        if not is_module_level_function(task.func):
            raise InvalidTask(f"{where}: task functions must be defined at module level.")
        # The backend's supports_* flags, which Django's own validate_task enforces: a
        # subclass that turns one off gets the refusal too.
        if not self.supports_async_task and iscoroutinefunction(task.func):
            raise InvalidTask(f"{where} is a coroutine function, and task backend "
                              f"{self.alias!r} does not support async tasks "
                              "(supports_async_task is False).")
        if not self.supports_priority and task.priority != DEFAULT_TASK_PRIORITY:
            raise InvalidTask(f"{where}: priority={task.priority!r} was given, and task "
                              f"backend {self.alias!r} does not support priorities "
                              "(supports_priority is False).")
        if not self.supports_defer and task.run_after is not None:
            raise InvalidTask(f"{where}: run_after was given, and task backend "
                              f"{self.alias!r} does not support run_after "
                              "(supports_defer is False).")
        args = get_func_args(task.func)
        if task.takes_context and (not args or args[0] != "context"):
            raise InvalidTask(f"{where} takes context but its first argument is not 'context'.")
        priority = task.priority
        if (isinstance(priority, bool) or not isinstance(priority, int)
                or not TASK_MIN_PRIORITY <= priority <= TASK_MAX_PRIORITY):
            raise InvalidTask(
                f"{where}: priority={priority!r} must be a whole number between "
                f"{TASK_MIN_PRIORITY} and {TASK_MAX_PRIORITY}."
            )
        run_after = task.run_after
        if run_after is not None and not isinstance(run_after, datetime | timedelta):
            raise InvalidTask(f"{where}: run_after must be a datetime or a timedelta.")
        if (isinstance(run_after, datetime) and settings.USE_TZ
                and not timezone.is_aware(run_after)):
            raise InvalidTask(
                f"{where}: run_after={run_after!r} is naive; give an aware datetime "
                "(django.utils.timezone.now() + ...) or a timedelta."
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
        if self.queues_configured:
            return (f"{where}: queue {queue!r} is not configured for task backend "
                    f"{self.alias!r}; {setting} is {known}. Add {queue!r} to "
                    f"{setting} in your settings, or use one of those queues.")
        return (f"{where}: queue {queue!r} is not configured for task backend {self.alias!r}, "
                f"which has no QUEUES setting and so takes only {known}. Add "
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
        """``enqueue_many`` without the immediate mode's run: what stores the calls."""
        from .tasks import newtasks
        from .tasks import store as taskstore
        from .tasks.results import new_results

        self.validate_task(task)
        calls = list(calls)
        if getattr(task, "after", ()):  # workflows: only dependents take this path
            from .workflows import dependencies

            return dependencies.enqueue(self, cast(DBWorkerTask, task), calls)
        key = getattr(task, "idempotency_key", None)
        if key is not None and len(calls) != 1:
            raise InvalidTask(
                f"Task {task.name!r}: idempotency_key={key!r} was given for {len(calls)} "
                "calls; a key identifies one call."
            )
        if unique_wanted(task):  # flow control: only keyed calls take this path
            from .tasks import uniqueness

            return uniqueness.enqueue(self, cast(DBWorkerTask, task), calls)
        if not calls:
            return []
        shared = newtasks.Shared.of(task)
        ids = newtasks.ids(shared, len(calls))
        using = conf.get().DATABASE
        refuse_unusable(using)
        on_commit = getattr(task, "enqueue_on_commit", None)
        if on_commit is None:
            on_commit = self.enqueue_on_commit
        if getattr(task, "concurrency_limit", None) is not None:
            return self._enqueue_keyed(cast(DBWorkerTask, task), shared, ids, calls,
                                       key, on_commit)
        if key is None and not on_commit and len(calls) <= newtasks.BATCH:
            rows = _rows(task, shared, ids, calls, 0)
            taskstore.insert_one_batch(rows, _encode(task, rows, 0))  # one round trip
            made = new_results(rows, self.alias, task)
            send_enqueued(type(self), made)
            return made
        if key is None and not on_commit:
            # Batch by batch: on PostgreSQL the server stores a batch while the next is
            # built (taskstore.insert_batches), and its results are made meanwhile.
            results: list[DBWorkerTaskResult] = []

            def batches() -> Iterator[tuple[list[newtasks.NewTask], str]]:
                for start in range(0, len(calls), newtasks.BATCH):
                    end = start + newtasks.BATCH
                    rows = _rows(task, shared, ids[start:end], calls[start:end], start)
                    yield rows, _encode(task, rows, start)
                    results.extend(new_results(rows, self.alias, task))

            taskstore.insert_batches(batches())
            send_enqueued(type(self), results)
            return results
        rows = _rows(task, shared, ids, calls, 0)
        payload = _encode(task, rows, 0)
        if on_commit:
            def insert() -> None:
                stored = taskstore.insert(rows, idempotency_key=key, payload=payload)
                if key is None or _inserted(stored[0], rows[0]):
                    send_enqueued(type(self), [self.result(row, task) for row in stored])

            transaction.on_commit(insert, using=using)
            return new_results(rows, self.alias, task)
        stored = taskstore.insert(rows, idempotency_key=key, payload=payload)
        results = [self.result(row, task) for row in stored]  # the row holding the key:
        if _inserted(stored[0], rows[0]):                     # ours, or an earlier one's
            send_enqueued(type(self), results)
        return results

    def _enqueue_keyed(self, task: DBWorkerTask, shared: Any, ids: list[str],
                       calls: list[Any], key: str | None,
                       on_commit: bool) -> list[DBWorkerTaskResult]:
        """``enqueue_many`` of a task with a concurrency limit: each row with its
        concurrency key, stored in call order (a statement per batch: the key is a per-row
        value of the insert), the keys' slots made first (``tasks.concurrency``)."""
        from .tasks import concurrency, newtasks
        from .tasks import store as taskstore
        from .tasks.results import new_results

        rows = _rows(task, shared, ids, calls, 0)
        _encode(task, rows, 0)  # refuses, naming the call, what is not JSON or too large
        keys = concurrency.keys_of(task, [(r.args, r.kwargs) for r in rows])
        limit = task.concurrency_limit
        groups: dict[str, list[newtasks.NewTask]] = {}
        for row, k in zip(rows, keys, strict=True):
            if k not in groups:
                groups[k] = []
                group_shared = replace(shared, concurrency_key=k, concurrency_limit=limit)
            else:
                group_shared = groups[k][0].shared
            row.shared = group_shared
            groups[k].append(row)
        using = conf.get().DATABASE

        def store() -> list[Any]:
            concurrency.ensure_slots(groups, using)
            if key is not None:
                return taskstore.insert(rows, idempotency_key=key)
            taskstore.insert_batches(
                (rows[start:start + newtasks.BATCH], None)
                for start in range(0, len(rows), newtasks.BATCH))
            return list(rows)

        if on_commit:
            def insert() -> None:
                stored = store()
                if key is None or _inserted(stored[0], rows[0]):
                    send_enqueued(type(self), [self.result(row, task) for row in stored])

            transaction.on_commit(insert, using=using)
            return new_results(rows, self.alias, task)
        stored = store()
        if key is None:
            results = new_results(rows, self.alias, task)
            send_enqueued(type(self), results)
            return results
        results = [self.result(row, task) for row in stored]  # the row holding the key
        if _inserted(stored[0], rows[0]):
            send_enqueued(type(self), results)
        return results

    # ----- results --------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        """The task's result as stored now; ``TaskResultDoesNotExist`` for an unknown id
        (or one pruned after ``RETENTION``)."""
        from .tasks import store as taskstore

        row = taskstore.get(result_id)
        if row is None:
            raise TaskResultDoesNotExist(result_id)
        return self.result(row)

    def result(self, row: Any, task: Task | None = None) -> DBWorkerTaskResult:
        from .tasks.results import to_result

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


def _inserted(stored: Any, new: Any) -> bool:
    """Whether the row holding an idempotency key is the one this call enqueued. Its id
    cannot tell (it is made from the key); the time of the enqueue call it came from can."""
    return str(stored.pk) == new.pk and stored.enqueued_at == new.enqueued_at


def send_enqueued(sender: type, results: Sequence[TaskResult]) -> None:
    """``task_enqueued.send(sender, task_result=result)`` for each result, in order, with
    the receivers looked up once for all of them.

    ``Signal.send`` looks its receivers up again for every result (a lock, the weak
    references, two lists); for 10,000 results that is most of the signal's cost. Here each
    call still gets every receiver ``send`` would call, with the same arguments, and an
    exception still stops everything at once, but the receivers are only resolved again
    (by ``send`` itself) when they changed: one was connected, disconnected or died since
    the first result. Async receivers: ``send`` for every result, as it runs them.
    """
    signal = task_enqueued
    signal.has_listeners(sender)  # clears out receivers that died, as send() would
    connected = list(signal.receivers)
    receivers = _sync_receivers(signal, sender, connected)
    for i, result in enumerate(results):
        if (receivers is None or signal.receivers != connected
                # Signal._dead_receivers: Django's, not declared by django-stubs.
                or signal._dead_receivers):  # type: ignore[attr-defined]
            for rest in results[i:]:
                signal.send(sender, task_result=rest)
            return
        # Resolved per result, as send() does: a receiver that died stops being called.
        for receiver in [ref() if weak else ref for ref, weak in receivers]:
            receiver(signal=signal, sender=sender, task_result=result)


def _sync_receivers(signal: Any, sender: type,
                    connected: list[Any]) -> list[tuple[Any, bool]] | None:
    """The receivers ``signal.send(sender)`` calls, as ``(receiver or weak reference,
    is weak)``, or None if one is async or the signal's bookkeeping is not as expected
    (``Signal._live_receivers``, Django 5.0+): then ``send`` does it all."""
    # _make_id: Django's, not declared by django-stubs.
    from django.dispatch.dispatcher import NONE_ID, _make_id  # type: ignore[attr-defined]

    found = []
    try:
        for (_, sender_key), receiver, sender_ref, is_async in connected:
            if sender_key != NONE_ID and sender_key != _make_id(sender):
                continue
            if is_async or (sender_ref is not None and sender_ref() is None):
                return None
            weak = isinstance(receiver, weakref.ReferenceType)
            if weak and receiver() is None:
                return None
            found.append((receiver, weak))
    except (TypeError, ValueError):
        return None
    return found


def _plain_call(task: Task, index: int, call: Any) -> tuple[list[Any], dict[str, Any]]:
    """The call's arguments JSON-ready (``normalize_json``), or an error naming the call."""
    from .tasks.newtasks import plain

    try:
        args, kwargs = call
    except (TypeError, ValueError):
        raise InvalidTaskArguments(
            f"Task {task.name!r}: call {index} is {call!r}; give (args, kwargs) pairs."
        ) from None
    try:
        return (plain(args if type(args) in (list, tuple) else list(args)),
                plain(kwargs if type(kwargs) is dict else dict(kwargs)))
    except (TypeError, ValueError) as exc:
        raise _not_json(task, index, exc) from None


def _rows(task: Task, shared: Any, ids: list[str], calls: list[Any],
          offset: int) -> list[Any]:
    """``tasks.newtasks.build`` of the calls, or the error naming the first bad one (its index in
    the whole enqueue call: ``calls`` start at ``offset``)."""
    from .tasks import newtasks

    try:
        return newtasks.build(shared, ids, calls)
    except (TypeError, ValueError):
        for i, call in enumerate(calls):
            _plain_call(task, offset + i, call)  # raises, naming the call
        raise


def _encode(task: Task, rows: list[Any], offset: int) -> str:
    """The rows as one JSON text (``tasks.newtasks.encode``), or the error naming the bad call
    (``rows`` are the calls from ``offset`` on)."""
    from .tasks import newtasks

    try:
        payload = newtasks.encode(rows)
    except (TypeError, ValueError):
        index, exc = newtasks.first_bad(rows) or (0, ValueError("not JSON"))
        raise _not_json(task, offset + index, exc) from None
    limit = conf.get().ARGUMENTS_MAX_BYTES
    poison = newtasks.first_poison(rows, payload, limit)
    if poison is None:
        return payload
    index, kind, size = poison
    if kind == "nul":
        raise InvalidTaskArguments(
            f"Task {task.name!r}: the arguments of call {offset + index} contain a NUL "
            "character (U+0000), which PostgreSQL cannot store in text or JSON; remove it "
            "(e.g. value.replace('\\x00', '')). Nothing was enqueued."
        )
    raise InvalidTaskArguments(
        f"Task {task.name!r}: the arguments of call {offset + index} are {size} bytes of "
        f"JSON, more than DBWORKER['ARGUMENTS_MAX_BYTES'] ({limit}); pass ids and look "
        "large values up in the task, or raise the setting. Nothing was enqueued."
    )


def _not_json(task: Task, index: int, exc: Exception) -> InvalidTaskArguments:
    return InvalidTaskArguments(
        f"Task {task.name!r}: the arguments of call {index} cannot be stored as JSON "
        f"({exc}); pass ids and plain values instead of objects."
    )


