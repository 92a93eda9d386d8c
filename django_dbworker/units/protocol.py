"""The unit protocol: what the supervisor, its children, ``testing`` and ``units.aio`` may
do with a claimed unit of work, whatever its kind, as River's ``WorkUnit``.

A unit answers for itself (``run``, ``release``, ``timeout``, ``concurrent``,
``describe``): nobody above asks which kind it is. Its ``kind`` is its table's lease life
cycle (``units.leases.Leases``), for what is done to many units at once (renew, unclaim,
reap), one statement per kind. The two kinds: ``rows.unit.RowUnit`` (a row-as-queue
execution) and ``tasks.unit.TaskUnit`` (an enqueued task).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

from .leases import Leases

if TYPE_CHECKING:
    from ..outcomes import Result, RunOutcome
    from .failures import FailureInfo

#: A kind of unit: its table's lease life cycle.
Kind = Leases


@runtime_checkable
class Unit(Protocol):
    """One claimed unit of work."""

    @property
    def kind(self) -> Leases: ...
    @property
    def unit_pk(self) -> Any: ...
    @property
    def token(self) -> uuid.UUID: ...
    @property
    def attempt(self) -> int: ...

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against (``supervisor.caps``): the
        worker's name, or ``task:<path>``."""
        ...

    @property
    def begins_next(self) -> bool:
        """Whether its completion may begin the transaction of the unit its process runs
        next (``rows.chain``)."""
        ...

    def paused(self, queues: frozenset[str], workers: frozenset[str]) -> bool:
        """Whether a pause of one of ``queues`` or ``workers`` holds it (its task's queue,
        its worker)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Key/value context for log lines."""
        ...

    def concurrent(self) -> bool:
        """Whether its handler is a coroutine that holds no transaction, so that it may run
        beside others on its child's event loop (``units.aio``)."""
        ...

    def timeout(self) -> tuple[float | None, str]:
        """Seconds it may run (None: no limit) and the word for what runs ("task",
        "handler")."""
        ...

    def time_out(self, seconds: float) -> bool:
        """The supervisor stopped it ``seconds`` after it started (its timeout): record the
        attempt failed, retried where its worker or task retries timeouts. True: a retry
        comes."""
        ...

    def run(self, keep: Callable[[Any], None] | None = None,
            then: Unit | None = None) -> Result | None:
        """Run its handler and record the outcome; returns the ``Result``, or None for a
        task whose success went to ``keep`` to be recorded later (``tasks.completions``).
        ``then``: the unit this process runs right after it (``begins_next``)."""
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


def units_of[U](cls: type[U], claims: Iterable[Any]) -> list[U]:
    """``claims`` (a store's frozen claim records) as units of ``cls``, a unit class that
    subclasses their record class and adds no field; a unit already is one."""
    names = [f.name for f in dataclasses.fields(cast(Any, cls))]
    return [c if isinstance(c, cls) else cls(*(getattr(c, n) for n in names)) for c in claims]
