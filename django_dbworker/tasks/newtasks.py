"""New task rows: built as plain values and stored a batch per statement (enqueue -> READY).

``enqueue_many`` of thousands of calls is bound by what Python does per row, so a new row
is not a model instance: it is a ``NewTask`` (the attributes ``results.to_result`` reads),
and the rows of one call share everything but their id and arguments. Per row there is
only what cannot be shared: an id (a string, cut from one read of random bytes), the
arguments normalised by ``plain`` (``normalize_json`` with a fast path for builtin
containers) and, on PostgreSQL, a place in one JSON text of ``[id, args, kwargs]`` triples
encoded by one C call (``encode``). They are stored ``BATCH`` at a time, a statement per
batch that names every column of ``TaskRecord``: on PostgreSQL ``INSERT ... SELECT ...
FROM jsonb_array_elements(payload)``, pipelined (``taskstore.insert_batches``), elsewhere
an ``executemany``. A keyed call (one row) goes through
``bulk_create(ignore_conflicts=True)``.
"""

from __future__ import annotations

import json
import os
import uuid
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime, timedelta
from typing import Any

from django.db import connections
from django.utils import timezone

from .. import conf
from ..db import engine_for
from ..djtasks import Task, TaskResult, task_enqueued
from ..exceptions import InvalidTaskArguments
from ..models import TaskRecord, TaskStatus
from .arguments import has_nul, plain

#: Rows per statement of one enqueue call: small enough that the first batch reaches the
#: server soon (it stores a batch while the next is built), large enough that a statement's
#: own cost (parse, plan, a round trip) is spread over many rows.
BATCH = 1000
#: The columns that differ between the rows of one enqueue call.
PER_ROW = ("id", "args", "kwargs")
#: The same for a task with a concurrency limit: each row's concurrency key too, so that
#: the rows of one call are stored in call order whatever their keys (claim order follows
#: insert order between rows enqueued at the same instant).
PER_ROW_KEYED = (*PER_ROW, "concurrency_key")
#: A keyed task's id is uuid5(KEY_NAMESPACE, key).
KEY_NAMESPACE = uuid.UUID("5d1c2f7e-3b0a-4c7e-9a51-6f0d8b9e2c41")
#: Task arguments as stored: JSON without NaN or infinities.
_JSON = json.JSONEncoder(allow_nan=False)


@dataclass(frozen=True, slots=True)
class Shared:
    """What the rows of one enqueue call have in common."""

    task_path: str
    backend: str
    queue_name: str
    priority: int
    run_after: datetime | None
    available_at: datetime
    enqueued_at: datetime
    idempotency_key: str | None
    schedule: str
    #: Flow control: the same for every row of a statement (calls whose keys differ go in
    #: statements of their own).
    unique_key: str = ""
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: Workflows (``workflows.dependencies``): WAITING with ``waiting_for`` dependencies
    #: not met yet; the workflow the rows belong to.
    status: str = TaskStatus.READY
    waiting_for: int = 0
    workflow_id: uuid.UUID | None = None

    @classmethod
    def of(cls, task: Task) -> Shared:
        now = timezone.now()
        run_after = task.run_after
        if isinstance(run_after, timedelta):
            run_after = now + run_after
        waiting_for = getattr(task, "_waiting_for", 0)
        return cls(task.module_path, task.backend, task.queue_name, task.priority, run_after,
                   run_after or now, now, getattr(task, "idempotency_key", None),
                   getattr(task, "_schedule", ""),
                   status=TaskStatus.WAITING if waiting_for else TaskStatus.READY,
                   waiting_for=waiting_for, workflow_id=getattr(task, "_workflow_id", None))


#: What a new row holds in the columns that nobody sets at enqueue.
FRESH: dict[str, Any] = {
    "started_at": None, "last_attempted_at": None,
    "finished_at": None, "errors": (), "worker_ids": (), "return_value": None,
    "progress": None, "progress_message": "", "snoozes": 0,
}


class NewTask:
    """A task row about to be stored; reads like a ``TaskRecord`` fresh from the database.

    Only the id and the arguments are its own; the rest is ``FRESH`` or the ``Shared``
    values of its enqueue call.
    """

    __slots__ = ("args", "id", "kwargs", "shared")

    def __init__(self, id: str, args: list[Any], kwargs: dict[str, Any],
                 shared: Shared) -> None:
        #: The canonical text of a UUID (``str(uuid)``).
        self.id = id
        self.args = args
        self.kwargs = kwargs
        self.shared = shared

    def __getattr__(self, name: str) -> Any:  # status, task_path, queue_name, ...
        try:
            return FRESH[name]
        except KeyError:
            return getattr(self.shared, name)

    @property
    def pk(self) -> str:
        return self.id

    def record(self) -> TaskRecord:
        s = self.shared
        return TaskRecord(
            id=uuid.UUID(self.id), task_path=s.task_path, backend=s.backend,
            queue_name=s.queue_name, priority=s.priority, args=self.args, kwargs=self.kwargs,
            status=s.status, waiting_for=s.waiting_for, workflow_id=s.workflow_id,
            run_after=s.run_after, available_at=s.available_at,
            enqueued_at=s.enqueued_at, idempotency_key=s.idempotency_key, schedule=s.schedule,
            unique_key=s.unique_key, concurrency_key=s.concurrency_key,
            concurrency_limit=s.concurrency_limit,
        )


def build(shared: Shared, ids: list[str], calls: list[Any]) -> list[NewTask]:
    """A row per ``(args, kwargs)`` call, its arguments normalised by ``plain``.

    Raises ``TypeError`` or ``ValueError`` for a call that is not a pair or whose arguments
    are not JSON values; the caller finds which with a slower look at each call.
    """
    seq = (list, tuple)
    return [NewTask(ids[i], plain(args if type(args) in seq else list(args)),
                    plain(kwargs if type(kwargs) is dict else dict(kwargs)), shared)
            for i, (args, kwargs) in enumerate(calls)]


def ids(shared: Shared, count: int) -> list[str]:
    """Ids for ``count`` new rows: random (version 4), read from the OS in one call.

    A keyed task's id follows from its key, so a result handed out before the row is
    stored (enqueue on commit) names the task that holds the key, whoever wrote it. The
    ids of a workflow's calls are sorted, so that its members read back in call order.
    """
    key = shared.idempotency_key
    if key:
        return [str(uuid.uuid5(KEY_NAMESPACE, key))] * count
    raw = bytearray(os.urandom(16 * count))
    # RFC 4122 version 4: the version nibble in byte 6, the variant bits in byte 8.
    raw[6::16] = raw[6::16].translate(_VERSION_4)
    raw[8::16] = raw[8::16].translate(_VARIANT_RFC_4122)
    # Every id's 32 hex digits go to their places in a 37-byte slot, "8-4-4-4-12 ", one
    # strided copy per place for all ids at once; split() then cuts the ids in C.
    digits = raw.hex().encode()
    text = bytearray(b"-" * (37 * count))
    for digit, place in enumerate(_ID_PLACES):
        text[place::37] = digits[digit::32]
    text[36::37] = b" " * count
    made = text.decode().split()
    if shared.workflow_id is not None:
        # A workflow's members read back in call order: by enqueued_at, then id.
        made.sort()
    return made


_VERSION_4 = bytes(b & 0x0F | 0x40 for b in range(256))
_VARIANT_RFC_4122 = bytes(b & 0x3F | 0x80 for b in range(256))
#: Where each hex digit of an id goes in its canonical text (after the hyphens before it).
_ID_PLACES = [d + (d >= 8) + (d >= 12) + (d >= 16) + (d >= 20) for d in range(32)]

def encode(rows: list[NewTask]) -> str:
    """The rows as one JSON array of ``[id, args, kwargs]``: one C call for all of them.

    Raises ``ValueError`` (NaN or an infinity: not JSON) or ``TypeError``; ``first_bad``
    then says which row.
    """
    return _JSON.encode([[r.id, r.args, r.kwargs] for r in rows])


def first_bad(rows: list[NewTask]) -> tuple[int, Exception] | None:
    """The index of the first row whose arguments are not JSON, with the error."""
    for i, r in enumerate(rows):
        try:
            _JSON.encode([r.args, r.kwargs])
        except (TypeError, ValueError) as exc:
            return i, exc
    return None


#: How a NUL character (U+0000) looks in ``encode``'s text; PostgreSQL's jsonb refuses it.
NUL_ESCAPED = "\\u0000"


def first_poison(rows: list[NewTask], payload: str,
                 max_bytes: int) -> tuple[int, str, int] | None:
    """The first row whose arguments contain a NUL character or whose JSON is longer than
    ``max_bytes``: ``(index, "nul" or "size", size)``, or None. ``payload`` is
    ``encode(rows)``: only when it holds an escaped NUL, or is itself longer than
    ``max_bytes`` (each row's JSON is shorter than it), is any row looked at again."""
    nul = NUL_ESCAPED in payload
    big = len(payload) > max_bytes
    if not (nul or big):
        return None
    for i, r in enumerate(rows):
        if nul and (has_nul(r.args) or has_nul(r.kwargs)):
            return i, "nul", 0
        if big and (size := len(_JSON.encode([r.args, r.kwargs]))) > max_bytes:
            return i, "size", size
    return None


def insert_statement(rows: list[NewTask], using: str,
                     payload: str | None = None) -> tuple[str, list[Any]] | None:
    """``insert``'s statement and parameters for rows without a concurrency limit, where
    they go as one statement with one JSON parameter (``Engine.json_rows_insert``); else
    None."""
    connection = connections[using]
    statement = _statement(connection)
    if not statement.json_rows:
        return None
    params = statement.shared_params(rows[0].shared, connection)
    params.append(encode(rows) if payload is None else payload)
    return statement.sql, params


def insert(rows: list[NewTask], using: str, payload: str | None = None) -> None:
    """Store ``rows`` (all of one ``Shared``, but for their concurrency keys) in one
    statement; the caller's transaction. ``payload``: ``encode(rows)`` if the caller has it
    (for rows without a concurrency limit)."""
    if not rows:
        return
    connection = connections[using]
    keyed = rows[0].shared.concurrency_limit is not None
    statement = _statement(connection, keyed)
    params = statement.shared_params(rows[0].shared, connection)
    if statement.json_rows:
        if keyed:
            payload = _JSON.encode([[r.id, r.args, r.kwargs, r.shared.concurrency_key]
                                    for r in rows])
        params.append(encode(rows) if payload is None else payload)
        with connection.cursor() as cursor:
            cursor.execute(statement.sql, params)
        return
    # One row of parameters per row: the shared values with the row's own in their slots.
    slot_id, slot_args, slot_kwargs, *slot_key = statement.slots
    native = connection.features.has_native_uuid_field
    encoder = _JSON.encode

    def values(row: NewTask) -> list[Any]:
        values = params.copy()
        # UUIDField keeps 32 hex digits where the database has no uuid type
        values[slot_id] = row.id if native else row.id.replace("-", "")
        values[slot_args], values[slot_kwargs] = encoder(row.args), encoder(row.kwargs)
        for slot in slot_key:
            values[slot] = row.shared.concurrency_key
        return values

    with connection.cursor() as cursor:
        cursor.executemany(statement.sql, [values(r) for r in rows])


@dataclass(frozen=True, slots=True)
class _Statement:
    """``insert``'s statement for one connection, and what its parameters are made of.

    Made once per database alias: naming and typing ~30 columns costs more than storing a
    row (a tenth of a millisecond per ``enqueue()``). On PostgreSQL the parameters are the
    values every row shares, then the payload; elsewhere one list per row, where
    ``slots`` says where a row's own values go.
    """

    sql: str
    #: The parameters, the values of fresh rows (FRESH, the fields' defaults) prepared once;
    #: the places of ``Shared``'s values hold None.
    template: list[Any]
    #: (place in ``template``, field) for each value taken from the call's ``Shared``.
    from_call: list[tuple[int, Any]]
    #: Places of id, args, kwargs (and concurrency_key, keyed) in a row's parameters (not
    #: with ``json_rows``).
    slots: tuple[int, ...]
    #: The per-row values go as one JSON parameter (``Engine.json_rows_insert``).
    json_rows: bool

    def shared_params(self, shared: Shared, connection: Any) -> list[Any]:
        params = self.template.copy()
        for place, field in self.from_call:
            params[place] = field.get_db_prep_save(getattr(shared, field.name), connection)
        return params


_STATEMENTS: dict[tuple[str, str, bool], _Statement] = {}
_SHARED_FIELDS = frozenset(f.name for f in fields(Shared))


def _statement(connection: Any, keyed: bool = False) -> _Statement:
    key = (connection.alias, connection.settings_dict["ENGINE"], keyed)
    found = _STATEMENTS.get(key)
    if found is None:
        found = _STATEMENTS[key] = _make_statement(connection, keyed)
    return found


def _make_statement(connection: Any, keyed: bool = False) -> _Statement:
    columns = TaskRecord._meta.concrete_fields
    quote = connection.ops.quote_name
    head = (f"INSERT INTO {quote(TaskRecord._meta.db_table)} "
            f"({', '.join(quote(f.column) for f in columns)})")
    # The per-row values travel as one JSON array of [id, args, kwargs(, key)] where the
    # engine can take them so (one string parameter, cheap to send); the parameters are
    # then the shared columns only, elsewhere every column.
    own = PER_ROW_KEYED if keyed else PER_ROW
    per_row = {name: place for place, name in enumerate(own)}
    json_sql = engine_for(connection).json_rows_insert(head, columns, per_row, connection)
    listed = ([f for f in columns if f.name not in own] if json_sql is not None
              else list(columns))
    template: list[Any] = []
    from_call = []
    for place, f in enumerate(listed):
        if f.name in own:
            template.append(None)
        elif f.name in _SHARED_FIELDS:
            from_call.append((place, f))
            template.append(None)
        else:
            value = FRESH[f.name] if f.name in FRESH else f.get_default()
            template.append(f.get_db_prep_save(value, connection))
    names = [f.name for f in columns]
    slots = tuple(names.index(name) for name in own)
    sql = json_sql or f"{head} VALUES ({', '.join(['%s'] * len(columns))})"
    return _Statement(sql, template, from_call, slots, json_sql is not None)


# ----- what one enqueue call builds, checks and announces ---------------------------------


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


def rows_of(task: Task, shared: Any, ids: list[str], calls: list[Any],
          offset: int) -> list[Any]:
    """``tasks.newtasks.build`` of the calls, or the error naming the first bad one (its index in
    the whole enqueue call: ``calls`` start at ``offset``)."""
    try:
        return build(shared, ids, calls)
    except (TypeError, ValueError):
        for i, call in enumerate(calls):
            _plain_call(task, offset + i, call)  # raises, naming the call
        raise


def encoded(task: Task, rows: list[Any], offset: int) -> str:
    """The rows as one JSON text (``tasks.newtasks.encode``), or the error naming the bad call
    (``rows`` are the calls from ``offset`` on)."""
    try:
        payload = encode(rows)
    except (TypeError, ValueError):
        index, exc = first_bad(rows) or (0, ValueError("not JSON"))
        raise _not_json(task, offset + index, exc) from None
    limit = conf.get().ARGUMENTS_MAX_BYTES
    poison = first_poison(rows, payload, limit)
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
