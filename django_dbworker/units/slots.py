"""The ``ConcurrencySlot`` rows both kinds' keyed claims lock, one per key (``task:...``,
``worker:...``): made where missing (``ensure``), locked ``SKIP LOCKED`` by a claim
(``lock``) so that two claims never count the same key at once."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from django.db import connections
from django.db.models import QuerySet

from ..db import compiled, engine_for
from ..models import ConcurrencySlot

#: Compiled statements kept at most (``by_keys``: one per use and number of keys).
_MAX_COMPILED = 512


def ensure(keys: Iterable[str], using: str) -> None:
    """The ``ConcurrencySlot`` row of each key, made where it is missing (read first, so
    an enqueue does not lock a slot that a claim may be holding; made in key order)."""
    wanted = set(keys)
    manager = ConcurrencySlot.objects.using(using)
    missing = wanted - set(manager.filter(key__in=sorted(wanted)).values_list("key", flat=True))
    if missing:
        manager.bulk_create([ConcurrencySlot(key=k) for k in sorted(missing)],
                            ignore_conflicts=True)


def lock(using: str, keys: list[str]) -> set[str]:
    """Lock the slots of ``keys`` that no other claim holds now; the keys locked. A slot
    missing (deleted by hand) is made first."""
    connection = connections[using]
    manager = ConcurrencySlot.objects.using(using)

    def build(these: list[str]) -> QuerySet[ConcurrencySlot, Any]:
        qs = manager.filter(key__in=these).order_by("key")
        if connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(skip_locked=True)
        return qs.values_list("key")

    def take() -> set[str]:
        return {str(key) for key, in by_keys(using, "lock_slots", keys, build)}

    held = take()
    if len(held) < len(keys):
        # Skipped (another claim holds it) or missing: only a missing one is made.
        absent = set(keys) - set(manager.filter(key__in=keys).values_list("key", flat=True))
        if absent:
            ensure(absent, using)
            held = take()
    return held


_compiled: dict[tuple[Any, ...], tuple[str, bool]] = {}


def by_keys(using: str, what: str, keys: list[str] | None,
             build: Callable[[Any], QuerySet[Any, Any]]) -> list[tuple[Any, ...]]:
    """The rows of ``build(keys)``, a query whose only parameters are ``keys`` (None: no
    parameter), in their order: compiled once per ``what`` and number of keys (compiling
    with the ORM costs about as much as the statement), else every time."""
    connection = connections[using]
    cache_key = (using, engine_for(connection), what, None if keys is None else len(keys))
    entry = _compiled.get(cache_key)
    if entry is None:
        probes = None if keys is None else [f"\x01probe{i:06d}" for i in range(len(keys))]
        sql, params = compiled.compile_query(build(probes), using)
        if len(_compiled) >= _MAX_COMPILED:
            _compiled.clear()
        _compiled[cache_key] = entry = (sql, params == (probes or []))
    sql, reusable = entry
    if reusable:
        params = list(keys or ())
    else:  # the keys are not all its parameters: compiled every time
        sql, params = compiled.compile_query(build(keys), using)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return list(cursor.fetchall())
