"""The database layer: connections, one engine per database, statements, row reads, notify.

``engine(using)`` is the only place that looks at which database a connection talks to.
"""

from __future__ import annotations

import django.db
from django.db.backends.base.base import BaseDatabaseWrapper

from .engine import Engine, TransactionEnded, Unsupported
from .mysql import MySQL
from .postgresql import PostgreSQL
from .sqlite import SQLite

__all__ = ["ENGINES", "Engine", "TransactionEnded", "engine", "engine_for", "refuse_unusable"]

#: Django's ``connection.vendor`` -> our engine for it.
ENGINES: dict[str, Engine] = {"mysql": MySQL(), "postgresql": PostgreSQL(), "sqlite": SQLite()}


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
