"""The workflow builder: ``task.step(...)``, ``chain(...)`` and ``group(...)``, and their
``enqueue()``, which stores a ``Workflow`` row and every member in one transaction.

A shape is flattened into steps in enqueue order, each with the steps it waits for
(``Node.after``): a chain's item waits for the previous item's last steps (a group's last
steps are all of its items' last steps: the fan-in), a group's items wait for what the
group waits for (the fan-out). Each member is enqueued through the dependency machinery
(``.using(after=[...])``) with the workflow's id; the completion callback waits for every
member with the condition ``ended`` (``run_on_failure=True``), so it runs once when all
of them have ended, whatever their status.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

from django.db import transaction

from .. import conf
from ..exceptions import InvalidWorkflow
from ..tasks.task import DBWorkerTask

if TYPE_CHECKING:
    from ..tasks.results import DBWorkerTaskResult
    from .handle import WorkflowHandle

#: Workflow.name's max_length.
MAX_NAME_LENGTH = 200


class Shape:
    """A step, a chain or a group: something a workflow is made of."""

    def nodes(self) -> list[Node]:
        """The steps in enqueue order, each with the indexes of the steps it waits for."""
        found: list[Node] = []
        self._add(found, ())
        return found

    def _add(self, found: list[Node], after: tuple[int, ...]) -> tuple[int, ...]:
        """Append this shape's steps to ``found``, its first ones waiting for ``after``;
        return the indexes of its last steps (what comes next waits for)."""
        raise NotImplementedError

    def enqueue(self, *, name: str = "",
                on_complete: DBWorkerTask | Step | None = None) -> WorkflowHandle:
        """Store the workflow and every member in one transaction (the caller's, if any:
        ``enqueue_on_commit`` does not apply to workflows) and return its handle.

        ``on_complete``: a task (or a step, with its own arguments) enqueued with the
        members, run once when every member has ended, whatever their status; it is
        called with ``workflow_id=<the workflow's id>`` added to its keyword arguments."""
        from ..models import Workflow
        from .handle import WorkflowHandle

        _check_name(name)
        nodes = self.nodes()
        callback = _callback_step(on_complete)
        using = conf.get().DATABASE
        with transaction.atomic(using=using):
            row = Workflow.objects.using(using).create(name=name)
            results = _enqueue_nodes(nodes, row.id)
            callback_result = None
            if callback is not None:
                callback_result = _enqueue_callback(callback, row.id, results)
                row.callback_id = uuid.UUID(callback_result.id)
                Workflow.objects.using(using).filter(pk=row.pk).update(
                    callback_id=row.callback_id)
        return WorkflowHandle(row, results, callback_result)


@dataclass(frozen=True, slots=True)
class Node:
    """One member to enqueue: a step and the indexes of the earlier steps it waits for."""

    step: Step
    after: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Step(Shape):
    """One call of a task in a workflow: ``task.step(*args, **kwargs)``."""

    #: The task (with its ``.using()`` options) to enqueue.
    task: DBWorkerTask
    #: The call's positional arguments.
    args: tuple[Any, ...] = ()
    #: The call's keyword arguments.
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.task, DBWorkerTask):
            raise InvalidWorkflow(
                f"{self.task!r} is not a task of a DBWorkerBackend; a workflow's steps are "
                "stored in django-dbworker's tables. Use @task with a backend whose BACKEND "
                "is 'django_dbworker.backend.DBWorkerBackend'.")

    def using(self, **options: Any) -> Step:
        """The same call with the task's ``.using(...)`` options changed."""
        return replace(self, task=self.task.using(**options))

    def _add(self, found: list[Node], after: tuple[int, ...]) -> tuple[int, ...]:
        found.append(Node(self, after))
        return (len(found) - 1,)

    def __repr__(self) -> str:
        return f"{self.task.name}.step(...)"


@dataclass(frozen=True, slots=True, init=False)
class Chain(Shape):
    """Items one after the other: each waits for the previous one's last steps."""

    items: tuple[Shape, ...]

    def __init__(self, *items: Shape) -> None:
        object.__setattr__(self, "items", _items("chain", items))

    def _add(self, found: list[Node], after: tuple[int, ...]) -> tuple[int, ...]:
        for item in self.items:
            after = item._add(found, after)
        return after


@dataclass(frozen=True, slots=True, init=False)
class Group(Shape):
    """Items side by side: each waits for what the group waits for; what comes after the
    group waits for all of them (fan-in)."""

    items: tuple[Shape, ...]

    def __init__(self, *items: Shape) -> None:
        object.__setattr__(self, "items", _items("group", items))

    def _add(self, found: list[Node], after: tuple[int, ...]) -> tuple[int, ...]:
        last: list[int] = []
        for item in self.items:
            last.extend(item._add(found, after))
        return tuple(last)


def chain(*items: Shape) -> Chain:
    """``chain(a, b, c)``: a, then b, then c; each runs once the previous has succeeded."""
    return Chain(*items)


def group(*items: Shape) -> Group:
    """``group(a, b, c)``: a, b and c side by side; in a chain, what follows waits for all."""
    return Group(*items)


def _items(kind: str, items: tuple[Any, ...]) -> tuple[Shape, ...]:
    if len(items) == 1 and isinstance(items[0], list | tuple):
        items = tuple(items[0])  # chain([a, b]) as chain(a, b)
    if not items:
        raise InvalidWorkflow(f"{kind}() needs at least one step; give task.step(...), "
                              "chain(...) or group(...) items.")
    for i, item in enumerate(items):
        if not isinstance(item, Shape):
            hint = (" (call task.step(...) to make a step of a task)"
                    if hasattr(item, "enqueue") else "")
            raise InvalidWorkflow(f"{kind}() item {i} is {item!r}, not a step, chain or "
                                  f"group{hint}.")
    return items


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or len(name) > MAX_NAME_LENGTH:
        raise InvalidWorkflow(f"name={name!r} must be a string of at most {MAX_NAME_LENGTH} "
                              "characters.")


def _callback_step(on_complete: Any) -> Step | None:
    if on_complete is None or isinstance(on_complete, Step):
        return on_complete
    if isinstance(on_complete, DBWorkerTask):
        return Step(on_complete)
    raise InvalidWorkflow(f"on_complete={on_complete!r} must be a task or task.step(...).")


def _member(task: DBWorkerTask, workflow_id: uuid.UUID) -> DBWorkerTask:
    """The task as a member of the workflow, stored in the caller's transaction."""
    return replace(task, _workflow_id=workflow_id, enqueue_on_commit=False)


def _enqueue_nodes(nodes: list[Node], workflow_id: uuid.UUID) -> list[DBWorkerTaskResult]:
    """Enqueue the steps in order; runs of steps of the same task waiting for the same
    steps (a group's items) go in one ``enqueue_many``."""
    results: list[DBWorkerTaskResult] = []
    start = 0
    while start < len(nodes):
        first = nodes[start]
        end = start + 1
        if first.step.task.idempotency_key is None:
            while (end < len(nodes) and nodes[end].after == first.after
                   and nodes[end].step.task == first.step.task):
                end += 1
        task = _member(first.step.task, workflow_id)
        if first.after:  # after what the step was given itself (.using(after=...)), if any
            task = task.using(after=[*task.after, *(results[i] for i in first.after)])
        calls = [(n.step.args, n.step.kwargs) for n in nodes[start:end]]
        results.extend(task.enqueue_many(calls))
        start = end
    return results


def _enqueue_callback(step: Step, workflow_id: uuid.UUID,
                      members: list[DBWorkerTaskResult]) -> DBWorkerTaskResult:
    task = _member(step.task, workflow_id)
    task = task.using(after=[*task.after, *members], run_on_failure=True)
    return cast("DBWorkerTaskResult", task.enqueue(
        *step.args, **{**step.kwargs, "workflow_id": str(workflow_id)}))


def enqueue_batch(task: DBWorkerTask, calls: Iterable[tuple[Sequence[Any], dict[str, Any]]],
                  workflow: str | bool) -> list[DBWorkerTaskResult]:
    """``task.enqueue_many(calls, workflow=...)``: the calls as one batch (a ``Workflow``
    named ``workflow`` if it is a string), stored with it in one transaction."""
    if workflow is True:
        name = ""
    elif isinstance(workflow, str):
        name = workflow
    else:
        raise InvalidWorkflow(f"workflow={workflow!r} must be True or a name (a string).")
    from ..models import Workflow

    _check_name(name)
    using = conf.get().DATABASE
    calls = list(calls)
    with transaction.atomic(using=using):
        row = Workflow.objects.using(using).create(name=name)
        return replace(task, _workflow_id=row.id).enqueue_many(calls)
