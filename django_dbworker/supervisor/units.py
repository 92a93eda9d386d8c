"""The unit protocol: what the supervisor and its children may do with a claimed unit of
work, whatever its kind, and the kind-free helpers built on it.

A unit is a row-as-queue execution (``rows.store.Claim``, its methods in ``rows.unit``) or
an enqueued task (``tasks.store.TaskClaim``, in ``tasks.unit``). The supervisor, its
children and ``testing`` use ``Unit`` and the functions here and never ask which kind they
hold; what is done to many units at once (renew, unclaim) goes to each unit's ``kind``, one
statement per kind.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from django.db import DatabaseError

from ..db import errors
from ..logs import log_event, logger
from ..rows import chain, store
from ..rows.unit import EXECUTIONS
from ..tasks import store as taskstore
from ..tasks.unit import TASKS
from ..units.claimant import Claimant
from ..units.failures import FailureInfo, class_path, format_traceback, safe_message

if TYPE_CHECKING:
    from ..outcomes import Result, RunOutcome
    from ..tasks.completions import Kept


class Kind(Protocol):
    """A kind of unit: what is done to many of its units in one statement."""

    #: The word for one unit of the kind in messages: "execution", "task".
    name: str

    def renew(self, claimant: Claimant, lease: float) -> int:
        """Extend the lease of every unit of the kind that ``claimant`` holds."""
        ...

    def unclaim(self, claims: list[Any]) -> int:
        """Give back units claimed ahead that never ran, fenced by their tokens."""
        ...


@runtime_checkable
class Unit(Protocol):
    """One claimed unit of work, as River's ``WorkUnit``."""

    @property
    def kind(self) -> Kind: ...
    @property
    def unit_pk(self) -> Any: ...
    @property
    def token(self) -> uuid.UUID: ...
    @property
    def attempt(self) -> int: ...

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against (``caps``): the worker's name,
        or ``task:<path>``."""
        ...

    def describe(self) -> dict[str, Any]:
        """Key/value context for log lines."""
        ...

    def run(self, keep: Callable[[Kept], None] | None = None) -> Result | None:
        """Run its handler and record the outcome; returns the ``Result``, or None for a
        task whose success went to ``keep`` to be recorded later (``completions``)."""
        ...

    def result(self, outcome: RunOutcome, seconds: float, error: str = "") -> Result:
        """The ``Result`` that reports ``outcome`` of it (recorded elsewhere)."""
        ...

    def fail(self, info: FailureInfo) -> int:
        """Record it FAILED for good with ``info``, fenced by its token and its lease."""
        ...

    def release(self, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        """Give it back after it was cut off (``crashed`` None) or its process died:
        claimable again, or FAILED once it crashed ``max_crashes`` times."""
        ...


#: Every kind, in the order their statements run (executions first, as ever).
KINDS: tuple[Kind, ...] = (EXECUTIONS, TASKS)


def run(c: Unit, keep: Callable[[Kept], None] | None = None, then: Unit | None = None) -> Any:
    """Run a unit and record its outcome; returns the ``Result``, or None for a task whose
    success went to ``keep`` to be recorded later (``completions``). ``then``: the unit
    this process runs right after it, with nothing in between (a child's next): a row
    unit's completion may begin its transaction (``rows.chain``; ``let_go`` ends it if it
    does not run next after all)."""
    if logger.isEnabledFor(logging.DEBUG):
        log_event(logging.DEBUG, "started", **c.describe(), pid=os.getpid())
    if c.kind is not EXECUTIONS:
        chain.discard()  # a transaction begun for a row unit is no task's
    if then is None or then.kind is not EXECUTIONS:
        return c.run(keep)
    chain.upcoming(cast("store.Claim", then))
    try:
        return c.run(keep)
    finally:
        chain.upcoming(None)


def begins_next(c: Unit) -> bool:
    """Whether the completion of ``c`` may begin the next unit's transaction (a row unit:
    ``rows.chain``)."""
    return c.kind is EXECUTIONS


def let_go() -> None:
    """End what a unit's completion began for the next unit, before this process does
    anything else with its connection (``rows.chain.discard``; nothing if it began
    nothing)."""
    chain.discard()


def run_here(c: Unit) -> str:
    """Run a unit in this process as a runworkers child would (``testing.run_until_idle``,
    the backend's immediate mode) and return its outcome: anything but a database error
    that escapes it becomes its FAILED record (a database error is raised: inside the
    caller's transaction nothing more can be written)."""
    try:
        result = c.run()  # with no one to keep its success, a task records it now
        assert result is not None
        return result.outcome
    except DatabaseError:
        raise
    except Exception as exc:
        return "failed" if fail(c, fallback(c, exc)) else "lease_lost"


def fail(c: Unit, info: FailureInfo) -> int:
    """Record ``c`` FAILED for good with ``info`` (its child's last word on it)."""
    return c.fail(info)


def transient(exc: BaseException) -> bool:
    """A database error no unit's value causes, that the same statements may meet no more
    (``db.errors.transient``)."""
    return errors.transient(exc)


def fallback(c: Unit, exc: BaseException) -> FailureInfo:
    """The failure record of a unit that raised ``exc`` outside its handler: running it
    or recording its outcome (``recording`` notes what was being recorded), with the
    real cause and without the offending text."""
    what = getattr(exc, "dbworker_recording", None)
    kind = c.kind.name
    if isinstance(exc, DatabaseError):
        doing = f"recording {what}" if what else "recording its outcome"
        message = (f"the database refused {doing} with {type(exc).__name__}: "
                   f"{safe_message(exc)}; the {kind} is marked FAILED without the "
                   "value it refused (make the value storable: e.g. strip NUL characters) "
                   "instead of being retried as a database error")
    else:
        message = (f"{type(exc).__name__} raised outside the handler, while running or "
                   f"recording this {kind}: {safe_message(exc)}")
    return FailureInfo(class_path(exc), message[:10_000], format_traceback(exc))


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
    kinds = KINDS if tasks else tuple(k for k in KINDS if k is not TASKS)
    return sum(kind.renew(claimant, lease) for kind in kinds)


def reap(max_crashes: int, *, tasks: bool, spare: Claimant | None = None) -> int:
    """Take back units whose lease expired, except ``spare``'s (the reaper's own)."""
    reaped = store.reap(max_crashes, spare)
    return reaped + taskstore.reap(max_crashes, spare) if tasks else reaped


def release_untracked(claimant: Claimant, held: list[Unit], *, tasks: bool) -> int:
    """Give back the units ``claimant`` holds in the database but not in memory (``held``):
    a claim whose answer was lost with its connection after it committed, a unit whose
    record failed after it was forgotten. Renewal finds units by the supervisor's id, so
    these would be renewed for as long as it lives and nobody would reap them. Not a
    crash: they are claimable again at once."""
    keys = {(c.unit_pk, c.token) for c in held}
    released = store.release_untracked(claimant, keys)
    return released + taskstore.release_untracked(claimant, keys) if tasks else released


def describe(c: Unit) -> dict[str, Any]:
    """Key/value context of a unit for log lines."""
    return c.describe()


def group(c: Unit) -> str:
    """What per-worker concurrency counts a unit against."""
    return c.group
