"""Stopping units that ran past their timeout (``@worker(timeout=...)``,
``@task(timeout=...)``): every round, a look at what each child runs and since when. Each
unit says its own timeout (``Unit.timeout``) and records its own end (``Unit.time_out``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from ...logs import log_event
from ...units import aio
from .base import Periodic

if TYPE_CHECKING:
    from ..pool import Child
    from ..units import Unit


class Timeouts(Periodic):
    """Every round: stop the child of a unit that ran longer than its timeout, and record
    the attempt failed (retried where its worker or task retries timeouts); the child is
    replaced, the units waiting in it go to another. An async unit is cancelled in its
    child at its timeout; its child is stopped only if that did not end it (its coroutine
    blocks the loop): ``aio.STOP_GRACE`` later."""

    name = "timeouts"

    def __init__(self, children: Callable[[], list[Child]],
                 stop: Callable[[Child, Unit], bool]) -> None:
        super().__init__(0.0)
        self.children = children
        self.stop = stop

    def work(self, now: float) -> None:
        clock = time.monotonic()
        for ch in self.children():
            for c, since in ch.running_all():
                limit, _ = c.timeout()
                if not limit:
                    continue
                grace = aio.STOP_GRACE if aio.concurrent(c) else 0.0
                if clock - since <= limit + grace:
                    continue
                if not self.stop(ch, c):
                    continue  # it finished meanwhile
                retried = c.time_out(limit)
                log_event(logging.WARNING, "timed_out", **c.describe(), child=ch.pid,
                          retry=retried)
                break  # its child is gone, with what ran beside it
