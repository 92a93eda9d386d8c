"""A claimed task as a unit (``units.protocol.Unit``): what the supervisor and its
children may do with one, without knowing it is a task.

``TaskUnit`` is the store's ``TaskClaim`` with the unit's behaviour: the claim planner
(``tasks.planner``) makes them; the store's functions take them as claims.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, ClassVar, TypeGuard

from .. import conf
from ..db import sources
from ..models import TaskRecord, TaskStatus
from ..outcomes import Result
from ..rows import chain
from ..units.failures import FailureInfo
from ..units.protocol import units_of
from . import registry, store
from .runner import record_stopped, run_task

if TYPE_CHECKING:
    from typing import Any

    from ..outcomes import RunOutcome
    from ..units.protocol import Unit
    from .completions import Kept

#: The class path a timed-out task's failure records.
TIMEOUT = "django_dbworker.exceptions.TaskTimeout"



@dataclasses.dataclass(frozen=True, slots=True)
class TaskUnit(store.TaskClaim):
    """A claimed task the supervisor runs (``units.protocol.Unit``)."""

    kind: ClassVar[store.Tasks] = store.TASKS
    begins_next: ClassVar[bool] = False

    @classmethod
    def of(cls, claims: Iterable[store.TaskClaim]) -> list[TaskUnit]:
        """The units of ``claims`` (the store's records of them)."""
        return units_of(cls, claims)

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against: ``task:<path>`` (never capped)."""
        return "task:" + self.task_path

    def paused(self, queues: frozenset[str], workers: frozenset[str]) -> bool:
        """Whether its queue is paused; a claim without its row runs (claimed ahead of
        the pause)."""
        if not queues or not self.values:
            return False
        names = sources.columns(TaskRecord, conf.get().DATABASE).names
        return self.values[names.index("queue_name")] in queues

    def describe(self) -> dict[str, Any]:
        return {"task": self.task_path, "id": self.task_id, "attempt": self.attempt}

    def concurrent(self) -> bool:
        """Whether it runs on its child's event loop beside others (``units.aio``): an
        ``async def`` task that is not ``transactional=True``."""
        task = registry.known().get(self.task_path)
        return (task is not None and not getattr(task, "transactional", False)
                and inspect.iscoroutinefunction(task.func))

    def timeout(self) -> tuple[float | None, str]:
        """Seconds it may run (``@task(timeout=...)``) and the word for what runs."""
        task = registry.known().get(self.task_path)
        return (task.timeout_seconds if task is not None else None), "task"

    def time_out(self, seconds: float) -> bool:
        """The supervisor stopped it past ``@task(timeout=...)``: a failed attempt
        (``TaskTimeout``), retried where its ``retry_for`` takes it. True: a retry comes."""
        info = FailureInfo(TIMEOUT, f"the task ran longer than its timeout of {seconds:g}s "
                           "and its process was stopped")
        return record_stopped(self.task_path, self, info, status=TaskStatus.FAILED).retrying

    def run(self, keep: Callable[[Kept], None] | None = None,
            then: Unit | None = None) -> Result | None:
        """Run the task and record what happened; None when its success went to ``keep``,
        to be recorded later with others (``completions``). A transaction a row unit's
        completion began for the next unit is no task's: it ends first (``rows.chain``)."""
        chain.discard()
        return run_task(self, keep)

    def result(self, outcome: RunOutcome, seconds: float, error: str = "") -> Result:
        return Result(self.unit_id, self.task_path, outcome, seconds, error)

    def fail(self, info: FailureInfo) -> int:
        """Record it FAILED for good (no retry), fenced by its token and its lease."""
        return store.fail_attempt(self, info, retry_at=None, live=True)

    def release(self, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        return store.release(self, crashed=crashed, max_crashes=max_crashes)


def is_task(c: Unit) -> TypeGuard[TaskUnit]:
    """Whether ``c`` is a task unit: for the task duties (timeouts, cancellation), which
    act on task units only."""
    return isinstance(c, TaskUnit)
