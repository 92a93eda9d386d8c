"""Result passing: a dependent reads its dependencies' return values.

``dependency_results()`` inside a running task, ``result.dependencies`` on its
``TaskResult``: one value per item of ``after=[...]``, in that order. A task dependency
gives its return value (JSON; None while it has not succeeded, e.g. a failed one under
``run_on_failure``, and once it was pruned by retention); a row dependency gives None (a
row worker returns an outcome, not a value).
"""

from __future__ import annotations

import uuid
from typing import Any

from .. import conf
from ..models import TaskDependency, TaskRecord, TaskStatus
from ..units import progress


def dependency_results() -> list[Any]:
    """The return values of the running task's dependencies, in ``after`` order."""
    unit = progress.current.get()
    if unit is None or unit.kind != "task":
        raise RuntimeError(
            "dependency_results() is called from inside a running task (one enqueued with "
            ".using(after=[...])); outside one, read result.dependencies of its TaskResult.")
    return results_of(unit.id)


def results_of(task_id: Any) -> list[Any]:
    """The return values of the dependencies of task ``task_id``, in ``after`` order
    (empty: it has none)."""
    using = conf.get().DATABASE
    edges = list(TaskDependency.objects.using(using).filter(dependent_id=_id(task_id))
                 .order_by("position").values_list("dependency_id", flat=True))
    ids = {pk for pk in edges if pk is not None}
    values = dict(TaskRecord.objects.using(using).filter(
        pk__in=ids, status=TaskStatus.SUCCESSFUL).values_list("pk", "return_value")
    ) if ids else {}
    return [values.get(pk) if pk is not None else None for pk in edges]


def _id(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
