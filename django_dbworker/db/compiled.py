"""Queries compiled once and reused, for the statements that run once per unit or claim.

Building and compiling a query with the ORM often costs more than running it: a claim
query about a millisecond, a ``get(pk=...)`` a few hundred microseconds. When the SQL of a
query depends only on one value (``now`` for a claim, the primary key for a source row)
and on things that do not change (for a worker: its eligible is a QuerySet, or the plain
default manager; never a callable, which may filter on the time it is called), it is
compiled once with two different values of that one. The parameters that differ are the
slots where each call puts its own value; the rest is reused as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.db import connections, models, transaction

#: Two instants no claim will ever use, to tell ``now``'s parameters from the others.
_PROBES = (datetime(2000, 1, 1, 0, 0, 0, 1, tzinfo=UTC),
           datetime(2000, 1, 2, 0, 0, 0, 2, tzinfo=UTC))
#: Entries kept at most (workers times claim sizes); the cache is emptied when it is full.
_LIMIT = 512


@dataclass(frozen=True, slots=True)
class Compiled:
    sql: str
    params: tuple[Any, ...]
    #: Positions in ``params`` that hold the value of each call (``now``, a key); none
    #: when they could not be told apart, and the query is compiled every time.
    slots: tuple[int, ...]
    #: What the query was compiled for (a Worker); an entry of a replaced one is stale.
    owner: Any

    def with_value(self, value: Any) -> list[Any]:
        params = list(self.params)
        for i in self.slots:
            params[i] = value
        return params


_cache: dict[Hashable, Compiled] = {}


def compile_query(qs: models.QuerySet[Any], using: str) -> tuple[str, list[Any]]:
    """SQL and parameters of ``qs``. Django compiles ``select_for_update`` only inside a
    transaction: one is opened for it (nothing runs on the database meanwhile)."""
    compiler = qs.query.get_compiler(using)
    if qs.query.select_for_update and connections[using].get_autocommit():
        with transaction.atomic(using=using):
            sql, params = compiler.as_sql()
    else:
        sql, params = compiler.as_sql()
    return sql, list(params)


def sql_with_now(
    key: Hashable,
    owner: Any,
    build: Callable[[datetime], models.QuerySet[Any]],
    now: datetime,
    using: str,
    *,
    cacheable: bool = True,
) -> tuple[str, list[Any]]:
    """The SQL of ``build(now)`` and its parameters, from the cache when it can.

    ``build`` must use ``now`` only as a parameter compared with a DateTimeField. With
    ``cacheable`` False (its SQL may change between calls), it is compiled every time.
    """
    probes = [p if settings.USE_TZ else p.replace(tzinfo=None) for p in _PROBES]
    found = cached(key, owner, build, probes, _prep_datetime, using) if cacheable else None
    if found is None:
        return compile_query(build(now), using)
    return found.sql, found.with_value(_prep_datetime(now, using))


def cached(
    key: Hashable,
    owner: Any,
    build: Callable[[Any], models.QuerySet[Any]],
    probes: list[Any],
    prep: Callable[[Any, str], Any],
    using: str,
) -> Compiled | None:
    """``build(value)`` compiled once, with the slots where ``value`` goes (``prep`` gives
    its database value); None when it cannot be told apart (compile every time then)."""
    connection = connections[using]
    key = (using, connection.vendor, key)
    entry = _cache.get(key)
    if entry is not None and entry.owner is owner:
        return entry if entry.slots else None
    if len(_cache) >= _LIMIT:
        _cache.clear()
    _cache[key] = entry = _compile(build, probes, prep, owner, using)
    return entry if entry.slots else None


def _compile(build: Callable[[Any], models.QuerySet[Any]], probes: list[Any],
             prep: Callable[[Any, str], Any], owner: Any, using: str) -> Compiled:
    """The compiled query; without slots when the value cannot be told apart."""
    (sql_a, params_a), (sql_b, params_b) = (compile_query(build(p), using) for p in probes)
    slots: tuple[int, ...] = ()
    if sql_a == sql_b and len(params_a) == len(params_b):
        slots = tuple(i for i, (a, b) in enumerate(zip(params_a, params_b, strict=True))
                      if a != b)
        probe = prep(probes[0], using)
        if any(params_a[i] != probe for i in slots):
            slots = ()  # the value is not where we expect it: compile every time
    return Compiled(sql_a, tuple(params_a), slots, owner)


def _prep_datetime(value: datetime, using: str) -> Any:
    return models.DateTimeField().get_db_prep_value(value, connections[using], prepared=False)


def forget(**kwargs: Any) -> None:
    _cache.clear()


setting_changed.connect(forget, dispatch_uid="dbworker-compiled-claims")
