"""Async units in a child: one event loop per child, up to ``ASYNC_CONCURRENCY`` at once.

A unit is *concurrent* when its handler is a coroutine function and it holds no
transaction around it: an ``async def`` task without ``transactional=True``, an
``async def`` row handler declared ``transactional=False`` (``concurrent``). Everything
else runs as it always did, one unit at a time in the child's main thread (an ``async
def`` there is run to completion by ``async_to_sync``: a transactional handler's
``sync_to_async`` ORM calls come back to the thread that holds its transaction).

A child that gets a concurrent unit starts, once, an event loop in a thread of its own and
a pool of ``ASYNC_CONCURRENCY`` threads (``AsyncUnits``). Each concurrent unit runs the
same code as a unit of the main thread (``child.run_one``: read the row, call, record,
signals), in a thread of the pool with that thread's own database connection (Django's
connections are per thread), except that the handler's coroutine is awaited on the shared
loop (``resolve``): the units' waits overlap, their database statements do not share a
connection. The coroutine sees the unit's context variables (``set_progress``).

A concurrent unit that runs past its timeout (``@task(timeout=...)``,
``@worker(timeout=...)``) is cancelled on the loop and fails with ``TaskTimeout`` /
``HandlerTimeout`` as if its process had been stopped (retried where its policy retries
timeouts); the units beside it go on. A coroutine that blocks the loop cannot be
cancelled: the supervisor stops the child ``STOP_GRACE`` seconds after the timeout, as it
does a sync unit's at the timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import os
import queue
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

from asgiref.sync import async_to_sync, sync_to_async

from .. import conf
from ..exceptions import HandlerTimeout, TaskCancelled, TaskTimeout

#: Seconds past its timeout after which the supervisor stops the child of a concurrent
#: unit that was not cancelled on the loop (its coroutine blocks the loop).
STOP_GRACE = 5.0

_concurrent: dict[str, bool] = {}


def concurrent(c: Any) -> bool:
    """Whether unit ``c`` runs on its child's event loop, beside others: an ``async def``
    task (not ``transactional=True``) or row handler (``transactional=False``)."""
    if conf.get().ASYNC_CONCURRENCY <= 1:
        return False
    group = c.group
    known = _concurrent.get(group)
    if known is None:
        known = _concurrent[group] = c.concurrent()
    return known


def beside_others(worker: Any) -> bool:
    """Whether the units of row worker ``worker`` run beside each other (``concurrent``)."""
    return (conf.get().ASYNC_CONCURRENCY > 1 and not worker.transactional
            and inspect.iscoroutinefunction(worker.handler))


def room_beside(ch: Any) -> int:
    """How many more async units child ``ch`` may be sent now: while every unit it holds
    is concurrent, up to its slots (``ASYNC_CONCURRENCY``) of them. The supervisor sends
    an idle child its units as usual; a child that got concurrent ones is topped up."""
    slots = ch.handoff.slots
    if (slots <= 1 or not ch.sent or ch.retiring or ch.stopping
            or ch.process.exitcode is not None):
        return 0
    if not all(concurrent(c) for c in ch.sent.values()):
        return 0
    return max(0, slots - len(ch.sent))


def admit(caps: Callable[[Any], bool] | None) -> Callable[[Any], bool]:
    """For ``Prefetch.take``: concurrent units that ``caps`` admits (None: any), up to the
    first unit that is not concurrent: it is not overtaken (it goes to a child once that
    child's async units are through, or to another child), so async units arriving
    without end cannot starve it."""
    behind = False

    def allowed(c: Any) -> bool:
        nonlocal behind
        if behind or not concurrent(c):
            behind = True
            return False
        return caps is None or caps(c)

    return allowed


@dataclass(frozen=True, slots=True)
class Binding:
    """What a thread of the pool runs its unit's coroutine with."""

    loop: asyncio.AbstractEventLoop
    timeout: float | None
    what: str
    #: The unit's number in its child, and the child's coroutines by number (the loop's
    #: thread only), for ``AsyncUnits.cancel``.
    seq: int = -1
    tasks: dict[int, asyncio.Task[Any]] | None = None
    #: Numbers of the units whose cancel the supervisor asked for.
    cancelled: set[int] | None = None


_local = threading.local()


def resolve(value: Any) -> Any:
    """``value``, or what it gives once awaited if it is awaitable (a handler's or a
    task's coroutine): on the child's loop for a concurrent unit, else to completion here
    (``async_to_sync``)."""
    if not inspect.isawaitable(value):
        return value
    binding: Binding | None = getattr(_local, "binding", None)
    if binding is None:
        return async_to_sync(_awaited)(value)
    return _on_loop(binding, value)


def bound() -> bool:
    """Whether this thread runs a concurrent unit (its coroutine goes to the loop)."""
    return getattr(_local, "binding", None) is not None


async def _awaited(value: Any) -> Any:
    return await value


def _heal() -> None:
    """In the thread where async code's ORM calls run (asgiref's, shared by the child's
    units): close a connection that an error left unusable (a restarted server, a lost
    session), as Django does between requests, so that the next call reconnects. A round
    trip only after an error on it."""
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        if connection.connection is None or not connection.errors_occurred:
            continue
        if connection.in_atomic_block or connection.is_usable():
            connection.errors_occurred = False
        else:
            connection.close()


async def _bounded(value: Any, binding: Binding) -> Any:
    try:
        await sync_to_async(_heal)()
        return await _timed(value, binding)
    except asyncio.CancelledError:
        if binding.cancelled is None or binding.seq not in binding.cancelled:
            raise
    raise cancelled_error()


def cancelled_error() -> TaskCancelled:
    """What a task cancelled on its child's loop raises (``is_cancel`` tells it)."""
    error = TaskCancelled("the task was cancelled while it ran; its coroutine was "
                          "cancelled")
    error.dbworker_cancel = True  # type: ignore[attr-defined]
    return error


def is_cancel(exc: BaseException) -> bool:
    """Whether ``exc`` ended a task that was cancelled on its child's loop."""
    return getattr(exc, "dbworker_cancel", False) is True


async def _timed(value: Any, binding: Binding) -> Any:
    if binding.timeout is None:
        return await value
    try:
        async with asyncio.timeout(binding.timeout) as within:
            return await value
    except TimeoutError:
        if not within.expired():
            raise  # the coroutine's own TimeoutError
    error = TaskTimeout if binding.what == "task" else HandlerTimeout
    raise error(f"the {binding.what} ran longer than its timeout of {binding.timeout:g}s "
                "and was cancelled")


def _on_loop(binding: Binding, value: Any) -> Any:
    """Await ``value`` on the loop, in this thread's context variables; wait here."""
    done: futures.Future[Any] = futures.Future()

    def start() -> None:
        task = binding.loop.create_task(_bounded(value, binding))
        task.add_done_callback(lambda t: _settle(t, done, binding))
        if binding.tasks is not None:
            binding.tasks[binding.seq] = task
            task.add_done_callback(lambda t: binding.tasks.pop(  # type: ignore[union-attr]
                binding.seq, None))
        if binding.cancelled is not None and binding.seq in binding.cancelled:
            task.cancel()  # its cancel came while it read its row

    binding.loop.call_soon_threadsafe(start, context=contextvars.copy_context())
    return done.result()


def _settle(task: asyncio.Task[Any], done: futures.Future[Any], binding: Binding) -> None:
    if task.cancelled():  # before its coroutine began, or it would not be cancelled
        asked = binding.cancelled is not None and binding.seq in binding.cancelled
        done.set_exception(cancelled_error() if asked else asyncio.CancelledError(
            "the unit's coroutine was cancelled"))
    elif (exc := task.exception()) is not None:
        done.set_exception(exc)
    else:
        done.set_result(task.result())


type Run = Callable[[int, Any, list[tuple[Any, ...]]], None]


class AsyncUnits:
    """A child's concurrent units: the loop, the threads, what finished.

    The child's main thread starts units (``start``) and waits on ``fileno()`` beside its
    pipe; ``finished()`` gives it the reports of the units that are through, to send from
    the main thread (the only one that writes to the pipe)."""

    def __init__(self, slots: int, setup: Callable[[], None], run: Run) -> None:
        self.slots = slots
        self._setup = setup
        self._run = run
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pool: futures.ThreadPoolExecutor | None = None
        self._done: queue.SimpleQueue[tuple[int, list[tuple[Any, ...]]]] = queue.SimpleQueue()
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        #: Numbers of the units running now.
        self.running: set[int] = set()
        self._tasks: dict[int, asyncio.Task[Any]] = {}
        self._cancelled: set[int] = set()

    def fileno(self) -> int:
        """Readable once a unit finished."""
        return self._read

    def free(self) -> int:
        return self.slots - len(self.running)

    def start(self, seq: int, claim: Any) -> None:
        """Run ``claim`` beside the others (a slot must be free)."""
        if self._pool is None:
            self._begin()
        assert self._pool is not None and self._loop is not None
        self.running.add(seq)
        timeout, what = claim.timeout()
        self._pool.submit(self._unit, Binding(self._loop, timeout, what, seq, self._tasks,
                                              self._cancelled), seq, claim)

    def cancel(self, seq: int) -> None:
        """The supervisor asks to cancel unit ``seq`` (a task whose cancel was asked
        for): its coroutine is cancelled and it ends CANCELLED (``tasks.runner``); nothing
        if it is through already."""
        loop = self._loop
        if loop is None or seq not in self.running:
            return

        def cancel() -> None:  # on the loop; if its coroutine has not started, at its start
            self._cancelled.add(seq)
            task = self._tasks.get(seq)
            if task is not None:
                task.cancel()

        loop.call_soon_threadsafe(cancel)

    def _begin(self) -> None:
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="dbworker-loop", daemon=True).start()
        self._loop = loop
        self._pool = futures.ThreadPoolExecutor(
            self.slots, thread_name_prefix="dbworker-async", initializer=self._setup)

    def _unit(self, binding: Binding, seq: int, claim: Any) -> None:
        report: list[tuple[Any, ...]] = []
        _local.binding = binding
        try:
            self._run(seq, claim, report)
        finally:
            _local.binding = None
            self._done.put((seq, report))
            os.write(self._write, b".")

    def finished(self) -> list[tuple[int, list[tuple[Any, ...]]]]:
        """The units through since the last call, each with what to report of it."""
        try:
            while os.read(self._read, 4096):
                pass
        except BlockingIOError:
            pass  # nothing (more) to read
        through = []
        while True:
            try:
                seq, report = self._done.get_nowait()
            except queue.Empty:
                break
            self.running.discard(seq)
            self._cancelled.discard(seq)
            through.append((seq, report))
        return through

    def close(self) -> None:
        """After the units are through: close the threads' connections, stop the loop."""
        if self._pool is not None:
            from django.db import connections

            # One job per thread (each waits for the others): every thread closes its own.
            barrier = threading.Barrier(self.slots)

            def close_own() -> None:
                connections.close_all()
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=5)

            for _ in range(self.slots):
                self._pool.submit(close_own)
            self._pool.shutdown(wait=True)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        os.close(self._read)
        os.close(self._write)

