"""``DBWorkerTask``: a Django task with our options, what ``@task`` makes for a
``DBWorkerBackend``, and the checks of those options (no database).

``django_dbworker.backend`` re-exports ``DBWorkerTask``, its public path."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, cast

from ..djtasks import InvalidTask, Task, TaskResult
from . import registry as task_registry
from . import retry
from .edges import edges_of
from .options import check_concurrency, validate_uniqueness
from .rates import parse_rate

if TYPE_CHECKING:
    from ..workflows.builder import Step
    from .results import DBWorkerTaskResult

MAX_BACKOFF_FACTOR = retry.MAX_BACKOFF_FACTOR
MAX_RETRIES = retry.MAX_RETRIES
#: Most ``max_snoozes`` (``TaskRecord.snoozes`` is a database integer).
MAX_SNOOZES = 1_000_000_000

type Callback = Callable[..., Any] | str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class DBWorkerTask(Task):
    """A Django task with our options, set through ``@task(...)`` keyword arguments."""

    #: Attempts after the first one when it raises one of ``retry_for``.
    retries: int = 0
    #: Seconds before the first retry.
    retry_delay: float | timedelta = 1.0
    #: Multiply the delay by ``retry_backoff_factor`` after each failed attempt.
    retry_backoff: bool = False
    #: The factor of ``retry_backoff`` (at most 1000).
    retry_backoff_factor: float = 2.0
    #: Seconds (or a timedelta): a retry delay never exceeds this.
    retry_max_delay: float | timedelta = 3600.0
    #: True: wait a random part of the delay (full jitter); a float: at most that fraction less.
    retry_jitter: bool | float = False
    #: Exception classes that are retried (subclasses too); others fail at once.
    retry_for: tuple[type[BaseException], ...] = (Exception,)
    #: Seconds an attempt may run before its process is stopped.
    timeout: float | timedelta | None = None
    #: Start rate across all supervisors, e.g. ``"10/s"``.
    rate_limit: str | None = None
    #: A callable or its dotted path, called as ``on_success(result, return_value)`` after
    #: the task succeeded; if it raises, that is logged and the status stays.
    on_success: Callback = None
    #: Called as ``on_failure(result, exception)`` after the task failed for good (not after
    #: an attempt that is retried); ``exception`` is None when the supervisor stopped it
    #: (timeout, cancellation).
    on_failure: Callback = None
    #: Set per call: ``.using(idempotency_key="...")``.
    idempotency_key: str | None = None
    #: Enqueue when the caller's transaction commits instead of inside it.
    enqueue_on_commit: bool | None = None
    # ----- flow control (docs/tasks.md, "Flow control") -----
    #: Uniqueness: a key (or a function of the call's arguments returning one); an enqueue
    #: whose key is held returns the task holding it.
    unique_key: str | Callable[..., str] | None = None
    #: What holds the key: "active" (READY, RETRYING or RUNNING) or "waiting" (not RUNNING).
    unique_while: str = "active"
    #: At most one per key per period (a duration) instead, whatever its status.
    unique_for: float | timedelta | None = None
    #: "keep" the holder as it is, or "replace" its arguments and run_after (debounce).
    on_duplicate: str = "keep"
    #: At most this many tasks with the same concurrency key RUNNING at once, everywhere.
    concurrency_limit: int | None = None
    #: The concurrency key (or a function of the call's arguments); default: the task.
    concurrency_key: str | Callable[..., str] | None = None
    #: Times a task may ``raise Snooze(...)`` before a snooze counts as a failed attempt.
    max_snoozes: int = 100
    #: Run the task in a transaction on our database that commits with its SUCCESSFUL
    #: record, fenced by its claim: its database writes happen exactly once, whatever
    #: crashes (docs/tasks.md, "Transactional tasks"). Not batched with other completions.
    transactional: bool = False
    # ----- workflows (docs/workflows.md) -----
    #: Set per call: ``.using(after=[...])``: run only after these tasks (their results or
    #: ids) or rows (``after_row(...)``) ended SUCCESSFUL (FINISHED, for a row).
    after: tuple[Any, ...] = ()
    #: Run once every dependency ended, whatever its status (default: a dependency that
    #: ends FAILED or CANCELLED cancels this task, ``DependencyFailed``).
    run_on_failure: bool = False
    _schedule: str = field(default="", repr=False)
    #: Set by ``workflows.dependencies``: dependencies not met yet (WAITING when > 0).
    _waiting_for: int = field(default=0, repr=False)
    #: The workflow (or ``enqueue_many`` batch) the calls are stored in: set by
    #: ``django_dbworker.workflows`` only, in the transaction that stores the ``Workflow``.
    _workflow_id: uuid.UUID | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        Task.__post_init__(self)  # the backend's validate_task
        if not getattr(self.get_backend(), "stores_dbworker_tasks", False):
            # Another backend (Django's ImmediateBackend or DummyBackend in a user's test
            # settings, djtasks.task_class) ignores our options: they are checked all the
            # same, so a mistake shows before the settings point at our backend.
            validate_options(f"Task {getattr(self.func, '__qualname__', self.func)!r}", self)
        task_registry.register(self)

    def using(
        self,
        *,
        priority: int | None = None,
        queue_name: str | None = None,
        run_after: datetime | timedelta | None = None,
        backend: str | None = None,
        idempotency_key: str | None = None,
        enqueue_on_commit: bool | None = None,
        unique_key: str | Callable[..., str] | None = None,
        concurrency_key: str | None = None,
        after: Iterable[Any] | None = None,
        run_on_failure: bool | None = None,
    ) -> DBWorkerTask:
        """A copy of the task with these options changed (those given, not None), for one
        enqueue: ``send.using(run_after=timedelta(minutes=5)).enqueue(42)``. ``run_after``
        may be an aware datetime or a timedelta from now."""
        # As Task.using does, with our options, in one replace(); run_after may also be a
        # timedelta here (validate_task), which Task's own annotation does not allow.
        given: dict[str, Any] = {
            "priority": priority, "queue_name": queue_name, "run_after": run_after,
            "backend": backend, "idempotency_key": idempotency_key,
            "enqueue_on_commit": enqueue_on_commit, "unique_key": unique_key,
            "concurrency_key": concurrency_key, "run_on_failure": run_on_failure,
            "after": after_tuple(after),
        }
        return replace(self, **{name: v for name, v in given.items() if v is not None})

    def enqueue_many(
        self, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]], *,
        workflow: str | bool = False,
    ) -> list[DBWorkerTaskResult]:
        """Enqueue one call per ``(args, kwargs)`` in one transaction; results in order.

        ``workflow``: True, or a name, stores the calls as one batch (a ``Workflow``, the
        id on each result's ``workflow_id``: ``django_dbworker.workflows.get(id)`` for its
        progress, ``cancel()``, the admin and ``dbworker workflow ID``)."""
        if workflow is not False:
            from ..workflows.builder import enqueue_batch  # a facade: the workflows API

            return enqueue_batch(self, calls, workflow)
        backend = self.get_backend()
        if not getattr(backend, "stores_dbworker_tasks", False):
            # Another backend (ImmediateBackend, DummyBackend: djtasks.task_class) has no
            # enqueue_many: one enqueue per call, in order.
            return [cast("DBWorkerTaskResult", backend.enqueue(self, list(args), dict(kwargs)))
                    for args, kwargs in calls]
        # A DBWorkerBackend (stores_dbworker_tasks): its enqueue_many, one transaction.
        return cast("list[DBWorkerTaskResult]", cast(Any, backend).enqueue_many(self, calls))

    def step(self, *args: Any, **kwargs: Any) -> Step:
        """This call as a step of a workflow (``chain``, ``group``), with this task's
        options (``.using(...)`` before ``.step()``); nothing is enqueued yet."""
        from ..workflows.builder import Step  # a facade: the workflows API

        return Step(self, args, kwargs)

    @property
    def timeout_seconds(self) -> float | None:
        """``timeout`` in seconds (None: no timeout)."""
        t = self.timeout
        return t.total_seconds() if isinstance(t, timedelta) else t


def after_tuple(after: Any) -> Any:
    """``after`` as a tuple (a frozen task holds no list); what is not a collection of
    items stays as it is, for ``edges.edges_of`` to refuse by name."""
    if after is None or isinstance(after, str | bytes | TaskResult):
        return after
    return tuple(after) if isinstance(after, Iterable) else after


def unique_wanted(task: Any) -> bool:
    """Whether a uniqueness option is set: the enqueue takes the keyed path
    (``tasks.uniqueness``)."""
    return (getattr(task, "unique_key", None) is not None
            or getattr(task, "unique_for", None) is not None
            or getattr(task, "unique_while", "active") != "active"
            or getattr(task, "on_duplicate", "keep") != "keep")


def validate_options(where: str, task: DBWorkerTask) -> None:
    retry_for = retry.check(where, task, InvalidTask)
    if retry_for != task.retry_for:
        object.__setattr__(task, "retry_for", retry_for)
    retry.check_seconds(where, "timeout", task.timeout, InvalidTask, optional=True)
    if task.timeout_seconds == 0:
        raise InvalidTask(f"{where}: timeout=0 would stop every attempt; give more seconds.")
    if task.rate_limit is not None:
        try:
            parse_rate(task.rate_limit)
        except ValueError as exc:
            raise InvalidTask(f"{where}: rate_limit: {exc}") from None
    for name in ("on_success", "on_failure"):
        callback = getattr(task, name)
        if callback is not None and not (callable(callback) or isinstance(callback, str)):
            raise InvalidTask(f"{where}: {name}={callback!r} must be a callable or a dotted "
                              "path to one.")
    if not isinstance(task.transactional, bool):
        raise InvalidTask(f"{where}: transactional={task.transactional!r} must be True or "
                          "False.")
    if task.enqueue_on_commit is not None and not isinstance(task.enqueue_on_commit, bool):
        raise InvalidTask(f"{where}: enqueue_on_commit={task.enqueue_on_commit!r} must be "
                          "True, False or None.")
    key = task.idempotency_key
    if key is not None and (not isinstance(key, str) or not key or len(key) > 255):
        raise InvalidTask(f"{where}: idempotency_key={key!r} must be a non-empty string of at "
                          "most 255 characters.")
    # ----- uniqueness (flow control) -----
    if unique_wanted(task):
        validate_uniqueness(where, task)

    # ----- concurrency (flow control) -----
    check_concurrency(where, task.concurrency_limit, task.concurrency_key)

    # ----- workflows -----
    if not isinstance(task.run_on_failure, bool):
        raise InvalidTask(f"{where}: run_on_failure={task.run_on_failure!r} must be True or "
                          "False.")
    if task.after:
        edges_of(where, task.after)

    # ----- snooze (flow control) -----
    snoozes = task.max_snoozes
    if isinstance(snoozes, bool) or not isinstance(snoozes, int) \
            or not 0 <= snoozes <= MAX_SNOOZES:
        raise InvalidTask(f"{where}: max_snoozes={snoozes!r} must be an integer from 0 (a "
                          f"snooze always counts as a failed attempt) to {MAX_SNOOZES}.")
