"""Wake-ups: announce when work appears, so idle supervisors claim at once.

``announce()`` runs inside the writer's transaction: where the engine notifies
(PostgreSQL's NOTIFY) the announcement is delivered when (and only if) it commits.
Supervisors listen on a connection of their own (``supervisor/wakeups.py``) and keep
polling every ``POLL_INTERVAL`` as the fallback for rows written by other programs,
databases that cannot notify, and poolers that cannot LISTEN.

``announce_ended()`` (and ``Engine.announcing`` in the statement that records a batch of
successes) tells ``result.get()`` waiters that tasks reached a final status
(``tasks/waiting.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connections

from .. import conf
from . import engine_for

CHANNEL = "dbworker"
#: The payload of new tasks among which one may have a concurrency key...
TASKS = "task"
#: ...and of new tasks of which none has one: supervisors that know keyed tasks need not
#: claim the keyed way for them (``supervisor/taskwork.py``). Older supervisors wake on it
#: too (any payload wakes a listener).
KEYLESS_TASKS = "plain"


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


#: The channel of tasks that reached a final status: what ``result.get()`` listens on
#: (``tasks/waiting.py``). The payload is the ended tasks' ids, comma-separated, or ``*``
#: (too many to name: every waiter looks again).
ENDED = "dbworker_ended"
#: PostgreSQL refuses a payload of 8000 bytes or more.
LONGEST_PAYLOAD = 7900


def ended_payload(ids: Iterable[object]) -> str:
    payload = ",".join(str(pk) for pk in ids)
    return payload if len(payload) <= LONGEST_PAYLOAD else "*"


def announce_ended(using: str, ids: Iterable[object]) -> None:
    """Tell waiters (``result.get()``) that these tasks ended, when the current transaction
    commits (where the engine notifies; elsewhere waiters poll). One statement, whatever
    the number of ids; nothing without ids."""
    ids = list(ids)
    if ids and enabled(using):
        connection = connections[using]
        engine_for(connection).notify(connection, ENDED, ended_payload(ids))
