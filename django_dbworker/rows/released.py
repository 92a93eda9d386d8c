"""``Context.released()``: a transactional handler lets go of its transaction while it
computes, then writes in a new one that commits with the unit's status
(docs/workers.md, "Long computations in a transactional handler").

The runner sets ``point`` around a transactional handler's call. Inside ``released()`` the
handler's transaction is rolled back (what it read is kept in Python; whatever it wrote
before is discarded: write after), so it holds no row lock and no snapshot, and on SQLite
not the database's write lock; the claim stays fenced (the completion checks the token, and
the lease where the engine does, so a process whose claim was taken over meanwhile still
cannot commit). On leaving, a new transaction begins (SQLite: BEGIN IMMEDIATE again) for
the writes that commit with the status.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

from django.db import connections

from ..exceptions import HandlerTransactionError


@dataclass(frozen=True, slots=True)
class Point:
    """Where a transactional handler runs: its database, its ``TransactionCheck``, and how
    many atomic blocks were open when its own began (more later: one of the handler's)."""

    using: str
    check: Any
    depth: int


point: ContextVar[Point | None] = ContextVar("dbworker_release_point", default=None)


@contextlib.contextmanager
def released() -> Iterator[bool]:
    """Yield True if the transaction was released for the ``with`` block; False where
    there is none to release (a worker with ``transactional=False``, whose handler is in
    no transaction of ours; or a unit run inside an outer transaction, as
    ``run_until_idle()`` in a ``TestCase``, where nothing can be released)."""
    at = point.get()
    if at is None:
        yield False
        return
    connection = connections[at.using]
    if len(connection.atomic_blocks) != at.depth:
        raise HandlerTransactionError(
            "context.released() was called inside the handler's own transaction.atomic() "
            "block: call it at the handler's top level, outside any atomic block of yours.")
    if at.depth > 1:  # the unit's transaction is a savepoint of an outer one
        yield False
        return
    engine = at.check.engine
    engine.end_read_transaction(connection)
    try:
        yield True
    finally:
        engine.begin_write_transaction(connection)
        at.check.begun = engine.mark_transaction(connection)
