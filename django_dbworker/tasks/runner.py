"""Run one claimed task in this process, then record what happened."""

from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.db import InterfaceError, OperationalError, connections, transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from .. import conf
from ..db import engine, errors
from ..db.connections import connected
from ..djtasks import (
    TaskContext,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_finished,
    task_started,
)
from ..exceptions import InvalidTaskArguments, UnknownTask
from ..logs import log_event
from ..models import TaskStatus
from ..outcomes import Result, RunOutcome, Snooze
from ..units import aio, progress
from ..units.failures import FailureInfo, class_path, format_traceback, recording, safe_message
from ..units.running import in_caller
from . import registry as task_registry
from . import retry, snooze
from . import store as taskstore
from .completions import Kept
from .results import to_result
from .store import TaskClaim
from .task import DBWorkerTask

if TYPE_CHECKING:
    from .unit import TaskUnit  # the unit runs itself through run_task

logger = logging.getLogger("django_dbworker")

SUCCESSFUL, RETRYING = RunOutcome.SUCCESSFUL, RunOutcome.RETRYING
FAILED, LOST = RunOutcome.FAILED, RunOutcome.LEASE_LOST
SNOOZED = RunOutcome.SNOOZED

#: How many times a task's status change runs when it loses to another transaction.
RECORD_TRIES = 4
LOST_WHY = ("cancelled, taken over, or its lease expired (its supervisor could not renew "
            "it) before it finished; not recorded")


def run_task(c: TaskUnit, keep: Callable[[Kept], None] | None = None) -> Result | None:
    """Run ``c`` and record what happened; returns the outcome for the supervisor.

    ``keep``: a success is not recorded here but handed to it (``completions``), to be
    recorded with others; what follows the record runs then, and None is returned."""
    started = time.monotonic()
    row = c.row(conf.get().DATABASE)
    if row is None or row.token != c.token:
        return _result(c, LOST, started, "the task row is gone or was taken over")
    try:
        task = task_registry.resolve(c.task_path)
    except UnknownTask as exc:  # with where it was looked up: the traceback is not empty
        return _unrunnable(c, FailureInfo.caught(exc), started)
    except Exception as exc:  # whatever resolving raised: the row's fault, not the child's
        return _unrunnable(c, FailureInfo(
            class_path(exc), f"looking up the task {c.task_path!r} raised "
            f"{type(exc).__name__}: {safe_message(exc)}", format_traceback(exc)), started)
    alias = task.backend
    try:
        result = to_result(row, alias, task)
    except Exception as exc:  # a row changed outside django-dbworker (priority, queue, ...)
        return _unrunnable(c, FailureInfo(
            class_path(exc), f"task row {c.task_id} cannot be run as stored: "
            f"{safe_message(exc)}", format_traceback(exc)), started)
    task_started.send(type(task.get_backend()), task_result=result)
    unit = progress.Unit("task", str(c.task_id))
    token = progress.current.set(unit)
    # The connection the task starts on: leaving an atomic() of the task after the server
    # ended its session makes Django open a new one at once, which answers, so only the
    # comparison with this one tells a lost session from the task's own error.
    raw = _raw_connection()
    if getattr(task, "transactional", False):
        try:
            return _run_in_transaction(task, c, result, row, started, raw, unit)
        finally:
            progress.current.reset(token)
    try:
        try:
            value = _call(task, result, row.args, row.kwargs)
            value = _json_value(task, value)
        except Snooze as exc:
            return _snoozed(task, c, row.snoozes, exc, started)
        except (OperationalError, InterfaceError) as exc:
            if errors.gone(exc, raw=raw):
                raise  # the connection or the server went away: it goes back
            return _failed(task, c, exc, started)
        except BaseException as exc:
            if engine().session_lost(exc) or errors.gone(exc):
                raise  # not the task's fault: the child opens a new session; it goes back
            if isinstance(exc, KeyboardInterrupt) and in_caller():
                raise  # the caller's Ctrl-C, not the task's failure (units.running)
            return _failed(task, c, exc, started)
        finished = timezone.now()
        ran = time.monotonic() - started

        def after(recorded: bool) -> Result:
            if not recorded:
                return _result(c, LOST, started, LOST_WHY, ran=ran)
            _callback(task, "on_success", c, value)
            _finished_signal(task, c, result=_succeeded(result, value, finished, unit))
            return _result(c, SUCCESSFUL, started, ran=ran)

        if keep is not None:
            keep(Kept(c, value, finished, after))
            return None
        with recording("its return value"):
            recorded = _retried(lambda: taskstore.succeed(c, value, at=finished))
        return after(bool(recorded))
    finally:
        progress.current.reset(token)


class _NotRecorded(Exception):
    """A transactional task's success could not be recorded (its claim is gone): its
    writes roll back with it."""


def _run_in_transaction(task: Any, c: TaskClaim, result: Any, row: Any, started: float,
                        raw: Any, unit: progress.Unit) -> Result:
    """``@task(transactional=True)``: the call and the SUCCESSFUL record in one transaction
    on our database, the record fenced by the claim's token (and lease where the engine
    checks it); a raise, a lost claim or a crash rolls the task's writes back."""
    using = conf.get().DATABASE
    try:
        with transaction.atomic(using=using):
            value = _json_value(task, _call(task, result, row.args, row.kwargs))
            finished = timezone.now()
            with recording("its return value"):
                if not taskstore.succeed(c, value, at=finished):
                    raise _NotRecorded
    except _NotRecorded:
        return _result(c, LOST, started, LOST_WHY + "; its writes were rolled back")
    except Snooze as exc:
        return _snoozed(task, c, row.snoozes, exc, started)
    except (OperationalError, InterfaceError) as exc:
        if errors.gone(exc, using, raw) or errors.transient(exc, using):
            # The connection or the server went away, or a deadlock (MariaDB: its record
            # against the supervisor's lease renewal) rolled the whole transaction back:
            # not the task's fault; it goes back and runs again, as a row unit's does.
            raise
        return _failed(task, c, exc, started)
    except BaseException as exc:
        if engine(using).session_lost(exc) or errors.gone(exc, using):
            raise  # not the task's fault: the child opens a new session; the task goes back
        if isinstance(exc, KeyboardInterrupt) and in_caller():
            raise  # the caller's Ctrl-C, not the task's failure (units.running)
        return _failed(task, c, exc, started)
    _callback(task, "on_success", c, value)
    _finished_signal(task, c, result=_succeeded(result, value, finished, unit))
    return _result(c, SUCCESSFUL, started, ran=time.monotonic() - started)


def _unrunnable(c: TaskClaim, info: FailureInfo, started: float) -> Result:
    """The task cannot even start (its function or its row is wrong): FAILED, no retry."""
    with recording("the reason it cannot run"):
        changed = _retried(lambda: taskstore.fail_attempt(c, info, retry_at=None, live=True))
    return _result(c, FAILED if changed else LOST, started, info.message,
                   level=logging.ERROR)


def _call(task: Any, result: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    if aio.bound():  # an async unit: its coroutine runs on the child's loop (units/aio)
        if task.takes_context:
            return aio.resolve(task.func(TaskContext(task_result=result), *args, **kwargs))
        return aio.resolve(task.func(*args, **kwargs))
    if task.takes_context:
        return task.call(TaskContext(task_result=result), *args, **kwargs)
    return task.call(*args, **kwargs)


def _json_value(task: Any, value: Any) -> Any:
    """The task's return value as stored, or the error its failure records: a type JSON
    cannot hold is Django's own ``TypeError`` ("Unsupported type: ...", as its
    ImmediateBackend records it), with what to do added; a float JSON refuses (NaN,
    infinity), a NUL or too many bytes our ``InvalidTaskArguments``."""
    try:
        value = normalize_json(value)
    except TypeError as exc:
        raise TypeError(
            f"{exc}; task {task.name!r} returned a value that cannot be stored as JSON: "
            "return dicts, lists, strings, numbers, booleans or None."
        ) from None
    try:
        encoded = json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidTaskArguments(
            f"task {task.name!r} returned a value that cannot be stored as JSON ({exc})."
        ) from None
    if "\\u0000" in encoded and (where := _nul_in(value, "")) is not None:
        raise InvalidTaskArguments(
            f"task {task.name!r} returned a value that contains a NUL character (U+0000) "
            f"at {where or 'the top level'}, which PostgreSQL cannot store; strip it "
            "(value.replace('\\x00', '')) before returning, or encode binary data "
            "(base64)."
        )
    limit = conf.get().RESULT_MAX_BYTES
    if len(encoded) > limit:
        raise InvalidTaskArguments(
            f"task {task.name!r} returned {len(encoded)} bytes of JSON, more than "
            f"DBWORKER['RESULT_MAX_BYTES'] ({limit}); store large results elsewhere."
        )
    return value


def _nul_in(value: Any, path: str) -> str | None:
    """Where ``value`` (normalised JSON) holds a NUL in a string or a key, or None."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}[{str(key).replace(chr(0), chr(92) + 'x00')!r}]"
            if "\x00" in str(key):
                return here + " (a key)"
            if (found := _nul_in(item, here)) is not None:
                return found
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            if (found := _nul_in(item, f"{path}[{i}]")) is not None:
                return found
    return None


def _failed(task: Any, c: TaskClaim, exc: BaseException, started: float) -> Result:
    _reset_connection()
    if aio.is_cancel(exc):  # cancelled on its child's loop (units/aio.py)
        info = FailureInfo.caught(exc)
        with recording("its cancel"):
            stopped = record_stopped(c.task_path, c, info, status=TaskStatus.CANCELLED)
        return _result(c, FAILED if stopped else LOST, started, info.message,
                       level=logging.WARNING)
    info = FailureInfo.caught(exc)
    retry_at = None
    if isinstance(task, DBWorkerTask) and retry.should_retry(task, c.attempt, exc):
        retry_at = retry.at(timezone.now(), retry.delay(task, c.attempt))
    with recording("its failure"):
        recorded = _retried(
            lambda: taskstore.fail_attempt(c, info, retry_at=retry_at, live=True))
    if not recorded:
        return _result(c, LOST, started, LOST_WHY)
    message = f"{info.exception_class}: {info.message}"
    if retry_at is not None:
        return _result(c, RETRYING, started, message, retry_at=retry_at.isoformat())
    _callback(task, "on_failure", c, exc)
    _finished_signal(task, c)
    return _result(c, FAILED, started, message, level=logging.ERROR)


def _snoozed(task: Any, c: TaskClaim, snoozed: int, exc: Snooze, started: float) -> Result:
    """The task raised ``Snooze``: READY again after its delay, no attempt used; beyond
    its ``max_snoozes`` a failed attempt; CANCELLED if a cancel was asked for meanwhile."""
    over = snooze.limit_exceeded(task, c, snoozed)
    if over is not None:
        over.__cause__ = exc  # its traceback shows where the task snoozed
        return _failed(task, c, over, started)
    _reset_connection()
    with recording("its snooze"):
        changed = _retried(lambda: snooze.record(c, exc.seconds))
    if changed:
        return _result(c, SNOOZED, started, seconds_later=round(exc.seconds, 3))
    if snooze.cancel_requested(c):
        info = FailureInfo("django_dbworker.exceptions.TaskCancelled",
                           "the task was cancelled while it ran; it snoozed, so it stops")
        if record_stopped(c.task_path, c, info, status=TaskStatus.CANCELLED).changed:
            return _result(c, FAILED, started, info.message, level=logging.WARNING)
    return _result(c, LOST, started, LOST_WHY)


@dataclass(frozen=True, slots=True)
class Stopped:
    """What ``record_stopped`` recorded: rows changed (0: the claim was lost), and whether
    a retry comes."""

    changed: int
    retrying: bool


def record_stopped(task_path: str, c: TaskClaim, info: FailureInfo, *,
                   status: TaskStatus) -> Stopped:
    """The supervisor stopped the task's process (timeout or cancel): record it (a timeout
    its ``retry_for`` takes is retried)."""
    try:
        task = task_registry.resolve(task_path)
    except UnknownTask:
        task = None
    retry_at = None
    if (status == TaskStatus.FAILED and isinstance(task, DBWorkerTask)
            and c.attempt <= task.retries and _matches(task, info.exception_class)):
        retry_at = retry.at(timezone.now(), retry.delay(task, c.attempt))
    changed = _retried(lambda: taskstore.fail_attempt(c, info, retry_at=retry_at, status=status))
    if changed and retry_at is None and task is not None:
        _callback(task, "on_failure", c, None)
        _finished_signal(task, c)
    return Stopped(changed, bool(changed) and retry_at is not None)


def _retried(record: Callable[[], int]) -> int:
    """``record()`` (a status change fenced by the claim's token: safe to run again), again
    after a deadlock or a lock wait timeout that the engine calls transient (MariaDB and
    MySQL: ``db.mysql.RETRYABLE``; the server rolled it back), up to ``RECORD_TRIES``
    times; not inside a caller's transaction, which the deadlock ended too."""
    using = conf.get().DATABASE
    for attempt in range(1, RECORD_TRIES + 1):
        try:
            return record()
        except OperationalError as exc:
            if (attempt == RECORD_TRIES or not engine(using).transient(exc)
                    or connections[using].in_atomic_block):
                raise
            time.sleep(0.005 * attempt)
    raise AssertionError("unreachable")


def _matches(task: DBWorkerTask, exception_class: str) -> bool:
    try:
        kind = import_string(exception_class)
    except ImportError:
        return False
    return any(issubclass(kind, allowed) for allowed in task.retry_for)


def _callback(task: Any, name: str, c: TaskClaim, value: Any) -> None:
    callback = getattr(task, name, None)
    if callback is None:
        return
    try:
        if isinstance(callback, str):
            callback = import_string(callback)
        record = taskstore.get(c.task_id)
        if record is None:  # deleted meanwhile
            raise TaskResultDoesNotExist(str(c.task_id))
        callback(to_result(record, task.backend, task), value)
    except Exception as exc:
        log_event(logging.ERROR, "callback_failed", task=c.task_path, id=c.task_id,
                  callback=name, error=f"{type(exc).__name__}: {safe_message(exc)}")


def _succeeded(running: Any, value: Any, finished: Any, unit: progress.Unit) -> Any:
    """The task's result as ``succeed`` left its row, made from its result while it ran
    (not read again, not built again): nothing else writes a RUNNING row but this process
    (its progress through ``set_progress``, noted in ``unit``)."""
    done = copy.copy(running)
    put = object.__setattr__
    put(done, "status", TaskResultStatus.SUCCESSFUL)
    put(done, "dbworker_status", TaskStatus.SUCCESSFUL)
    put(done, "finished_at", finished)
    put(done, "_return_value", value)
    if unit.percent is not None:
        put(done, "progress", unit.percent)
        put(done, "progress_message", unit.message)
    return done


def _finished_signal(task: Any, c: TaskClaim, row: Any = None, result: Any = None) -> None:
    """Send ``task_finished`` with the task's final result (``result``; else made from
    ``row``, as stored; else from the row read now)."""
    if result is None:
        if row is None:
            row = taskstore.get(c.task_id)
        if row is None:
            return
        result = to_result(row, task.backend, task)
    if result.status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED):
        task_finished.send(type(task.get_backend()), task_result=result)


def _raw_connection() -> Any:
    """The DB-API connection the task starts on (opened now if none is)."""
    connection = connections[conf.get().DATABASE]
    connection.ensure_connection()
    return connection.connection


def _reset_connection() -> None:
    """After a task failed, make sure the connection is usable for recording it."""
    connection = connections[conf.get().DATABASE]
    if connection.in_atomic_block:
        return
    if connection.connection is not None and not connected(conf.get().DATABASE):
        connection.close()


def _result(c: TaskClaim, outcome: RunOutcome, started: float, error: str = "",
            level: int = logging.INFO, ran: float | None = None, **extra: Any) -> Result:
    """Log the outcome and say it; ``ran``: seconds the task ran, if it is not ``started``
    until now (a success recorded later with others)."""
    seconds = time.monotonic() - started if ran is None else ran
    if outcome == LOST:
        level = logging.WARNING
    log_event(level, outcome, task=c.task_path, id=c.task_id, attempt=c.attempt,
              seconds=round(seconds, 4), error=error, **extra)
    return Result(c.unit_id, c.task_path, outcome, seconds, error)
