"""What a handler taking two arguments receives as its second one."""

from __future__ import annotations

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
