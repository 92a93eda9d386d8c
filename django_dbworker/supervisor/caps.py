"""A worker's ``concurrency``: how many of a supervisor's children may hold its units.

A child runs the units it holds one after another, so a worker whose units are in at most
``concurrency`` children never has more than that many running at once, however many more
wait behind them (claimed ahead, sent in batches). A unit of a worker at its cap waits in
the supervisor for a child that holds some of that worker's units already, or until one
that held some has reported them all; tasks have no cap of their own. The units of an
``async def`` handler with ``transactional=False`` run beside each other in a child
(``aio``): each of the ``concurrency`` children runs up to ``ASYNC_CONCURRENCY`` of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from .. import conf
from ..rows.registry import Worker
from ..units import aio
from . import units
from .pool import Child
from .units import Unit


class Caps:
    def __init__(self, workers: Iterable[Worker], children: int) -> None:
        self.limits = {w.name: w.concurrency for w in workers}
        #: Whether a cap can matter at all: not when every worker may use every child.
        self.binding = any(limit < children for limit in self.limits.values())

    def claimable(self, worker: Worker, held: int, depth: int) -> int:
        """How many more units of ``worker`` to claim, ``held`` being claimed here already
        (waiting here or sent): as many as the children it may use hold at most (two
        batches of ``depth`` each), or its cap while a child gets one unit at a time."""
        per_child = 1 if depth <= 1 else 2 * depth
        if aio.beside_others(worker):  # up to ASYNC_CONCURRENCY at once in a child
            per_child = max(per_child, 2 * conf.get().ASYNC_CONCURRENCY)
        return worker.concurrency * per_child - held

    def admit(self, child: Child, children: Sequence[Child]) -> Callable[[Unit], bool] | None:
        """Which waiting units ``child`` may be sent now (None: any): those of a worker
        whose units are in fewer children than its cap, or in ``child`` already."""
        if not self.binding:
            return None
        holders: dict[str, set[int]] = {}  # worker -> the children (ids) holding its units
        for ch in children:
            for c in ch.sent.values():
                group = units.group(c)
                if group in self.limits:
                    holders.setdefault(group, set()).add(id(ch))

        def allowed(c: Unit) -> bool:
            group = units.group(c)
            limit = self.limits.get(group)
            if limit is None:
                return True
            holding = holders.get(group, ())
            return id(child) in holding or len(holding) < limit

        return allowed
