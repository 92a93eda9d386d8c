"""Task rows as ``django.tasks.TaskResult`` objects, with our own status and progress."""

from __future__ import annotations

import sys
from dataclasses import dataclass, fields
from inspect import isclass
from typing import Any

from ..djtasks import TASK_REFRESH_ATTRS, Task, TaskError, TaskResult, TaskResultStatus
from ..exceptions import DBWorkerError, ExceptionNotImported, UnknownTask
from ..models import TaskRecord, TaskStatus
from . import registry as task_registry
from .forget import forget
from .waiting import await_end, wait

DJANGO_STATUS = {
    TaskStatus.READY: TaskResultStatus.READY,
    #: Waits for its dependencies (``after=[...]``): not started yet.
    TaskStatus.WAITING: TaskResultStatus.READY,
    TaskStatus.RETRYING: TaskResultStatus.READY,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.SUCCESSFUL: TaskResultStatus.SUCCESSFUL,
    TaskStatus.FAILED: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}
OUR_ATTRS = ("dbworker_status", "progress", "progress_message", "idempotency_key",
             "snoozes")


# Django's TaskResult is a frozen dataclass; django-stubs 6.1.2 declare it without frozen=True.
@dataclass(frozen=True, slots=True, kw_only=True)
class DBWorkerTaskResult(TaskResult):  # type: ignore[misc]  # see above
    """A TaskResult that also carries our own status (RETRYING, CANCELLED) and progress."""

    #: Our status, finer than Django's ``status``: RETRYING (Django: READY) and CANCELLED
    #: (Django: FAILED) besides READY, RUNNING, SUCCESSFUL and FAILED.
    dbworker_status: TaskStatus = TaskStatus.READY
    #: The last ``set_progress()`` of the task, 0 to 100 (None: none yet).
    progress: float | None = None
    #: The message of that ``set_progress()``.
    progress_message: str = ""
    #: The key given with ``.using(idempotency_key=...)``, if any.
    idempotency_key: str | None = None
    #: Times the task raised ``Snooze`` (not attempts: ``attempts`` does not count them).
    snoozes: int = 0
    #: The workflow (or ``enqueue_many(..., workflow=...)`` batch) the task belongs to:
    #: ``django_dbworker.workflows.get(result.workflow_id)``.
    workflow_id: str | None = None

    @property
    def dependencies(self) -> list[Any]:
        """The return values of the tasks this one was enqueued after (``after=[...]``), in
        that order, read from the database now (``workflows.results``)."""
        from ..workflows.results import results_of

        return results_of(self.id)

    def refresh(self) -> None:
        """Read the task's row again: status, result, errors, progress, ..."""
        fresh = self.task.get_backend().get_result(self.id)
        for attr in (*TASK_REFRESH_ATTRS, *OUR_ATTRS):
            object.__setattr__(self, attr, getattr(fresh, attr))

    async def arefresh(self) -> None:
        """``refresh()`` for async code."""
        fresh = await self.task.get_backend().aget_result(self.id)
        for attr in (*TASK_REFRESH_ATTRS, *OUR_ATTRS):
            object.__setattr__(self, attr, getattr(fresh, attr))

    def get(self, timeout: float | None = None) -> Any:
        """Wait until the task has ended (``timeout`` seconds at most; None: as long as it
        takes), then return its return value, or raise ``TaskFailed`` carrying its last
        error (exception class path, message, traceback) when it ended FAILED or
        CANCELLED. ``ResultTimeout`` (a TimeoutError) if it had not ended in time; the
        task goes on. The result is refreshed (``refresh()``)."""
        return wait(self, timeout)

    def forget(self) -> bool:
        """Delete the task's row now, as retention would later: its result, errors and
        uniqueness key go, and ``get_result()`` no longer finds it. True if it was there.
        A waiting task is deleted before it runs (it never runs); a RUNNING one, or one
        that other tasks wait for, is refused (``CannotForget``)."""
        return forget(self.id)

    async def aget(self, timeout: float | None = None) -> Any:
        """``get()`` for async code: the same wait without blocking the event loop."""
        return await await_end(self, timeout)


def to_result(row: TaskRecord, alias: str, task: Task | None = None) -> DBWorkerTaskResult:
    if task is None:
        try:
            task = task_registry.resolve(row.task_path)
        except UnknownTask:
            task = stand_in(row, alias)  # its result is still the row's
    overrides: dict[str, Any] = {"priority": row.priority, "queue_name": row.queue_name}
    if row.run_after is not None:
        overrides["run_after"] = row.run_after
    if any(getattr(task, name) != value for name, value in overrides.items()):
        task = task.using(**overrides)  # validates the task again: only when it differs
    result = DBWorkerTaskResult(
        task=task,
        id=str(row.pk),
        status=DJANGO_STATUS[TaskStatus(row.status)],
        enqueued_at=row.enqueued_at,
        started_at=row.started_at,
        finished_at=row.finished_at,
        last_attempted_at=row.last_attempted_at,
        args=row.args,
        kwargs=row.kwargs,
        backend=alias,
        errors=_errors(row),
        worker_ids=list(row.worker_ids),
        dbworker_status=TaskStatus(row.status),
        progress=row.progress,
        progress_message=row.progress_message,
        idempotency_key=row.idempotency_key,
        snoozes=row.snoozes,
        workflow_id=None if row.workflow_id is None else str(row.workflow_id),
    )
    object.__setattr__(result, "_return_value", row.return_value)
    return result


def stand_in(row: TaskRecord, alias: str) -> Task:
    """A ``Task`` standing for a row whose function is not a registered task in this
    process (written by another program, or by a deploy that had a task this one lacks):
    its ``module_path`` is the row's path, and calling it raises ``UnknownTask``. Nothing
    is imported, and nothing validates it (its queue may be one this backend lacks)."""
    path = row.task_path
    module, _, name = path.rpartition(".")

    def unknown(*args: Any, **kwargs: Any) -> Any:
        raise UnknownTask(f"{path!r} is not a registered task in this process.")

    unknown.__module__ = module
    unknown.__name__ = unknown.__qualname__ = name or path
    task = object.__new__(Task)
    for attribute, value in (("func", unknown), ("priority", row.priority),
                             ("backend", alias), ("queue_name", row.queue_name),
                             ("run_after", row.run_after), ("takes_context", False)):
        object.__setattr__(task, attribute, value)
    return task


class InvalidTaskRow(DBWorkerError):
    """A task row holds a value django-dbworker never writes (changed outside it)."""


class StoredTaskError(TaskError):
    """A ``TaskError`` read from a task row. Django's ``exception_class`` imports the
    stored path; a row's text must never cause an import, so this one looks the class up
    only among modules already imported (an exception a task raised is, in the process
    that ran it; elsewhere its module is usually imported with the task's)."""

    __slots__ = ()

    @property
    def exception_class(self) -> type[BaseException]:
        path = self.exception_class_path
        found = _imported(path)
        if found is None:
            raise ExceptionNotImported(
                f"{path!r} is not an exception class of a module imported in this process "
                "(a stored error never imports a module); compare exception_class_path, "
                "or import the module that defines the exception first."
            )
        if not (isclass(found) and issubclass(found, BaseException)):
            # Django's own sentence first (TaskError.exception_class).
            raise ValueError(f"{path!r} does not reference a valid exception. It names a "
                             f"{type(found).__name__}, not an exception class.")
        return found


def _imported(path: str) -> object:
    """The object at dotted ``path`` if its module is already imported, else None."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is None:
            continue
        found: object = module
        for name in parts[cut:]:
            found = getattr(found, name, None)
            if found is None:
                return None
        return found
    return None


def _errors(row: TaskRecord) -> list[TaskError]:
    """The row's stored errors; InvalidTaskRow naming the value if it is not a list of
    objects with a class path and a traceback (changed outside django-dbworker)."""
    stored = row.errors
    if stored == []:  # most rows: nothing to look at
        return []
    if isinstance(stored, list | tuple) and all(
            isinstance(e, dict) and isinstance(e.get("exception_class_path"), str)
            and isinstance(e.get("traceback"), str) for e in stored):
        return [StoredTaskError(exception_class_path=e["exception_class_path"],
                          traceback=e["traceback"]) for e in stored]
    shown = repr(stored)
    shown = shown if len(shown) <= 200 else shown[:200] + "..."
    raise InvalidTaskRow(
        f"task row {row.pk}: its stored errors value {shown} is not a list of objects with "
        "'exception_class_path' and 'traceback' strings; it was changed outside "
        "django-dbworker. Set errors to [] (or retry the task) to run it again.")


#: What ``new_results`` copies from the first result to the others as it is.
_SHARED_SLOTS = tuple(
    f.name for f in fields(DBWorkerTaskResult)
    if f.name not in ("id", "args", "kwargs", "errors", "worker_ids")
)


def _setter(name: str) -> Any:
    """The slot's own setter: what ``object.__setattr__`` ends in, without the lookup."""
    return getattr(DBWorkerTaskResult, name).__set__


def new_results(rows: list[Any], alias: str, task: Task) -> list[DBWorkerTaskResult]:
    """Results for the new rows of one enqueue call (``tasks.newtasks.NewTask``, arguments already
    normalised): the first built by ``to_result``, the others copies of it with their own
    id, arguments and empty lists, as building each costs more than storing it."""
    first = to_result(rows[0], alias, task)
    shared = [(_setter(name), getattr(first, name)) for name in _SHARED_SLOTS]
    set_id, set_args, set_kwargs, set_errors, set_workers = map(
        _setter, ("id", "args", "kwargs", "errors", "worker_ids"))
    new = object.__new__
    results = [first]
    for row in rows[1:]:
        result = new(DBWorkerTaskResult)
        for put, value in shared:
            put(result, value)
        set_id(result, row.id)
        set_args(result, row.args)
        set_kwargs(result, row.kwargs)
        set_errors(result, [])
        set_workers(result, [])
        results.append(result)
    return results
