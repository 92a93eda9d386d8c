"""Optional database triggers that make new source rows pending in the writer's transaction.

Each worker gets two triggers on its source table (``dbworker triggers install``): AFTER
INSERT adds a PENDING execution for every new row, whoever wrote it (``bulk_create``, raw
SQL, another program), and on PostgreSQL sends the NOTIFY ``post_save`` sends; AFTER DELETE
removes the deleted rows' executions, except a running one (its handler forgets it). The
engines write the SQL (``Engine.create_row_triggers``); this module names the triggers,
describes them, and tells whether the installed ones are current. Where ``CREATE TRIGGER``
commits on its own (MariaDB, MySQL: ``features.can_rollback_ddl`` is False) ``install`` and
``remove`` run outside a transaction and refuse to run inside one.

Each trigger carries a comment with its worker and a fingerprint of the SQL it was created
with: a change of the worker's table, key, columns, NOTIFY setting or of our SQL makes the
installed triggers *stale*. They are not migrations: they depend on the registered workers.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, cast

from django.conf import settings
from django.db import NotSupportedError, connections, models, router, transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from .. import conf
from ..db import engine_for, keys, notify
from ..db.engine import RowTriggers, Trigger
from ..exceptions import TriggerUnavailable, UnknownWorker
from ..models import Execution, State
from . import registry
from .pending import add_selected, new_execution_sql, sql_literal
from .registry import NAME_RE, Worker

PREFIX = "dbworker_"
#: PostgreSQL's longest identifier.
MAX_NAME = 63
MARK_RE = re.compile(r"dbworker-trigger worker=([a-z][a-z0-9_]*) "
                     r"event=(insert|delete) fingerprint=([0-9a-f]+)")

type TriggerState = Literal["installed", "missing", "stale"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TriggerStatus:
    """A worker's triggers in the database: ``installed`` (and current), ``missing``, or
    ``stale`` (installed, but not what ``install`` would write now; ``reason`` says how)."""

    worker: str
    #: The table its triggers are on (installed, stale) or go on (missing); None: unknown.
    table: str | None
    state: TriggerState
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"worker": self.worker, "table": self.table, "status": self.state,
                "reason": self.reason or None}


def trigger_names(name: str) -> tuple[str, str]:
    """The names of the insert and delete triggers of worker ``name`` (at most 63
    characters: a long worker name is cut and given a hash of itself)."""
    result = []
    for event in ("ins", "del"):
        full = f"{PREFIX}{event}_{name}"
        if len(full) > MAX_NAME:
            digest = hashlib.sha1(name.encode()).hexdigest()[:8]
            full = f"{full[:MAX_NAME - 9]}_{digest}"
        result.append(full)
    return result[0], result[1]


# ----- what install would write ---------------------------------------------------------

def _alias(using: str | None) -> str:
    alias = conf.get().DATABASE
    if using is not None and using != alias:
        raise TriggerUnavailable(
            f"Triggers go on DBWORKER['DATABASE'] ({alias!r}), where the executions are, "
            f"not on {using!r}.")
    return alias


def _concrete(worker: Worker) -> type[models.Model]:
    """The concrete model of the worker's source (which ``registry`` checked is concrete:
    django-stubs types ``concrete_model`` as optional)."""
    return cast("type[models.Model]", worker.source._meta.concrete_model)


def _source_table(worker: Worker, using: str) -> tuple[str, models.Field[Any, Any]]:
    """The table a worker's triggers go on and its primary key column; refused where a
    trigger cannot make the worker's executions."""
    if not NAME_RE.match(worker.name):
        raise TriggerUnavailable(f"Worker {worker.name!r}: its name is not a valid worker "
                                 "name, so it cannot be written into a trigger.")
    model = _concrete(worker)
    written_to = router.db_for_write(model)
    if written_to != using:
        raise TriggerUnavailable(
            f"Worker {worker.name!r}: its source {worker.source._meta.label} is written to "
            f"database {written_to!r} (DATABASE_ROUTERS), but the executions live in "
            f"{using!r} (DBWORKER['DATABASE']); a trigger cannot write across databases. "
            "Route the model to that database, or leave this worker to the sweep.")
    # The model's own table and column: a proxy's concrete table; for a child of
    # multi-table inheritance its own table, whose key column links to the parent's.
    return model._meta.db_table, model._meta.pk


def _describe(worker: Worker, using: str, mark: str) -> RowTriggers:
    table, pk = _source_table(worker, using)
    connection = connections[using]
    q = connection.ops.quote_name
    columns, values = new_execution_sql(worker)
    insert_name, delete_name = trigger_names(worker.name)
    column = functools.partial(keys.column_name, Execution)
    return RowTriggers(
        table=table, pk=cast(str, pk.column), integer_pk=keys.has_integer_pk(worker.source),
        executions=Execution._meta.db_table, columns=columns, values=values,
        key_column=column("source_id"),
        mine=f"{q(column('worker'))} = {sql_literal(worker.name)}",
        deletable=f"{q(column('state'))} <> {sql_literal(str(State.WORKING))}",
        dependents=tuple((r.related_model._meta.db_table, cast(str, r.field.column))
                         for r in Execution._meta.related_objects),
        insert_name=insert_name, delete_name=delete_name,
        insert_mark=mark.format(event="insert"), delete_mark=mark.format(event="delete"),
        notify=(notify.CHANNEL, "rows") if notify.enabled(using) else None,
        local_time=not settings.USE_TZ,
    )


@dataclass(frozen=True, slots=True)
class _Expected:
    triggers: RowTriggers
    fingerprint: str
    statements: list[str]


def _expected(worker: Worker, using: str) -> _Expected:
    """What ``install`` would write for ``worker`` now, and its fingerprint."""
    connection = connections[using]
    engine = engine_for(connection)
    bare = engine.create_row_triggers(connection, _describe(worker, using, ""))
    fingerprint = hashlib.sha256("\n".join(bare).encode()).hexdigest()[:16]
    mark = f"dbworker-trigger worker={worker.name} event={{event}} fingerprint={fingerprint}"
    described = _describe(worker, using, mark)
    return _Expected(described, fingerprint, engine.create_row_triggers(connection, described))


# ----- what is installed ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Found:
    trigger: Trigger
    worker: str
    event: str
    fingerprint: str


def _found(using: str) -> dict[str, list[_Found]]:
    """Our triggers in the database, by worker name (registered or not)."""
    connection = connections[using]
    found: dict[str, list[_Found]] = {}
    for trigger in engine_for(connection).row_triggers(connection, PREFIX):
        match = MARK_RE.search(trigger.text)
        if match is not None:
            worker, event, fingerprint = match.groups()
            found.setdefault(worker, []).append(_Found(trigger, worker, event, fingerprint))
    return found


def _state(worker: Worker, using: str, mine: list[_Found]) -> TriggerStatus:
    try:
        expected = _expected(worker, using)
    except TriggerUnavailable as exc:
        table = mine[0].trigger.table if mine else None
        return TriggerStatus(worker=worker.name, table=table,
                             state="stale" if mine else "missing", reason=str(exc))
    t = expected.triggers
    if not mine:
        return TriggerStatus(worker=worker.name, table=t.table, state="missing")
    on = mine[0].trigger.table
    want = {(t.insert_name, "insert", t.table, expected.fingerprint),
            (t.delete_name, "delete", t.table, expected.fingerprint)}
    have = {(f.trigger.name, f.event, f.trigger.table, f.fingerprint) for f in mine}
    if have == want:
        return TriggerStatus(worker=worker.name, table=t.table, state="installed")
    if {f.trigger.table for f in mine} != {t.table}:
        reason = f"installed on table {on!r}; the worker's source table is now {t.table!r}"
    elif {f.event for f in mine} != {"insert", "delete"}:
        lacking = {"insert", "delete"} - {f.event for f in mine}
        reason = f"its {' and '.join(sorted(lacking))} trigger is missing"
    else:
        reason = ("written for another version of the worker's source, of its columns, "
                  "of DBWORKER['NOTIFY'] or of django-dbworker")
    return TriggerStatus(worker=worker.name, table=on, state="stale", reason=reason)


def status(using: str | None = None) -> dict[str, TriggerStatus]:
    """Every registered worker's triggers, and any triggers left by workers no longer
    registered (stale), by worker name in name order."""
    alias = _alias(using)
    found = _found(alias)
    result = {w.name: _state(w, alias, found.get(w.name, []))
              for w in registry.workers.values()}
    for name, mine in found.items():
        if name not in result:
            result[name] = TriggerStatus(
                worker=name, table=mine[0].trigger.table, state="stale",
                reason="no worker of this name is registered; remove its triggers")
    return dict(sorted(result.items()))


def installed(worker: Worker | str, using: str | None = None) -> bool:
    """Whether ``worker``'s triggers are installed and current: its new rows then become
    pending in their writer's transaction, and its deleted rows lose their executions.
    One catalog query; False where the database has no triggers or the worker's source
    cannot have them. Other database errors propagate."""
    target = registry.workers[worker] if isinstance(worker, str) else worker
    try:
        alias = _alias(using)
        return _state(target, alias, _found(alias).get(target.name, [])).state == "installed"
    except (TriggerUnavailable, NotSupportedError):
        return False


def current(using: str | None = None) -> set[str]:
    """The names of the workers whose triggers are installed and current (one catalog
    query for all of them; empty where the database has no triggers)."""
    try:
        return {name for name, s in status(using).items() if s.state == "installed"}
    except (TriggerUnavailable, NotSupportedError):
        return set()


# ----- install and remove -----------------------------------------------------------------

def named(names: Iterable[str] | None, also: Iterable[str] = ()) -> list[str]:
    """``names`` checked against the registered workers (and ``also``), sorted; all of
    them when None."""
    known = sorted({*registry.workers, *also})
    if names is None:
        return known
    chosen = sorted(set(names))
    unknown = [n for n in chosen if n not in known]
    if unknown:
        raise UnknownWorker(
            f"No worker named {', '.join(map(repr, unknown))} is registered (registered "
            f"workers: {', '.join(sorted(registry.workers)) or 'none'}).")
    return chosen


def install(using: str | None = None, workers: Iterable[str] | None = None) -> list[str]:
    """Install (or replace stale) triggers of the named workers (default: all); return the
    names whose triggers were written. Rows already in the table are made pending (those
    without an execution) and executions of rows already gone are removed, after the
    triggers exist: no row falls between the two.

    Where the database rolls DDL back (PostgreSQL, SQLite) it is all one transaction, which
    holds the table's writers back on PostgreSQL (``CREATE TRIGGER``'s lock). On MariaDB and
    MySQL each ``CREATE``/``DROP TRIGGER`` commits on its own (so ``install`` is refused
    inside a transaction there): an install cut off midway leaves stale triggers, which
    ``status`` shows and the next ``install`` replaces."""
    alias = _alias(using)
    chosen = [registry.workers[n] for n in named(workers)]
    plans = {w.name: _expected(w, alias) for w in chosen}  # refusals before any change
    connection = connections[alias]
    engine = engine_for(connection)
    written = []
    with _schema_change(alias, "install"):
        found = _found(alias)
        for worker in chosen:
            mine = found.get(worker.name, [])
            if _state(worker, alias, mine).state == "installed":
                continue
            _check_table(worker, plans[worker.name].triggers.table, alias)
            with connection.cursor() as cursor:
                for f in mine:
                    for sql in engine.drop_row_trigger(connection, f.trigger):
                        cursor.execute(sql)
                for sql in plans[worker.name].statements:
                    cursor.execute(sql)
            with transaction.atomic(using=alias):
                _catch_up(worker, alias, timezone.now())
            written.append(worker.name)
        if written:
            notify.announce(alias, "rows")
    return written


def remove(using: str | None = None, workers: Iterable[str] | None = None) -> list[str]:
    """Drop the triggers of the named workers (default: all of ours, those of workers no
    longer registered too); return the names whose triggers were dropped. One transaction
    where DDL rolls back; on MariaDB and MySQL each drop commits (refused inside a
    transaction there)."""
    alias = _alias(using)
    connection = connections[alias]
    engine = engine_for(connection)
    dropped = []
    with _schema_change(alias, "remove"):
        found = _found(alias)
        for name in named(workers, also=found):
            if not found.get(name):
                continue
            with connection.cursor() as cursor:
                for f in found[name]:
                    for sql in engine.drop_row_trigger(connection, f.trigger):
                        cursor.execute(sql)
            dropped.append(name)
    return dropped


def _schema_change(using: str, action: str) -> contextlib.AbstractContextManager[Any]:
    """The transaction ``install`` and ``remove`` run in: one for all their statements where
    the database rolls DDL back; none where each ``CREATE``/``DROP TRIGGER`` commits the
    transaction it runs in (MariaDB, MySQL), and refused inside one there: it would commit
    the caller's work halfway and break its savepoints."""
    connection = connections[using]
    if connection.features.can_rollback_ddl:
        return transaction.atomic(using=using)
    if connection.in_atomic_block:
        raise TriggerUnavailable(
            f"Cannot {action} triggers inside a transaction on {connection.display_name}: "
            "there CREATE TRIGGER and DROP TRIGGER commit the transaction they run in. "
            f"Call triggers.{action}() outside transaction.atomic() (or run "
            f"'manage.py dbworker triggers {action}').")
    return contextlib.nullcontext()


def _check_table(worker: Worker, table: str, using: str) -> None:
    connection = connections[using]
    with connection.cursor() as cursor:
        kinds = {t.name: t.type for t in connection.introspection.get_table_list(cursor)}
    if table not in kinds:
        raise TriggerUnavailable(
            f"Worker {worker.name!r}: its source table {table!r} does not exist in "
            f"{using!r}; run 'manage.py migrate' first.")
    if kinds[table] != "t":
        raise TriggerUnavailable(
            f"Worker {worker.name!r}: its source table {table!r} is a view, which cannot "
            "have an AFTER INSERT trigger; install nothing for this worker (the sweep "
            "finds its rows), or make its source the model of the table the view reads.")


def _catch_up(worker: Worker, using: str, now: Any) -> None:
    """What the triggers would have done for the rows written before them: a PENDING
    execution for each row without one, no execution of a row that is gone (except a
    running one)."""
    model = _concrete(worker)
    executions = Execution.objects.using(using).filter(worker=worker.name)
    has_unit = executions.filter(source_id=keys.key_expression(OuterRef("pk")))
    add_selected(worker, model._base_manager.using(using).filter(~Exists(has_unit)), using,
                 now=now)
    source = model._base_manager.using(using).filter(
        pk=keys.pk_expression(model, OuterRef("source_id")))
    executions.exclude(state=State.WORKING).filter(~Exists(source)).delete()
