"""What a supervisor claims from: a row worker (``RowSource``) or the task queues
(``TaskSource``). The supervisor takes its sources in turn and asks each for units; it
never asks which kind a source is (``Source``)."""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from ..db import notify
from ..rows import planner
from ..rows.registry import Worker
from ..units.claimant import Claimant
from .caps import Caps
from .pauses import Pauses
from .prefetch import Prefetch
from .taskwork import TaskWork
from .units import Unit

#: The key of the task queues among the sources (no worker's name: those are
#: identifiers).
TASK_SOURCE = "*tasks"


class Source(Protocol):
    """Where units are claimed from."""

    #: Its name in log lines (``claim_failed source=...``) and among broken sources.
    name: str
    #: Its key among the sources found short (``Supervisor._found_short``).
    key: str

    def announced(self, payloads: set[str]) -> bool:
        """Whether an announcement (``db.notify``) says new units may wait here."""
        ...

    def claim(self, want: int, held: Counter[str]) -> list[Unit]:
        """Claim up to ``want`` units; ``held``: units running or waiting on this
        supervisor per concurrency group (``Unit.group``)."""
        ...


class RowSource:
    """A row worker: its pending units, unless it is paused, within its own
    ``concurrency`` on this supervisor (``caps``)."""

    def __init__(self, worker: Worker, *, pauses: Pauses, caps: Caps, prefetch: Prefetch,
                 claimant: Claimant, lease: float) -> None:
        self.worker = worker
        self.name = self.key = worker.name
        self.pauses, self.caps, self.prefetch = pauses, caps, prefetch
        self.claimant, self.lease = claimant, lease

    def announced(self, payloads: set[str]) -> bool:
        return "rows" in payloads or self.name in payloads

    def claim(self, want: int, held: Counter[str]) -> list[Unit]:
        if self.name in self.pauses.workers:
            return []
        room = min(want, self.caps.claimable(self.worker, held[self.name],
                                             self.prefetch.depth()))
        if room <= 0:
            return []
        return list(planner.claim(self.worker, room, self.claimant, self.lease))


class TaskSource:
    """The task queues this supervisor serves, but the paused ones (``TaskWork.claim``)."""

    name = "tasks"
    key = TASK_SOURCE

    def __init__(self, tasks: TaskWork, *, pauses: Pauses) -> None:
        self.tasks, self.pauses = tasks, pauses

    def announced(self, payloads: set[str]) -> bool:
        return bool(payloads & {notify.TASKS, notify.KEYLESS_TASKS})

    def claim(self, want: int, held: Counter[str]) -> list[Unit]:
        return list(self.tasks.claim(want, self.pauses.queues, backlog=self.pauses.backlog))
