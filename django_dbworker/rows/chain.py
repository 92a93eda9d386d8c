"""One round trip between two transactional row units of a runworkers child, where the
engine can (``Engine.begins_with_completion``: PostgreSQL with client-side binding).

A transactional unit costs two round trips of ours: ``BEGIN; SELECT`` its source row, and,
after the handler, its completion with ``COMMIT``. When the child holds the next unit
already (claimed ahead, ``supervisor/prefetch.py``), the query that commits this unit's
completion also begins the next unit's transaction with its source row's read:
``<completion>; COMMIT; BEGIN; SELECT ...``. The server runs the statements in order and
stops at the first that fails, so the next transaction begins only once this one
committed; the read stays the first statement of the next unit's own transaction (its
snapshot, its transaction marker), as ever.

The connection is then inside the next unit's transaction while this unit's
``transaction.atomic()`` ends. Nothing may run in between that would land in that
transaction, so the next transaction begins with the completion only where nothing does:

- this unit's transaction has no ``on_commit`` callbacks (they run after its COMMIT, in
  autocommit, as Django runs them);
- nobody listens to ``execution_finished`` (this unit's, sent after its commit) or
  ``execution_started`` (the next unit's, sent before its transaction);
- the child has nothing else to do in between: the next unit is the next it runs, a
  transactional row unit of a worker whose source row is read by ``db.sources``' compiled
  query, and no task completions wait to be recorded (``supervisor/child.py``).

Django is told of the transaction without a query (``UnitAtomic``): this unit's block ends
as committed without sending COMMIT, Django's autocommit stays off between the two units,
and the next unit's block adopts the open transaction as the one it began. Whatever else
comes first (the unit was taken back by the supervisor, the child retires or stops, an
error) ends the carried transaction with a ROLLBACK (``discard``): it has only read.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, connections
from django.db.transaction import Atomic

from .. import signals
from ..db import engine_for, keys, sources
from ..db.connections import TransactionCheck
from ..db.engine import Begin
from ..logs import log_event
from .registry import workers

if TYPE_CHECKING:
    from .registry import Worker
    from .store import Claim

__all__ = ["Carried", "UnitAtomic", "begin_next", "carried_for", "carry", "discard", "upcoming"]


@dataclass(slots=True)
class Carried:
    """The transaction the previous unit's completion began for the next unit."""

    using: str
    raw: Any  # the DB-API connection it is open on
    execution_id: int
    token: Any
    reader: sources.Reader
    begin: Begin  # what it sent first; ``rows``: what its source row's read returned


class _State(threading.local):
    """Per thread, as Django's connections are: a child's async units run their own
    bookkeeping in threads of their own (``units/aio.py``), on other connections."""

    #: The unit run after the current one, if it may be begun with its completion (set by
    #: ``supervisor.units.run``); None elsewhere (tests' ``run_until_idle`` too).
    upcoming: Claim | None = None
    carried: Carried | None = None


_state = _State()


def upcoming(c: Claim | None) -> None:
    """Say which unit this thread runs next (None: none known)."""
    _state.upcoming = c


def begin_next(worker: Worker, using: str) -> tuple[Begin, Any] | None:
    """Where the completion of the running unit of ``worker`` (final, about to COMMIT in its
    query) may begin the next unit's transaction: what to send (``Begin``) and how to
    carry it (pass to ``carry``); else None."""
    nxt = _state.upcoming
    connection = connections[using]
    if (nxt is None or connection.run_on_commit
            or not engine_for(connection).begins_with_completion):
        return None
    following = workers.get(nxt.worker)
    if (following is None or not following.transactional
            or signals.execution_finished.has_listeners(worker)
            or signals.execution_started.has_listeners(following)):
        return None
    check = TransactionCheck(using)
    found = sources.statement(following.source, keys.from_key(following.source, nxt.source_key),
                              using, check.annotations())
    if found is None:
        return None
    reader, params = found
    begin = Begin(reader.sql, params)
    return begin, (nxt, reader)


def carry(begin: Begin, plan: Any, using: str) -> bool:
    """After the completion's query: keep the transaction it began (``begin.rows`` set)
    for the next unit; True if it did."""
    if begin.rows is None:
        return False
    nxt, reader = plan
    _state.carried = Carried(using, connections[using].connection, nxt.execution_id, nxt.token,
                       reader, begin)
    return True


def carried_for(c: Claim, using: str) -> Carried | None:
    """The transaction begun for ``c``, taken (None: none; one begun for another unit is
    ended)."""
    held = _state.carried
    if held is None:
        return None
    if (held.execution_id != c.execution_id or held.token != c.token or held.using != using
            or connections[using].connection is not held.raw):
        discard()
        return None
    _state.carried = None
    return held


def discard() -> None:
    """End the transaction begun for a unit that will not run now (it has only read):
    ROLLBACK, and Django's autocommit back on; a connection that fails at it is closed."""
    held, _state.carried = _state.carried, None
    if held is None:
        return
    connection = connections[held.using]
    if connection.connection is not held.raw or connection.in_atomic_block:
        return  # a new connection, or a block adopted it meanwhile: nothing of ours
    try:
        connection.rollback()
        connection.set_autocommit(True)
    except DatabaseError as exc:
        log_event(logging.WARNING, "carried_transaction_lost", execution=held.execution_id,
                  error=f"{type(exc).__name__}: {exc}"[:300])
        connection.close()


class UnitAtomic(Atomic):
    """The outermost ``transaction.atomic()`` of a transactional unit: ``Atomic``, but it
    adopts a transaction begun for it (``carried``), and ends as committed without a query
    when its completion's query committed it and began the next (``chained``)."""

    def __init__(self, using: str, carried: Carried | None) -> None:
        super().__init__(using, savepoint=True, durable=False)
        self.alias = using
        self.carried = carried
        self.chained = False

    def __enter__(self) -> None:
        connection = connections[self.alias]
        if self.carried is None or connection.in_atomic_block or connection.get_autocommit():
            self.carried = None
            super().__enter__()
            return
        # What Atomic.__enter__ sets for an outermost block, whose BEGIN went already.
        connection.commit_on_exit = True
        connection.needs_rollback = False
        connection.in_atomic_block = True
        connection.atomic_blocks.append(self)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if not self.chained:
            super().__exit__(exc_type, exc_value, traceback)
            return
        # Committed by the completion's query, which began the next unit's transaction:
        # the block ends as Atomic.__exit__ ends it after a commit, without COMMIT and
        # without autocommit back on (the server is in that transaction).
        connection = connections[self.alias]
        connection.atomic_blocks.pop()
        connection.in_atomic_block = False
        connection.errors_occurred = False
        if exc_type is not None:
            discard()  # committed, but the next unit will not run now
