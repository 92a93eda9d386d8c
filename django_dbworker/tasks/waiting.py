"""Waiting for a task's end from the caller's side: ``DBWorkerTaskResult.get(timeout)``
and ``aget(timeout)`` (docs/tasks.md, "Waiting for a result").

The task's status is read again and again, the pause between reads growing from
``FIRST_PAUSE`` to ``LONGEST_PAUSE``: a wait costs one indexed primary-key read per pause,
and learns of the end at most ``LONGEST_PAUSE`` late (on every database: no completion
sends a notification, which would cost every task that nobody waits for).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async

from .. import conf
from ..exceptions import ResultTimeout, TaskFailed
from ..models import TASK_FINISHED, TaskRecord, TaskStatus

if TYPE_CHECKING:
    from .results import DBWorkerTaskResult

FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.2


def _status(result_id: str) -> str | None:
    found = TaskRecord.objects.using(conf.get().DATABASE).filter(pk=result_id) \
        .values_list("status", flat=True).first()
    return found


def _check_timeout(timeout: float | None) -> None:
    if timeout is not None and not (isinstance(timeout, int | float) and timeout >= 0):
        raise ValueError(f"get(timeout={timeout!r}): give None (wait as long as it takes) "
                         "or 0 or more seconds.")


def _ended(result: DBWorkerTaskResult, status: str | None) -> bool:
    if status is None:
        from ..djtasks import TaskResultDoesNotExist

        raise TaskResultDoesNotExist(
            f"Task result {result.id} no longer exists while waiting for it (deleted by "
            "retention, purge or forget()).")
    return status in TASK_FINISHED


def wait(result: DBWorkerTaskResult, timeout: float | None) -> Any:
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = FIRST_PAUSE
    while not _ended(result, _status(result.id)):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise _timed_out(result, timeout)
        time.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 2, LONGEST_PAUSE)
    result.refresh()
    return outcome(result)


async def await_end(result: DBWorkerTaskResult, timeout: float | None) -> Any:
    _check_timeout(timeout)
    read = sync_to_async(_status)
    deadline = None if timeout is None else time.monotonic() + timeout
    pause = FIRST_PAUSE
    while not _ended(result, await read(result.id)):
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise await sync_to_async(_timed_out)(result, timeout)
        await asyncio.sleep(pause if left is None else min(pause, left))
        pause = min(pause * 2, LONGEST_PAUSE)
    await result.arefresh()
    if result.dbworker_status == TaskStatus.SUCCESSFUL:
        return result.return_value
    return outcome(result, await sync_to_async(_last_error)(result.id))


def _timed_out(result: DBWorkerTaskResult, timeout: float | None) -> ResultTimeout:
    return ResultTimeout(f"Task {result.task.module_path} {result.id} had not ended after "
                         f"{timeout} s (it is {_status(result.id) or 'gone'}); it goes on.")


def _last_error(result_id: str) -> dict[str, Any]:
    """The last stored error of a task row (its own keys), or an empty mapping."""
    errors = TaskRecord.objects.using(conf.get().DATABASE).filter(pk=result_id) \
        .values_list("errors", flat=True).first()
    last = errors[-1] if isinstance(errors, list) and errors else None
    return last if isinstance(last, dict) else {}


def outcome(result: DBWorkerTaskResult, last: dict[str, Any] | None = None) -> Any:
    """An ended task's return value, or TaskFailed carrying its last error."""
    status = result.dbworker_status
    if status == TaskStatus.SUCCESSFUL:
        return result.return_value
    last = _last_error(result.id) if last is None else last
    path = str(last.get("exception_class_path", ""))
    message = str(last.get("message", ""))
    raise TaskFailed(
        f"Task {result.task.module_path} {result.id} ended {status}"
        + (f": {path}: {message}" if path else "."),
        result_id=str(result.id), status=str(status), exception_class_path=path,
        error_message=message, traceback=str(last.get("traceback", "")))
