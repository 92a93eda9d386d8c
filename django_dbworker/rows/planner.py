"""The claim of row-as-queue units, as the supervisor and ``testing`` make it: the plain
claim (``store.claim``: one statement) or, for a worker with a ``concurrency_limit``, the
keyed one (``concurrency.claim``: each key within its limit on every supervisor), made
units (``unit.RowUnit``) the supervisor can run."""

from __future__ import annotations

from ..units.claimant import Claimant
from . import concurrency, store
from .registry import Worker
from .unit import RowUnit


def claim(worker: Worker, limit: int, claimant: Claimant, lease: float) -> list[RowUnit]:
    """Claim up to ``limit`` units of ``worker``, in eligible's order; committed on return."""
    if getattr(worker, "concurrency_limit", None) is not None:
        return RowUnit.of(concurrency.claim(worker, limit, claimant, lease))
    return RowUnit.of(store.claim(worker, limit, claimant, lease))
