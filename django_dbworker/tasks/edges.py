"""A task's ``after=``, read without a database: each item (a task result, a task id, an
``after_row(worker, row)``) becomes an ``Edge`` at its place in the list, or
``InvalidDependency`` names the bad one. ``workflows.dependencies`` stores the edges."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..djtasks import TaskResult, task_backends
from ..exceptions import InvalidDependency


@dataclass(frozen=True, slots=True)
class Edge:
    """One item of ``after``: a task (``dependency_id``) or a row worker's execution of
    one row (``row_worker``, ``row_source_id``), at its place in the list."""

    position: int
    dependency_id: uuid.UUID | None = None
    row_worker: str = ""
    row_source_id: str | None = None

    def name(self) -> str:
        return (f"task {self.dependency_id}" if self.dependency_id is not None
                else f"row {self.row_worker}[{self.row_source_id}]")


def edges_of(where: str, after: Iterable[Any]) -> list[Edge]:
    """The edges of ``after``, in order; ``InvalidDependency`` naming a bad item."""
    if isinstance(after, str | bytes | TaskResult) or not isinstance(after, Iterable):
        raise InvalidDependency(
            f"{where}: after={after!r} must be a list of task results (or task ids), e.g. "
            "after=[result_a, result_b].")
    return [_edge(where, i, item) for i, item in enumerate(after)]


def _edge(where: str, position: int, item: Any) -> Edge:
    if isinstance(item, TaskResult):
        try:
            backend = task_backends[item.backend]
        except Exception:  # an alias TASKS does not have (InvalidTaskBackend)
            backend = None
        if not getattr(backend, "stores_dbworker_tasks", False):
            raise InvalidDependency(
                f"{where}: after[{position}] is a result of task backend {item.backend!r}, "
                "which is not a DBWorkerBackend; a task can only wait for tasks stored in "
                "django-dbworker's database.")
        return Edge(position, _uuid(where, position, item.id))
    if isinstance(item, uuid.UUID | str):
        return Edge(position, _uuid(where, position, item))
    worker, source_id = getattr(item, "worker", None), getattr(item, "source_id", None)
    if type(item).__name__ == "RowDependency" and isinstance(worker, str):
        return Edge(position, row_worker=worker, row_source_id=str(source_id))
    hint = ("; enqueue it first and give its result (task.enqueue(...))"
            if hasattr(item, "enqueue") else "")
    raise InvalidDependency(
        f"{where}: after[{position}] is {item!r} ({type(item).__name__}); give task results "
        f"or task ids (str or UUID), or after_row(worker, row){hint}.")


def _uuid(where: str, position: int, value: Any) -> uuid.UUID:
    try:
        return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        raise InvalidDependency(
            f"{where}: after[{position}] is {value!r}, which is not a task id (a UUID)."
        ) from None
