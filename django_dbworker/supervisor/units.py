"""What the supervisor and its children do with claimed units, whatever their kind
(``units.protocol.Unit``): they never ask which kind they hold; a unit answers for itself,
and what is done to many units at once (renew, unclaim, reap, take back) goes to each
kind's lease life cycle (``units.leases``), one statement per kind.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..logs import log_event, logger
from ..rows import chain
from ..rows.store import EXECUTIONS
from ..tasks.store import TASKS
from ..units.claimant import Claimant
from ..units.failures import FailureInfo
from ..units.protocol import Kind, Unit
from ..units.running import fail, fallback, run_here, transient

if TYPE_CHECKING:
    from ..tasks.completions import Kept

__all__ = ["KINDS", "Kind", "Unit", "fail", "fallback", "run_here", "transient"]

#: Every kind, in the order their statements run (executions first, as ever).
KINDS: tuple[Kind, ...] = (EXECUTIONS, TASKS)


def kinds(*, tasks: bool) -> tuple[Kind, ...]:
    """The kinds a supervisor holds units of: tasks only when it runs them."""
    return KINDS if tasks else (EXECUTIONS,)


def run(c: Unit, keep: Callable[[Kept], None] | None = None, then: Unit | None = None) -> Any:
    """Run a unit and record its outcome; returns the ``Result``, or None for a task whose
    success went to ``keep`` to be recorded later (``completions``). ``then``: the unit
    this process runs right after it, with nothing in between (``Unit.begins_next``)."""
    if logger.isEnabledFor(logging.DEBUG):
        log_event(logging.DEBUG, "started", **c.describe(), pid=os.getpid())
    return c.run(keep, then)


def begins_next(c: Unit) -> bool:
    """Whether the completion of ``c`` may begin the next unit's transaction."""
    return c.begins_next


def let_go() -> None:
    """End what a unit's completion began for the next unit, before this process does
    anything else with its connection (``rows.chain.discard``; nothing if it began
    nothing)."""
    chain.discard()


def release(c: Unit, *, crashed: FailureInfo | None, max_crashes: int) -> int:
    return c.release(crashed=crashed, max_crashes=max_crashes)


def by_kind(claims: list[Unit]) -> dict[Kind, list[Unit]]:
    """``claims`` grouped by kind, every kind present, in ``KINDS`` order."""
    grouped: dict[Kind, list[Unit]] = {kind: [] for kind in KINDS}
    for c in claims:
        grouped.setdefault(c.kind, []).append(c)
    return grouped


def unclaim(claims: list[Unit]) -> int:
    """Give back units claimed ahead that never ran (one statement per kind)."""
    return sum(kind.unclaim(group) for kind, group in by_kind(claims).items())


def renew(claimant: Claimant, lease: float, *, tasks: bool) -> int:
    """Extend the leases of every unit ``claimant`` holds (one statement per kind; tasks
    only when it runs them), found by its supervisor id, not listed."""
    return sum(kind.renew(claimant, lease) for kind in kinds(tasks=tasks))


def reap(max_crashes: int, *, tasks: bool, spare: Claimant | None = None) -> int:
    """Take back units whose lease expired, except ``spare``'s (the reaper's own)."""
    return sum(kind.reap(max_crashes, spare) for kind in kinds(tasks=tasks))


def reap_held(holders: dict[uuid.UUID, FailureInfo | None], max_crashes: int, *,
              tasks: bool) -> Counter[uuid.UUID]:
    """Take back the units gone supervisors still hold (``supervisor/takeover.py``), by
    holder."""
    taken: Counter[uuid.UUID] = Counter()
    for kind in kinds(tasks=tasks):
        taken += kind.reap_held(holders, max_crashes)
    return taken


def release_untracked(claimant: Claimant, held: list[Unit], *, tasks: bool) -> int:
    """Give back the units ``claimant`` holds in the database but not in memory (``held``):
    a claim whose answer was lost with its connection after it committed, a unit whose
    record failed after it was forgotten. Renewal finds units by the supervisor's id, so
    these would be renewed for as long as it lives and nobody would reap them. Not a
    crash: they are claimable again at once."""
    keys = {(c.unit_pk, c.token) for c in held}
    return sum(kind.release_untracked(claimant, keys) for kind in kinds(tasks=tasks))


def describe(c: Unit) -> dict[str, Any]:
    """Key/value context of a unit for log lines."""
    return c.describe()


def group(c: Unit) -> str:
    """What per-worker concurrency counts a unit against."""
    return c.group
