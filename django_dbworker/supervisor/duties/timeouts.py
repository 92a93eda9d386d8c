"""Stopping row handlers that ran past ``@worker(timeout=...)`` (tasks' own timeouts are
``duties.tasks.TaskStops``): every round, a look at what each child runs and since when."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...logs import log_event
from ...units.failures import FailureInfo
from .. import aio
from .base import Periodic

if TYPE_CHECKING:
    from ...registry import Worker
    from ..pool import Child
    from ..units import Unit

#: The class path a timed-out handler's failure records.
TIMEOUT = "django_dbworker.exceptions.HandlerTimeout"


class RowTimeouts(Periodic):
    """Every round, when a worker this supervisor runs has a timeout: stop the child of a
    unit that ran longer, and record the attempt failed (retried if the worker retries
    timeouts); the child is replaced, the units waiting in it go to another."""

    name = "row_timeouts"

    def __init__(self, workers: list[Worker], children: Callable[[], list[Child]],
                 stop: Callable[[Child, Unit], bool]) -> None:
        super().__init__(0.0)
        self.limits = {w.name: w.timeout_seconds for w in workers if w.timeout_seconds}
        self.children = children
        self.stop = stop

    def due(self, now: float) -> bool:
        return bool(self.limits) and super().due(now)

    def work(self, now: float) -> None:
        clock = time.monotonic()
        for ch in self.children():
            for c, since in ch.running_all():
                limit = self.limits.get(getattr(c, "worker", ""))
                if c.kind.name != "execution" or not limit:
                    continue
                # An async unit is cancelled in its child at its timeout; its child is
                # stopped only if that did not end it (its coroutine blocks the loop).
                grace = aio.STOP_GRACE if aio.concurrent(c) else 0.0
                if clock - since <= limit + grace:
                    continue
                if not self.stop(ch, c):
                    continue  # it finished meanwhile
                info = FailureInfo(TIMEOUT, f"the handler ran longer than its timeout of "
                                   f"{limit:g}s and its process was stopped")
                retried = c.time_out(info)  # type: ignore[attr-defined]  # an execution's
                log_event(logging.WARNING, "timed_out", **c.describe(), child=ch.pid,
                          retry=retried)
                break  # its child is gone
