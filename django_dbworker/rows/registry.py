"""The ``@worker`` decorator, the ``Worker`` it returns, and the registry of workers."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from datetime import timedelta
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models.query import QuerySet

from ..db.keys import pk_field
from ..exceptions import InvalidWorker, UnknownWorker
from ..tasks import retry
from ..tasks.options import MAX_LIMIT, bad_limit

if TYPE_CHECKING:
    from ..outcomes import Outcome

NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
MAX_NAME_LENGTH = 100

type Eligible = QuerySet[Any] | Callable[[], QuerySet[Any]]
type Handler = Callable[..., Outcome]


class Worker:
    """A registered handler over a source model. Calling it calls the handler."""

    def __init__(
        self,
        handler: Handler,
        *,
        name: str,
        source: type[models.Model],
        eligible: Eligible | None,
        concurrency: int,
        transactional: bool,
        concurrency_limit: int | None = None,
        concurrency_key: str | None = None,
        retries: int = 0,
        retry_delay: float | timedelta = 1.0,
        retry_backoff: bool = False,
        retry_backoff_factor: float = 2.0,
        retry_max_delay: float | timedelta = 3600.0,
        retry_jitter: bool | float = False,
        retry_for: tuple[type[BaseException], ...] = (Exception,),
        timeout: float | timedelta | None = None,
    ) -> None:
        #: The decorated function.
        self.handler = handler
        #: Seconds a handler may run before its process is stopped (``HandlerTimeout``).
        self.timeout = timeout
        #: The retry policy of a failing handler (``tasks.retry``): the unit is UNFINISHED
        #: until its next attempt, each attempt's failure kept; FAILED once none is left.
        self.retries = retries
        self.retry_delay = retry_delay
        self.retry_backoff = retry_backoff
        self.retry_backoff_factor = retry_backoff_factor
        self.retry_max_delay = retry_max_delay
        self.retry_jitter = retry_jitter
        #: The exception classes whose raise is retried (subclasses too).
        self.retry_for = retry_for
        #: The worker's name: it identifies the worker in the database, the CLI and the admin.
        self.name = name
        #: The model whose rows are the queue.
        self.source = source
        self._eligible = eligible
        #: At most this many units of this worker run at once per supervisor.
        self.concurrency = concurrency
        #: At most this many units of one key WORKING at once on every supervisor; the key
        #: is the source row's field ``concurrency_key`` (None: one key for the worker).
        self.concurrency_limit = concurrency_limit
        #: The name of the source row's field whose value is the key of ``concurrency_limit``.
        self.concurrency_key = concurrency_key
        #: Whether the handler runs inside the transaction that records its outcome.
        self.transactional = transactional
        #: Whether the handler takes a second argument, the ``Context``.
        self.takes_context = _count_parameters(name, handler) == 2
        self.__doc__ = handler.__doc__
        self.__wrapped__ = handler

    def __repr__(self) -> str:
        return f"<Worker {self.name} over {self.source._meta.label}>"

    @property
    def timeout_seconds(self) -> float | None:
        t = self.timeout
        return t.total_seconds() if isinstance(t, timedelta) else t

    def __call__(self, *args: Any, **kwargs: Any) -> Outcome:
        return self.handler(*args, **kwargs)

    def eligible_queryset(self) -> QuerySet[Any]:
        """A fresh queryset of the rows that may be claimed next, in claim order."""
        eligible = self._eligible
        if eligible is None:
            return self.source._default_manager.all()
        qs = eligible() if callable(eligible) and not isinstance(eligible, QuerySet) else eligible
        _check_queryset(self.name, self.source, qs)
        return qs.all()

    @property
    def static_eligible(self) -> bool:
        """Whether the SQL of ``eligible_queryset()`` is the same on every call: a QuerySet,
        or the plain default manager; not a callable, which may filter on the time."""
        eligible = self._eligible
        if eligible is None:
            manager = type(self.source._default_manager)
            return manager.get_queryset is models.Manager.get_queryset
        return isinstance(eligible, QuerySet)

    def state(self, pk: Any) -> dict[str, Any]:
        """Everything known of this worker's execution on the row with primary key ``pk``."""
        from .status import execution_state

        return execution_state(self, pk)

    def reset_failed(self, pk: Any) -> bool:
        """Put a FAILED execution back to UNFINISHED; True if one was reset."""
        from . import store

        return store.reset_failed(self, pk)


class Registry(Mapping[str, Worker]):
    """All registered workers by name; ``registry["x"]`` raises UnknownWorker naming ``x``."""

    def __init__(self) -> None:
        self._workers: dict[str, Worker] = {}

    def __getitem__(self, name: str) -> Worker:
        try:
            return self._workers[name]
        except KeyError:
            known = ", ".join(sorted(self._workers)) or "none"
            raise UnknownWorker(
                f"No worker named {name!r} is registered (registered workers: {known}). "
                "Declare it with @worker in a workers.py module of an installed app."
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._workers)

    def __len__(self) -> int:
        return len(self._workers)

    def add(self, worker: Worker) -> None:
        existing = self._workers.get(worker.name)
        if existing is not None and existing.handler is not worker.handler:
            raise InvalidWorker(
                f"Worker name {worker.name!r} is used twice: by "
                f"{_where(existing.handler)} and by {_where(worker.handler)}. "
                "Give one of them another name=."
            )
        self._workers[worker.name] = worker

    def remove(self, name: str) -> None:
        self._workers.pop(name, None)

    def for_model(self, model: type[models.Model]) -> list[Worker]:
        concrete = model._meta.concrete_model
        return [w for w in self._workers.values() if w.source._meta.concrete_model is concrete]


#: Every registered worker by name: ``workers["make_thumbnail"]`` is its ``Worker`` (an
#: unknown name raises ``UnknownWorker``, naming the registered ones).
workers = Registry()


def worker(
    function: Handler | None = None,
    *,
    source: type[models.Model],
    name: str | None = None,
    eligible: Eligible | None = None,
    concurrency: int = 1,
    transactional: bool = True,
    concurrency_limit: int | None = None,
    concurrency_key: str | None = None,
    retries: int = 0,
    retry_delay: float | timedelta = 1.0,
    retry_backoff: bool = False,
    retry_backoff_factor: float = 2.0,
    retry_max_delay: float | timedelta = 3600.0,
    retry_jitter: bool | float = False,
    retry_for: tuple[type[BaseException], ...] | type[BaseException] = (Exception,),
    timeout: float | timedelta | None = None,
) -> Any:
    """Register a handler that processes every eligible row of ``source`` once.

    Use it as ``@worker(source=Model, ...)`` in an installed app's ``workers.py``; it
    returns the ``Worker``. The handler takes the row, or the row and a ``Context``, and
    returns an ``Outcome``. ``name`` defaults to the function's name and must match
    ``^[a-z][a-z0-9_]*$`` (at most 100 characters). ``transactional=True`` runs the
    handler inside the transaction that records its outcome. A bad declaration raises
    ``InvalidWorker`` saying what to change.

    ``eligible`` is a QuerySet of ``source`` (or a callable returning one) saying which rows
    may be claimed next, and in what order. ``concurrency`` caps how many units of this
    worker one supervisor runs at once; ``concurrency_limit`` how many of one key run at
    once on all supervisors together, the key being the value of the source row's field
    named ``concurrency_key`` (without one: all the worker's units share one key).
    ``retries`` and the ``retry_*`` options retry a handler that raises one of
    ``retry_for``, as tasks' options of the same names do (default: no retry).
    ``timeout`` (seconds or a timedelta): a handler running longer is stopped (its child
    process replaced) and the attempt fails with ``HandlerTimeout``.
    """

    def decorate(handler: Handler) -> Worker:
        _check_callable(handler, source, name)
        worker_name = handler.__name__ if name is None else name
        _validate(worker_name, handler, source, eligible, concurrency, transactional)
        _check_concurrency(f"@worker {worker_name!r} ({_where(handler)})", source,
                          concurrency_limit, concurrency_key)
        policy = SimpleNamespace(
            retries=retries, retry_delay=retry_delay, retry_backoff=retry_backoff,
            retry_backoff_factor=retry_backoff_factor, retry_max_delay=retry_max_delay,
            retry_jitter=retry_jitter, retry_for=retry_for)
        label = f"@worker {worker_name!r} ({_where(handler)})"
        retry_classes = retry.check(label, policy, InvalidWorker)
        retry.check_seconds(label, "timeout", timeout, InvalidWorker, optional=True)
        if timeout is not None and not (timeout.total_seconds() if isinstance(
                timeout, timedelta) else timeout) > 0:
            raise InvalidWorker(f"{label}: timeout={timeout!r} would stop every attempt; "
                                "give more seconds.")
        registered = Worker(
            handler,
            name=worker_name,
            source=source,
            eligible=eligible,
            concurrency=concurrency,
            transactional=transactional,
            concurrency_limit=concurrency_limit,
            concurrency_key=concurrency_key,
            retries=retries, retry_delay=retry_delay, retry_backoff=retry_backoff,
            retry_backoff_factor=retry_backoff_factor, retry_max_delay=retry_max_delay,
            retry_jitter=retry_jitter, retry_for=retry_classes, timeout=timeout,
        )
        workers.add(registered)
        return registered

    if function is not None:
        return decorate(function)
    return decorate


def _where(handler: Callable[..., Any]) -> str:
    module = getattr(handler, "__module__", None) or type(handler).__module__
    qualname = getattr(handler, "__qualname__", None) or type(handler).__qualname__
    return f"{module}.{qualname}"


def _check_callable(handler: Any, source: Any, name: str | None) -> None:
    """``InvalidWorker`` for ``@worker(...)`` applied to something that is not a function
    (``@worker(source=M, name="x")(5)``), or to a callable without a name and no
    ``name=``, before anything reads its name."""
    label = getattr(source, "__name__", repr(source))
    named = "" if name is None else f", name={name!r}"
    if not callable(handler):
        raise InvalidWorker(
            f"@worker(source={label}{named}) was applied to {handler!r} "
            f"({type(handler).__name__}), not a function. Decorate the function that "
            "processes one row: it takes the row (or the row and a Context) and returns an "
            f"Outcome, e.g. '@worker(source={label})' above 'def process(row): ...'."
        )
    if name is None and not isinstance(getattr(handler, "__name__", None), str):
        raise InvalidWorker(
            f"@worker(source={label}) was applied to {handler!r}, which has no __name__ "
            "to name the worker by; pass name=, e.g. name='make_thumbnail'."
        )


def _validate(
    name: Any,
    handler: Handler,
    source: Any,
    eligible: Any,
    concurrency: Any,
    transactional: Any,
) -> None:
    label = f"@worker {name!r} ({_where(handler)})"
    if not isinstance(name, str) or not NAME_RE.match(name) or len(name) > MAX_NAME_LENGTH:
        raise InvalidWorker(
            f"{label}: the name must match ^[a-z][a-z0-9_]*$ and be at most "
            f"{MAX_NAME_LENGTH} characters; pass name= with, e.g., 'make_thumbnail'."
        )
    if not callable(handler):
        raise InvalidWorker(f"{label}: the decorated object is not callable.")
    if not (isinstance(source, type) and issubclass(source, models.Model)):
        raise InvalidWorker(f"{label}: source= must be a model class, not {source!r}.")
    if source._meta.abstract:
        raise InvalidWorker(f"{label}: source={source.__name__} is abstract; use a concrete model.")
    pk = source._meta.pk
    if pk is None or isinstance(pk, models.CompositePrimaryKey):
        raise InvalidWorker(
            f"{label}: source={source._meta.label} has no single-column primary key; "
            "row-as-queue workers need one (add an id field or a unique pk column)."
        )
    too_long = key_too_long(source)
    if too_long:
        raise InvalidWorker(f"{label}: {too_long}")
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InvalidWorker(
            f"{label}: concurrency={concurrency!r} must be an integer >= 1."
        )
    if not isinstance(transactional, bool):
        raise InvalidWorker(f"{label}: transactional={transactional!r} must be True or False.")
    if eligible is not None:
        if isinstance(eligible, QuerySet):
            _check_queryset(name, source, eligible)
        elif not callable(eligible):
            raise InvalidWorker(
                f"{label}: eligible= must be a QuerySet of {source._meta.label} or a "
                f"callable returning one, not {type(eligible).__name__}."
            )
    _count_parameters(name, handler)


#: The longest primary key text an execution stores (``Execution.source_id``'s max_length).
MAX_KEY_LENGTH = 255


def _check_concurrency(where: str, source: type[models.Model], limit: Any,
                       key: Any) -> None:
    """``InvalidWorker`` naming the value and the fix, for a bad ``concurrency_limit`` or
    ``concurrency_key`` of ``@worker``."""
    if bad_limit(limit):
        raise InvalidWorker(
            f"{where}: concurrency_limit={limit!r} must be a whole number from 1 to "
            f"{MAX_LIMIT:,} (how many units with one key may work at once on all "
            "supervisors together).")
    if key is None:
        return
    if limit is None:
        raise InvalidWorker(
            f"{where}: concurrency_key={key!r} was given without concurrency_limit; give "
            "both, e.g. @worker(..., concurrency_limit=1, concurrency_key='account_id').")
    field = None
    if isinstance(key, str):
        try:
            field = source._meta.get_field(key)
        except Exception:
            field = None
    if field is None or not getattr(field, "concrete", False) or field.many_to_many:
        names = sorted(f.name for f in source._meta.concrete_fields)
        raise InvalidWorker(
            f"{where}: concurrency_key={key!r} must name a field of "
            f"{source._meta.label} (one of {', '.join(names)}): the key of a unit is that "
            "field's value in its source row.")


def key_too_long(source: type[models.Model]) -> str | None:
    """Why the source's primary key may not fit ``Execution.source_id``, or None.

    A text key (CharField, TextField and their kind) longer than 255 characters, or without
    a max_length, could be saved by the user and then fail every insert of its pending
    execution (PostgreSQL: ``value too long for type character varying(255)``).
    """
    field = pk_field(source)
    if not isinstance(field, models.CharField | models.TextField):
        return None
    length = field.max_length
    if length is not None and length <= MAX_KEY_LENGTH:
        return None
    return (
        f"source={source._meta.label} has the primary key {field.name!r} "
        f"({type(field).__name__}, max_length={length!r}), but its executions store keys of "
        f"at most {MAX_KEY_LENGTH} characters; give the field max_length={MAX_KEY_LENGTH} or "
        "less, or make the worker's source a model with a shorter key."
    )


def _check_queryset(name: str, source: type[models.Model], qs: Any) -> None:
    if not isinstance(qs, QuerySet):
        raise InvalidWorker(
            f"@worker {name!r}: eligible returned {type(qs).__name__}; it must give a "
            f"QuerySet of {source._meta.label}."
        )
    if qs.model._meta.concrete_model is not source._meta.concrete_model:
        raise InvalidWorker(
            f"@worker {name!r}: eligible is a QuerySet of {qs.model._meta.label}, but the "
            f"worker's source is {source._meta.label}; filter {source.__name__}.objects instead."
        )
    if qs.query.is_sliced:
        raise InvalidWorker(
            f"@worker {name!r}: eligible is sliced; remove the slice (claims take as many "
            "rows as there are free slots)."
        )
    if qs.query.combinator:
        raise InvalidWorker(
            f"@worker {name!r}: eligible uses {qs.query.combinator}(); express it with "
            "filter()/Q objects instead."
        )
    if qs.query.distinct_fields or qs.query.values_select:
        raise InvalidWorker(
            f"@worker {name!r}: eligible must be a plain QuerySet of model instances "
            "(no values(), values_list() or distinct(fields))."
        )


def _count_parameters(name: str, handler: Callable[..., Any]) -> int:
    try:
        params = list(inspect.signature(handler).parameters.values())
    except (TypeError, ValueError):
        return 1
    positional = [
        p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    required = [p for p in positional if p.default is p.empty]
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return 2
    if len(required) > 2 or not positional or (len(positional) > 2 and len(required) > 2):
        raise InvalidWorker(
            f"@worker {name!r} ({_where(handler)}): the handler must take (source) or "
            f"(source, context); it takes ({', '.join(p.name for p in params)})."
        )
    return 2 if len(positional) >= 2 else 1
