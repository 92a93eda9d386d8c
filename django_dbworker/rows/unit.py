"""A claimed execution as a unit (``units.protocol.Unit``): what the supervisor and its
children may do with one, without knowing it is a row-as-queue execution.

``RowUnit`` is the store's ``Claim`` with the unit's behaviour: the claim planner
(``rows.planner``) makes them; the store's functions take them as claims.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from django.utils import timezone

from .. import conf
from ..exceptions import HandlerTimeout
from ..logs import log_event
from ..outcomes import Result
from ..tasks import retry
from ..units import aio
from ..units.failures import FailureInfo, safe_message
from ..units.protocol import units_of
from . import chain, pending, store
from .registry import workers
from .runner import run

if TYPE_CHECKING:
    from ..outcomes import RunOutcome
    from ..tasks.completions import Kept
    from ..units.protocol import Unit

#: The class path a timed-out handler's failure records.
TIMEOUT = "django_dbworker.exceptions.HandlerTimeout"



@dataclasses.dataclass(frozen=True, slots=True)
class RowUnit(store.Claim):
    """A claimed execution the supervisor runs (``units.protocol.Unit``)."""

    kind: ClassVar[store.Executions] = store.EXECUTIONS
    #: Its completion may begin the next row unit's transaction (``rows.chain``).
    begins_next: ClassVar[bool] = True

    @classmethod
    def of(cls, claims: Iterable[store.Claim]) -> list[RowUnit]:
        """The units of ``claims`` (the store's records of them)."""
        return units_of(cls, claims)

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against: its worker."""
        return self.worker

    def paused(self, queues: frozenset[str], workers: frozenset[str]) -> bool:
        """Whether its worker is paused."""
        return self.worker in workers

    def describe(self) -> dict[str, Any]:
        return {"worker": self.worker, "execution": self.execution_id,
                "source": self.source_key, "attempt": self.attempt}

    def concurrent(self) -> bool:
        """Whether it runs on its child's event loop beside others (``units.aio``): an
        ``async def`` handler declared ``transactional=False``."""
        worker = workers.get(self.worker)
        return worker is not None and aio.beside_others(worker)

    def timeout(self) -> tuple[float | None, str]:
        """Seconds its handler may run (``@worker(timeout=...)``) and the word for it."""
        worker = workers.get(self.worker)
        return (worker.timeout_seconds if worker is not None else None), "handler"

    def run(self, keep: Callable[[Kept], None] | None = None,
            then: Unit | None = None) -> Result:
        """Run the handler and record its outcome (``keep`` is for tasks only). ``then``:
        the unit this process runs right after it, with nothing in between: if it is a
        row unit too, this one's completion may begin its transaction (``rows.chain``;
        ``chain.discard`` ends it if it does not run next after all)."""
        if not isinstance(then, RowUnit):
            return run(self)
        chain.upcoming(then)
        try:
            return run(self)
        finally:
            chain.upcoming(None)

    def result(self, outcome: RunOutcome, seconds: float, error: str = "") -> Result:
        return Result(self.execution_id, self.worker, outcome, seconds, error)

    def time_out(self, seconds: float) -> bool:
        """The supervisor stopped its handler past ``@worker(timeout=...)``: a failed
        attempt like any raise (``HandlerTimeout``), so retried where the worker's
        ``retry_for`` takes a TimeoutError, else FAILED. True: a retry comes."""
        info = FailureInfo(TIMEOUT, f"the handler ran longer than its timeout of "
                           f"{seconds:g}s and its process was stopped")
        worker = workers[self.worker]
        if retry.should_retry(worker, self.attempt, HandlerTimeout(info.message)):
            at = retry.at(timezone.now(), retry.delay(worker, self.attempt))
            store.retry_later(self, info, at)
            return True
        self.fail(info)
        return False

    def fail(self, info: FailureInfo) -> int:
        """Record it FAILED for good; a FAILED row is made pending for its sibling workers,
        as by the runner's own failure record (else the next sweep finds them)."""
        failed = store.fail(self, info)
        if failed:
            try:
                pending.add_siblings(workers[self.worker], self.source_key,
                                     conf.get().DATABASE)
            except Exception as exc:
                log_event(logging.WARNING, "siblings_not_marked", **self.describe(),
                          error=f"{type(exc).__name__}: {safe_message(exc)}"[:300])
        return failed

    def release(self, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        return store.release(self, crashed=crashed, max_crashes=max_crashes)
