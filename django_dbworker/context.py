"""What a handler taking two arguments receives as its second one."""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Context:
    """The unit a handler runs, given to a handler that takes a second argument."""

    #: The worker's name.
    worker: str
    #: The execution's id (``django_dbworker.models.Execution``).
    execution_id: int
    #: The source row's primary key.
    source_id: Any
    #: 1 on the first run of this unit, 2 on the next, ...
    attempt: int
    #: The claim expires then unless renewed; the supervisor renews it while you run.
    lease_expires_at: datetime

    def released(self) -> AbstractContextManager[bool]:
        """A transactional handler computes for long without holding its transaction:

        ``with context.released(): result = compute(data)``

        The transaction the handler read in is rolled back (keep what you read in Python;
        write after the block), so it holds no row lock and no snapshot, and on SQLite not
        the write lock; on leaving, a new transaction begins, in which the handler's writes
        commit with the unit's status, fenced by its claim as ever. Yields False where
        nothing is released: a ``transactional=False`` worker, or a unit run inside an
        outer transaction (``run_until_idle()`` in a ``TestCase``)."""
        from .rows.released import released

        return released()
