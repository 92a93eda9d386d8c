"""The database layer: connections, one engine per database, statements, row reads, notify.

``engine(using)`` is the only place that looks at which database a connection talks to.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, MutableMapping
from importlib import import_module

import django.db
from django.db.backends.base.base import BaseDatabaseWrapper

from .engine import VENDORS, Engine, TransactionEnded, Unsupported

__all__ = ["ENGINES", "Engine", "TransactionEnded", "engine", "engine_for", "refuse_unusable"]


class Engines(MutableMapping[str, Engine]):
    """Django's ``connection.vendor`` -> our engine for it, its module imported when the
    engine is first asked for: a process on PostgreSQL never imports the SQLite engine (and
    with it ``sqlite3`` and the SQLite library) nor the MySQL one. Every process of a
    supervisor holds what it imports, a forked child included (RSS)."""

    def __init__(self, where: dict[str, Engine | str]) -> None:
        #: vendor -> an engine, or ``"module:Class"`` (relative to this package) until used;
        #: ``engine.VENDORS`` itself, so that ``engine.supported()`` knows an engine added.
        self._entries = where
        self._lock = threading.Lock()

    def __getitem__(self, vendor: str) -> Engine:
        entry = self._entries[vendor]
        if not isinstance(entry, str):
            return entry
        with self._lock:  # one instance per vendor, also when two threads ask first
            entry = self._entries[vendor]
            if isinstance(entry, str):
                module, _, name = entry.partition(":")
                entry = self._entries[vendor] = getattr(import_module(module, __name__), name)()
            return entry

    def __setitem__(self, vendor: str, engine: Engine) -> None:
        self._entries[vendor] = engine

    def __delitem__(self, vendor: str) -> None:
        del self._entries[vendor]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


#: Django's ``connection.vendor`` -> our engine for it.
ENGINES = Engines(VENDORS)


def engine_for(connection: BaseDatabaseWrapper) -> Engine:
    """The engine of ``connection``'s database (``Unsupported`` for one we have none for)."""
    found = ENGINES.get(connection.vendor)
    return found if found is not None else Unsupported(connection.vendor)


def engine(using: str | None = None) -> Engine:
    """The engine of database alias ``using`` (default: ``DBWORKER["DATABASE"]``)."""
    if using is None:
        from .. import conf

        using = conf.get().DATABASE
    # django.db.connections: our own submodule ``connections`` shadows the name here.
    return engine_for(django.db.connections[using])


def refuse_unusable(using: str) -> None:
    """``NotSupportedError`` when database ``using`` cannot run our queue at all (another
    vendor, a server too old: ``Engine.problem``), before anything is stored."""
    from django.db import NotSupportedError

    connection = django.db.connections[using]
    found = engine_for(connection).problem(connection)
    if found is not None:
        raise NotSupportedError(f"{found} Nothing was enqueued.")
