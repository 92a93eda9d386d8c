"""Wake-ups: announce when work appears, so idle supervisors claim at once.

``announce()`` runs inside the writer's transaction: where the engine notifies
(PostgreSQL's NOTIFY) the announcement is delivered when (and only if) it commits.
Supervisors listen on a connection of their own (``supervisor/wakeups.py``) and keep
polling every ``POLL_INTERVAL`` as the fallback for rows written by other programs,
databases that cannot notify, and poolers that cannot LISTEN.
"""

from __future__ import annotations

from typing import Any

from django.db import connections

from .. import conf
from . import engine_for

CHANNEL = "dbworker"


def enabled(using: str) -> bool:
    return engine_for(connections[using]).notifies and conf.get().NOTIFY


def statement(using: str, what: str) -> tuple[str, list[Any]] | None:
    """``announce`` as a statement to run with others (``Engine.one_query``); None where
    nothing is announced."""
    if not enabled(using):
        return None
    return engine_for(connections[using]).notify_statement(CHANNEL, what)


def announce(using: str, what: str) -> None:
    """Tell listening supervisors that ``what`` (a worker name, or ``task``) has work."""
    if not enabled(using):
        return
    connection = connections[using]
    engine_for(connection).notify(connection, CHANNEL, what)
