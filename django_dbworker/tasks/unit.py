"""A claimed task as a unit (``supervisor.units.Unit``): what the supervisor and its
children may do with one, without knowing it is a task.

``store.TaskClaim`` inherits ``TaskUnit``; the store and the runner are imported where
they are used (``store`` imports this module).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeGuard, cast

if TYPE_CHECKING:
    import uuid

    from ..outcomes import Result, RunOutcome
    from ..supervisor.units import Unit
    from ..units.claimant import Claimant
    from ..units.failures import FailureInfo
    from .completions import Kept
    from .store import TaskClaim


class Tasks:
    """The task kind: what is done to many tasks in one statement."""

    name = "task"

    def renew(self, claimant: Claimant, lease: float) -> int:
        from . import store

        return store.renew(claimant, lease)

    def unclaim(self, claims: list[Any]) -> int:
        from . import store

        return store.unclaim(claims)


TASKS = Tasks()


class TaskUnit:
    """The ``Unit`` methods of ``store.TaskClaim``."""

    __slots__ = ()
    kind: ClassVar[Tasks] = TASKS

    if TYPE_CHECKING:
        task_id: uuid.UUID
        task_path: str
        token: uuid.UUID
        attempt: int

        @property
        def unit_id(self) -> str: ...

    @property
    def group(self) -> str:
        """What per-worker concurrency counts it against: ``task:<path>`` (never capped)."""
        return "task:" + self.task_path

    def describe(self) -> dict[str, Any]:
        return {"task": self.task_path, "id": self.task_id, "attempt": self.attempt}

    def run(self, keep: Callable[[Kept], None] | None = None) -> Result | None:
        """Run the task and record what happened; None when its success went to ``keep``,
        to be recorded later with others (``completions``)."""
        from .runner import run_task

        return run_task(self._claim(), keep)

    def result(self, outcome: RunOutcome, seconds: float, error: str = "") -> Result:
        from ..outcomes import Result

        return Result(self.unit_id, self.task_path, outcome, seconds, error)

    def fail(self, info: FailureInfo) -> int:
        """Record it FAILED for good (no retry), fenced by its token and its lease."""
        from . import store

        return store.fail_attempt(self._claim(), info, retry_at=None, live=True)

    def release(self, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        from . import store

        return store.release(self._claim(), crashed=crashed, max_crashes=max_crashes)

    def _claim(self) -> TaskClaim:
        return cast("TaskClaim", self)  # only store.TaskClaim inherits TaskUnit


def is_task(c: Unit) -> TypeGuard[TaskClaim]:
    """Whether ``c`` is a task unit: for the task duties (timeouts, cancellation), which
    act on task units only."""
    return c.kind is TASKS
