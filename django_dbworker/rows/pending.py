"""The pending set: one PENDING execution per source row waiting for a worker.

Rows saved through the ORM get theirs in the same transaction (``post_save``); rows written
any other way (``bulk_create``, ``update()``, raw SQL, other programs) are found by
discovery (``sweep``). Deleting a source row removes its executions (``post_delete``); the
full sweep removes any that slip through.
"""

from __future__ import annotations

from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from django.db import connections, models
from django.db.models import F, QuerySet
from django.utils import timezone

from .. import conf
from ..db import engine_for, keys, notify
from ..models import Execution, State
from .registry import Worker, workers


@dataclass
class Running:
    """The unit this process is running, so a handler may delete its own source row."""

    execution_id: int
    worker: str
    source_key: str
    deleted: bool = False


running: ContextVar[Running | None] = ContextVar("dbworker_running", default=None)


def add(worker: Worker, pks: Iterable[Any], using: str) -> int:
    """Make ``pks`` pending for ``worker`` unless they already have an execution."""
    now = timezone.now()
    units = [
        Execution(
            worker=worker.name,
            source_id=keys.to_key(worker.source, pk, using),
            sort_key=keys.sort_key(worker.source, pk),
            state=State.PENDING,
            available_at=now,
            created_at=now,
        )
        for pk in pks
    ]
    if units:
        Execution.objects.using(using).bulk_create(units, ignore_conflicts=True)
    return len(units)


def add_selected(worker: Worker, rows: QuerySet[Any], using: str, *,
                 now: datetime | None = None) -> int:
    """Make the rows ``rows`` selects pending for ``worker`` unless they have an execution,
    in one ``INSERT ... SELECT`` on the server: no key comes back to Python and no model
    instance is built (the discovery of thousands of rows costs the database a statement
    per chunk, not the supervisor a millisecond per row). Returns the units added."""
    if not rows.exists():  # a read first: an INSERT takes SQLite's write lock, even of none
        return 0
    connection = connections[using]
    chosen = rows.order_by().values(dbworker_pk=F("pk"))
    sub_sql, sub_params = chosen.query.get_compiler(using).as_sql()
    columns, values = new_execution_sql(worker)
    quote = connection.ops.quote_name
    key = engine_for(connection).key_text("m.dbworker_pk")
    sort = "m.dbworker_pk" if keys.has_integer_pk(worker.source) else "NULL"
    select = ", ".join(v.format(key=key, sort_key=sort, now="%s") for v in values)
    stamp = keys.column_field(Execution, "created_at").get_db_prep_save(
        now or timezone.now(), connection)
    head = (f"INSERT INTO {quote(Execution._meta.db_table)} "
            f"({', '.join(quote(c) for c in columns)})")
    sql = engine_for(connection).insert_select_ignoring(
        head, f"SELECT {select} FROM ({sub_sql}) m")
    with connection.cursor() as cursor:
        cursor.execute(sql, [stamp] * sum(v == "{now}" for v in values) + list(sub_params))
        return max(cursor.rowcount, 0)


def sql_literal(value: Any) -> str:
    """An int or str as SQL text (our own names and defaults only, never input)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"no SQL literal for the execution default {value!r}")
    return str(value) if isinstance(value, int) else "'" + value.replace("'", "''") + "'"


def new_execution_sql(worker: Worker) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The columns of a new PENDING execution and their SQL: the worker, the row's key
    (``{key}``), its sort key (``{sort_key}``), the time for both timestamps (``{now}``),
    and the model's default for every other column that cannot be NULL (what ``add``
    writes through the ORM). Used by ``add_selected`` and the triggers."""
    special = {"worker": sql_literal(worker.name), "source_id": "{key}",
               "sort_key": "{sort_key}", "available_at": "{now}", "created_at": "{now}",
               "state": sql_literal(str(State.PENDING))}
    columns, values = [], []
    for field in Execution._meta.concrete_fields:
        if field.primary_key or (field.null and field.name not in special):
            continue
        columns.append(cast(str, field.column))  # a concrete field has a column
        values.append(special.get(field.name) or sql_literal(field.get_default()))
    return tuple(columns), tuple(values)


def add_siblings(worker: Worker, source_key: str, using: str) -> None:
    """Make the row pending for the other workers over the same model.

    Called when ``worker`` records a status for the row: a worker waiting on that status
    (``has_execution_status`` in its eligible) can then claim it at once, even when the
    row was written without ``save()`` and no sweep has seen it yet.
    """
    siblings = [w for w in workers.for_model(worker.source) if w.name != worker.name]
    if siblings:
        pk = keys.from_key(worker.source, source_key)
        _add_and_announce(siblings, pk, using)


def _add_and_announce(interested: list[Worker], pk: Any, using: str) -> None:
    """``pk`` pending for each of ``interested``, then the announcement: sent together
    where the engine can (``Engine.pipelined``: one round trip on PostgreSQL, not one per
    statement); in the caller's transaction, or (autocommit) one of their own."""
    connection = connections[using]
    with engine_for(connection).pipelined(connection):
        for worker in interested:
            add(worker, [pk], using)
        notify.announce(using, "rows")


def add_statement(worker: Worker, pk: Any, using: str,
                  now: datetime) -> tuple[str, list[Any]]:
    """``add(worker, [pk], using)`` as one statement and its parameters, to run with
    others (``Engine.one_query``)."""
    connection = connections[using]
    columns, values = new_execution_sql(worker)
    quote = connection.ops.quote_name
    head = (f"INSERT INTO {quote(Execution._meta.db_table)} "
            f"({', '.join(quote(c) for c in columns)})")
    given = {"{key}": keys.to_key(worker.source, pk, using),
             "{sort_key}": keys.sort_key(worker.source, pk),
             "{now}": keys.column_field(Execution, "created_at").get_db_prep_save(
                 now, connection)}
    select = ", ".join("%s" if v in given else v for v in values)
    sql = engine_for(connection).insert_select_ignoring(head, f"SELECT {select}")
    return sql, [given[v] for v in values if v in given]


def on_save(sender: type[models.Model], instance: models.Model, raw: bool, using: str,
            **kwargs: Any) -> None:
    """A saved source row becomes pending for the workers over its model, and they are
    told (``notify``). Where the engine can (``Engine.one_query``) in one query: one round
    trip; outside a transaction, a transaction of its own that, with ``ASYNC_COMMIT``,
    does not wait for the WAL flush (the row itself was committed durably before: a
    pending execution lost in a database crash is found again by discovery)."""
    if raw:
        return
    interested = workers.for_model(sender)
    if not interested or using != conf.get().DATABASE:
        return
    connection = connections[using]
    now = timezone.now()
    announce = notify.statement(using, "rows")
    statements = [add_statement(worker, instance.pk, using, now) for worker in interested]
    if engine_for(connection).one_query(connection, [*statements, *filter(None, [announce])],
                                        durable=False):
        return
    _add_and_announce(interested, instance.pk, using)


def on_delete(sender: type[models.Model], instance: models.Model, using: str,
              **kwargs: Any) -> None:
    interested = workers.for_model(sender)
    if not interested or using != conf.get().DATABASE or instance.pk is None:
        return
    key = keys.to_key(sender, instance.pk, using)
    executions = Execution.objects.using(using).filter(
        worker__in=[w.name for w in interested], source_id=key
    )
    current = running.get()
    if current is not None and current.source_key == key:
        # The running handler deletes its own row: the runner removes the execution
        # when it completes, still guarded by the claim's token.
        current.deleted = True
        executions = executions.exclude(id=current.execution_id)
    executions.delete()
