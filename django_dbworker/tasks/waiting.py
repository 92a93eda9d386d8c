"""Waiting for a task's end from the caller's side: ``DBWorkerTaskResult.get(timeout)``
and ``aget(timeout)`` (docs/tasks.md, "Waiting for a result").

On PostgreSQL (with ``DBWORKER["NOTIFY"]``, not behind a transaction pooler) the wait
LISTENs on a connection of its own (``db/notify.py``'s ``ENDED``, opened before the first
look, so no end slips between the look and the LISTEN): every record of a final status
notifies the ended tasks' ids in its own transaction (a batch of successes: one
notification in the same statement), so the wait learns of the end within a round trip.
It still reads the status every ``LISTENING_PAUSE`` (an end written by some other
program, a deleted row). Elsewhere, or when LISTEN fails, the status is read again and
again, the pause growing from ``FIRST_PAUSE`` to ``LONGEST_PAUSE``: one indexed
primary-key read per pause, the end learnt at most ``LONGEST_PAUSE`` late.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import time
from typing import TYPE_CHECKING, Any

from asgiref.sync import sync_to_async
from django.db import connections

from .. import conf
from ..db import engine_for, notify, pooler
from ..djtasks import TaskResultDoesNotExist
from ..exceptions import ResultTimeout, TaskFailed
from ..models import TASK_FINISHED, TaskRecord, TaskStatus

if TYPE_CHECKING:
    from .results import DBWorkerTaskResult

FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.2
#: With LISTEN: the status is read at least this often anyway.
LISTENING_PAUSE = 1.0


class Ends:
    """A LISTEN on the ended tasks' channel for one wait (``open`` returns None where
    there is none: the wait polls)."""

    def __init__(self, listening: Any, result_id: str) -> None:
        self.listening = listening
        self.result_id = result_id

    @classmethod
    def open(cls, result_id: str) -> Ends | None:
        using = conf.get().DATABASE
        if not notify.enabled(using) or pooler.known(using):
            return None
        connection = connections[using]
        try:
            return cls(engine_for(connection).listen(connection, notify.ENDED), result_id)
        except Exception:  # the wait polls instead
            return None

    def fileno(self) -> int:
        return int(self.listening.fileno())

    def named(self) -> bool:
        """Whether a notification since the last call names our task (or ``*``); raises
        when the connection is lost (the caller polls from then on)."""
        return any(p == "*" or self.result_id in p.split(",")
                   for p in self.listening.received())

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.listening.close()


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
        raise TaskResultDoesNotExist(
            f"Task result {result.id} no longer exists while waiting for it (deleted by "
            "retention, purge or forget()).")
    return status in TASK_FINISHED


def wait(result: DBWorkerTaskResult, timeout: float | None) -> Any:
    _check_timeout(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    ends = Ends.open(str(result.id))
    pause = FIRST_PAUSE
    try:
        while not _ended(result, _status(result.id)):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise _timed_out(result, timeout)
            if ends is not None:
                try:
                    _listen(ends, LISTENING_PAUSE if left is None
                            else min(LISTENING_PAUSE, left))
                    continue
                except Exception:  # the LISTEN connection is lost: poll
                    ends.close()
                    ends = None
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, LONGEST_PAUSE)
    finally:
        if ends is not None:
            ends.close()
    result.refresh()
    return outcome(result)


def _listen(ends: Ends, seconds: float) -> None:
    """Until a notification names our task, or ``seconds`` pass."""
    until = time.monotonic() + seconds
    while (left := until - time.monotonic()) > 0:
        ready, _, _ = select.select([ends.fileno()], [], [], left)
        if ready and ends.named():
            return


async def await_end(result: DBWorkerTaskResult, timeout: float | None) -> Any:
    _check_timeout(timeout)
    read = sync_to_async(_status)
    deadline = None if timeout is None else time.monotonic() + timeout
    ends = await sync_to_async(Ends.open)(str(result.id))
    pause = FIRST_PAUSE
    try:
        while not _ended(result, await read(result.id)):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise await sync_to_async(_timed_out)(result, timeout)
            if ends is not None:
                try:
                    await _alisten(ends, LISTENING_PAUSE if left is None
                                   else min(LISTENING_PAUSE, left))
                    continue
                except Exception:  # the LISTEN connection is lost: poll
                    ends.close()
                    ends = None
            await asyncio.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 2, LONGEST_PAUSE)
    finally:
        if ends is not None:
            ends.close()
    await result.arefresh()
    if result.dbworker_status == TaskStatus.SUCCESSFUL:
        return result.return_value
    return outcome(result, await sync_to_async(_last_error)(result.id))


async def _alisten(ends: Ends, seconds: float) -> None:
    """``_listen`` without blocking the event loop: the socket is watched by the loop."""
    loop = asyncio.get_running_loop()
    readable = asyncio.Event()
    fd = ends.fileno()
    loop.add_reader(fd, readable.set)
    try:
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(readable.wait(), left)
            readable.clear()
            if ends.named():
                return
    finally:
        loop.remove_reader(fd)


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
