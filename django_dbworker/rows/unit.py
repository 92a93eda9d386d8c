"""A claimed execution as a unit (``supervisor.units.Unit``): what the supervisor and its
children may do with one, without knowing it is a row-as-queue execution.

``store.Claim`` inherits ``RowUnit``; the store, the runner and ``pending`` are imported
where they are used (``store`` imports this module).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, cast

from ..logs import log_event
from ..units.failures import safe_message

if TYPE_CHECKING:
    import uuid

    from ..outcomes import Result, RunOutcome
    from ..tasks.completions import Kept
    from ..units.claimant import Claimant
    from ..units.failures import FailureInfo
    from .store import Claim


class Executions:
    """The execution kind: what is done to many executions in one statement."""

    name = "execution"

    def renew(self, claimant: Claimant, lease: float) -> int:
        from . import store

        return store.renew(claimant, lease)

    def unclaim(self, claims: list[Any]) -> int:
        from . import store

        return store.unclaim(claims)


EXECUTIONS = Executions()


class RowUnit:
    """The ``Unit`` methods of ``store.Claim``."""

    __slots__ = ()
    kind: ClassVar[Executions] = EXECUTIONS

    if TYPE_CHECKING:
        execution_id: int
        worker: str
        source_key: str
        token: uuid.UUID
        attempt: int

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against: its worker."""
        return self.worker

    def describe(self) -> dict[str, Any]:
        return {"worker": self.worker, "execution": self.execution_id,
                "source": self.source_key, "attempt": self.attempt}

    def run(self, keep: Callable[[Kept], None] | None = None) -> Result:
        """Run the handler and record its outcome (``keep`` is for tasks only)."""
        from .runner import run

        return run(self._claim())

    def result(self, outcome: RunOutcome, seconds: float, error: str = "") -> Result:
        from ..outcomes import Result

        return Result(self.execution_id, self.worker, outcome, seconds, error)

    def time_out(self, info: FailureInfo) -> bool:
        """The supervisor stopped its handler past ``@worker(timeout=...)``: a failed
        attempt like any raise (``HandlerTimeout``), so retried where the worker's
        ``retry_for`` takes a TimeoutError, else FAILED. True: a retry comes."""
        from django.utils import timezone

        from ..exceptions import HandlerTimeout
        from ..registry import workers
        from ..tasks import retry
        from . import store

        worker = workers[self.worker]
        if retry.should_retry(worker, self.attempt, HandlerTimeout(info.message)):
            at = retry.at(timezone.now(), retry.delay(worker, self.attempt))
            store.retry_later(self._claim(), info, at)
            return True
        self.fail(info)
        return False

    def fail(self, info: FailureInfo) -> int:
        """Record it FAILED for good; a FAILED row is made pending for its sibling workers,
        as by the runner's own failure record (else the next sweep finds them)."""
        from .. import conf
        from ..registry import workers
        from . import pending, store

        failed = store.fail(self._claim(), info)
        if failed:
            try:
                pending.add_siblings(workers[self.worker], self.source_key,
                                     conf.get().DATABASE)
            except Exception as exc:
                log_event(logging.WARNING, "siblings_not_marked", **self.describe(),
                          error=f"{type(exc).__name__}: {safe_message(exc)}"[:300])
        return failed

    def release(self, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        from . import store

        return store.release(self._claim(), crashed=crashed, max_crashes=max_crashes)

    def _claim(self) -> Claim:
        return cast("Claim", self)  # only store.Claim inherits RowUnit
