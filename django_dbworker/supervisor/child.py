"""A child process: receives units over a pipe, runs them, reports the results."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import resource
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from django.db import DatabaseError, connections

from .. import conf
from ..db import errors
from ..db.connections import connected, opened_at, own_process
from ..logs import log_event
from ..outcomes import RunOutcome
from ..tasks.completions import Completions, Kept
from ..units import aio
from ..units.failures import class_path, safe_message
from . import trace, units
from .handoff import Handoff

PR_SET_PDEATHSIG = 1
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill us when the supervisor dies, so no orphan keeps running units."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def resident_mb() -> float | None:
    """This process's resident memory now (not its peak), in MiB; None where unknown."""
    try:
        with open("/proc/self/statm", "rb") as f:
            pages = int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * _PAGE / (1024 * 1024)


def _over_memory(limit_mb: int | None) -> bool:
    """Above DBWORKER['CHILD_MAX_MEMORY_MB'] after a unit: the child retires (logged)."""
    if limit_mb is None:
        return False
    # The peak (one getrusage, ~1 us) bounds the current resident memory from above: only
    # past the limit is /proc read (an open and a read cost 5-25 us, per unit).
    if resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 <= limit_mb:
        return False
    rss = resident_mb()
    if rss is None or rss <= limit_mb:
        return False
    log_event(logging.WARNING, "child_memory_limit", child=os.getpid(), rss_mb=round(rss, 1),
              setting=f"DBWORKER['CHILD_MAX_MEMORY_MB']={limit_mb}",
              action="replaced once its units are reported")
    return True


def _raw_connection(using: str) -> Any:
    """The DB-API connection a unit starts on, opened now if none is (after a lost
    session the child closes its connection). Comparing with it is how ``contain`` tells
    a lost session from the unit's own error: leaving a handler's ``atomic()`` after the
    server ended the session makes Django open a new connection at once, which answers."""
    connection = connections[using]
    connection.ensure_connection()
    return connection.connection


def _connect_early(using: str) -> None:
    """Open the connection now, while the supervisor starts and makes its first claim, not
    on the first unit's path (a new connection costs several round trips: with the
    database a few milliseconds away, tens of milliseconds). Where the database cannot be
    reached now, the first unit opens it as ever (and an outage is handled there)."""
    try:
        connections[using].ensure_connection()
    except DatabaseError:
        with contextlib.suppress(DatabaseError):
            connections[using].close()


def run_one(seq: int, claim: units.Unit, using: str, report: list[tuple[Any, ...]],
            keep: Callable[[Kept], None] | None = None, then: units.Unit | None = None,
            ) -> None:
    """Run one unit and add what to report of it to ``report``; never raises for anything
    the unit does (``contain``). ``then``: the unit to run right after it (``units.run``)."""
    started = time.monotonic()
    raw = since = None
    try:
        raw = _raw_connection(using)
        since = opened_at(using)
        result = units.run(claim, keep, then)
        if result is not None:
            report.append((seq, "result", result))
    except Exception as exc:  # nothing a unit does kills its child
        contain(seq, claim, exc, raw, started, using, report, since)


def contain(seq: int, claim: units.Unit, exc: Exception, raw: Any, started: float,
            using: str, report: list[tuple[Any, ...]], since: float | None = None) -> None:
    """``exc`` escaped the unit (running it, or recording it: its completion, a batch of
    completions, its failure). What the database error says decides, never which call saw
    it (``db.errors.classify``): only a value the database refused on a session still
    there is the unit's fault and becomes its FAILED record, here and now; if even that
    cannot be recorded, the supervisor releases it as a crash (MAX_CRASHES ends it).

    A connection or server that went away gives the unit back, never FAILED: reported as
    ``session_ended`` when the database answers a new connection at once (``since``: when
    the session that ended began, ``opened_at``; None: unknown, never counted), else as an
    outage (``db_error``, nothing counted). The supervisor counts a ``session_ended`` as a crash
    only if its own session lived through it: a handler that ends its own session each
    time (it kills its own connection, say) is ended by MAX_CRASHES instead of looping,
    while a restart or a failover, which ends every session, counts nothing. A session
    that lost only something of ours, or a transient error, goes back uncounted; the
    server's own trouble (disk full, read-only, a statement timeout) as a crash."""
    units.let_go()
    if isinstance(exc, DatabaseError):
        why = errors.classify(exc, using, raw)
        if why != errors.VALUE:
            connections[using].close()
            described = str(units.describe(claim))
            if why == errors.SERVER:
                report.append((seq, "db_trouble", described, safe_message(exc),
                               class_path(exc)))
            elif why == errors.GONE and _answers(using):
                report.append((seq, "session_ended", described, safe_message(exc),
                               0.0 if since is None else since))
            else:
                report.append((seq, "db_error", described, safe_message(exc)))
            return
    info = units.fallback(claim, exc)
    log_event(logging.ERROR, "unit_error", **units.describe(claim), child=os.getpid(),
              error=f"{info.exception_class}: {info.message}"[:1000])
    try:
        recorded = units.fail(claim, info)
    except Exception as again:
        lost = isinstance(again, DatabaseError) and errors.classify(
            again, using, None) != errors.VALUE
        connections[using].close()
        if lost:
            report.append((seq, "db_error", str(units.describe(claim)),
                           safe_message(again)))
        else:
            report.append((seq, "unrecordable", info, safe_message(again)))
        return
    outcome = RunOutcome.FAILED if recorded else RunOutcome.LEASE_LOST
    report.append((seq, "result", claim.result(
        outcome, time.monotonic() - started, f"{info.exception_class}: {info.message}")))


def _answers(using: str) -> bool:
    """Whether the database answers a new connection now (left open for the next unit)."""
    try:
        connections[using].ensure_connection()
        if connected(using):
            return True
    except DatabaseError:
        pass
    connections[using].close()
    return False


def main(pipe: Connection, using: str, max_tasks: int | None, parent_pid: int,
         handoff: Handoff) -> None:
    """Run the units the supervisor sends, in order; report them back a batch at a time.

    A batch is reported when it is through: the supervisor tops up a child from its
    reports, so the next batch is usually in the pipe already. Successful tasks of a batch
    are recorded together (``completions``), by a thread while the child goes on: it
    tells the supervisor how far it ran (``("ran", seq)``: room for the next batch) and
    reports those tasks once their record is back.

    Async units (``aio.concurrent``) start in their turn too, but run beside each other on
    the child's event loop, up to ``handoff.slots`` at once, each reported as it is
    through; a unit of any other kind waits until none runs, and runs alone."""
    signal.set_wakeup_fd(-1)
    # The supervisor decides when we stop; a terminal's Ctrl-C or a group SIGTERM does not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    own_process(using, runs_units=True)
    if trace.ON:
        trace.statements(using)
    _connect_early(using)
    completions = Completions(using)
    memory_mb = conf.get().CHILD_MAX_MEMORY_MB
    report: list[tuple[Any, ...]] = []
    waiting: deque[tuple[int, units.Unit]] = deque()
    beside = aio.AsyncUnits(handoff.slots, lambda: own_process(using, runs_units=True),
                            lambda seq, claim, lines: run_one(seq, claim, using, lines))
    done = 0
    retiring = stopping = False
    #: The last unit run to its end here: every unit numbered below it ended too (async
    #: units run beside each other, never beside another kind). -1: none yet.
    last_ran = -1
    told = -1  # the last ``last_ran`` the supervisor was told of (``("ran", seq)``)
    low_water = 0  # half the last batch: the supervisor hears from us when that is left
    #: A batch was taken from the pipe before the one running was through (``then``): the
    #: units through are reported at once, not when no unit waits.
    pulled = False

    def keep(seq: int) -> Callable[[Kept], None]:
        def add(kept: Kept) -> None:
            kept.tag = seq
            completions.add(kept)
        return add

    def flush() -> None:
        units.let_go()  # before any other statement, and before the child waits or exits
        since = opened_at(using)  # the session the records go through (``contain``)
        deliver(completions.flush(), since)

    def deliver(outcomes: Sequence[tuple[Kept, bool | Exception]],
                since: float | None = None) -> None:
        """What follows the records of kept tasks: their ``after`` (signals, callbacks,
        the log line), and their lines in the next report. ``since``: when the session
        their records went through began."""
        if outcomes:
            units.let_go()  # before any other statement (``rows.chain``)
        for kept, outcome in outcomes:
            if isinstance(outcome, Exception):
                contain(kept.tag, kept.claim, outcome, None, time.monotonic(), using, report,
                        since)
                continue
            try:
                report.append((kept.tag, "result", kept.after(outcome)))
            except Exception as exc:  # what follows a record (a signal's receiver)
                log_event(logging.ERROR, "after_record_failed", **units.describe(kept.claim),
                          error=f"{type(exc).__name__}: {safe_message(exc)}"[:1000])
                report.append((kept.tag, "result", kept.claim.result(
                    RunOutcome.SUCCESSFUL if outcome else RunOutcome.LEASE_LOST, 0.0)))

    def receive(message: Any) -> None:
        """One message of the supervisor's: units to run, a cancel, or None (stop)."""
        nonlocal stopping, low_water
        if trace.ON:
            trace.mark("received", len(message) if message else message)
        if message is None:
            stopping = True  # after the async units that run
        elif isinstance(message, tuple):  # ("cancel", seq): an async task's cancel
            beside.cancel(message[1])
        else:
            waiting.extend(message)
            low_water = len(message) // 2

    def then(now: units.Unit) -> units.Unit | None:
        """The unit to run right after ``now``, which starts now (``_then``). When none
        waits, the supervisor's next batch is usually in the pipe already (it sends one
        while the child runs another): taken now, its first unit can begin with the
        completion of ``now``, a row unit (``rows.chain``). Not after a task, nor while
        task completions wait: those are recorded when the child is through its units."""
        nonlocal pulled
        if (not waiting and not (retiring or stopping) and units.begins_next(now)
                and not len(completions) and not completions.behind):
            try:
                if pipe.poll():
                    receive(pipe.recv())
                    pulled = True
            except (EOFError, OSError):
                return None
        return _then(waiting, beside, completions)

    def report_pulled() -> None:
        """After a batch taken early (``then``), report what is through now, as the child
        would once no unit waits: the supervisor tops its children up from their reports."""
        nonlocal pulled
        if pulled and report and not retiring and not len(completions):
            pipe.send(("report", report, False))
            report.clear()
            pulled = False

    def ran_one() -> bool:
        """Count a unit through; True when the child retires now."""
        nonlocal done
        done += 1
        return bool(max_tasks and done >= max_tasks) or _over_memory(memory_mb)

    def start_next() -> bool:
        """Start the next waiting unit if it may start now; False if it must wait."""
        nonlocal retiring, last_ran, told
        seq, claim = waiting[0]
        if beside.slots > 1 and aio.concurrent(claim):
            if not beside.free():
                return False
            waiting.popleft()
            if handoff.start(seq):
                beside.start(seq, claim)
            return True
        if beside.running:
            return False  # it runs alone, after the async units
        waiting.popleft()
        if not handoff.start(seq):
            units.let_go()  # what its last unit's completion began for it, if anything
            return True  # taken back: it runs elsewhere, or later
        # Many kept: recorded behind (the thread) while this batch goes on; the main
        # thread records itself if the thread still writes the last ones (or failed).
        if completions.due() and (completions.behind or not completions.record_behind()):
            flush()
        completions.started()
        if trace.ON:
            trace.mark("run", seq)
        run_one(seq, claim, using, report, keep(seq), then(claim))
        completions.finished()
        handoff.finish(seq)
        last_ran = seq
        retiring = ran_one() or retiring
        if completions.has_recorded:  # a record behind came back: what follows it
            deliver(completions.recorded())
        if low_water and len(waiting) == low_water:
            # Half the last batch left: what is done goes back now, and how far we ran
            # (records on their way), so that the next batch is here before we run out.
            if report:
                pipe.send(("report", report, False))
                report.clear()
            if completions.behind and last_ran > told:
                pipe.send(("ran", last_ran))
                told = last_ran
        report_pulled()
        return True

    try:
        while True:
            while waiting and not (retiring or stopping) and start_next():
                pass
            for seq, lines in beside.finished():
                report.extend(lines)
                handoff.finish(seq)
                retiring = ran_one() or retiring
            if (retiring or stopping) and not beside.running:
                flush()
                if retiring:
                    # One message: the supervisor must learn we retire before it sees us
                    # idle.
                    pipe.send(("report", report, True))
                elif report:
                    pipe.send(("report", report, False))
                return
            deliver(completions.recorded())  # what the thread recorded meanwhile
            if waiting and not (retiring or stopping) and not _blocked(waiting[0], beside):
                if report:  # recorded behind: the supervisor forgets them, and tops us up
                    pipe.send(("report", report, False))
                    report = []
                continue
            # Through with what we hold: the successes kept are recorded behind while the
            # supervisor sends more and we run it (with the database far away, waiting
            # for that round trip cost as much as the batch); the supervisor is told we
            # have room.
            if not completions.record_behind() and not completions.behind:
                flush()
            if report:
                pipe.send(("report", report, False))
                report = []
            if completions.behind and last_ran > told:
                pipe.send(("ran", last_ran))
                told = last_ran
            handles: list[Any] = [beside.fileno()] if beside.running else []
            # Always: a record the thread ended since we looked (behind may be over by
            # now) left a byte there, so what it recorded is never left waiting.
            handles.append(completions.fileno())
            if not (retiring or stopping):
                handles.append(pipe)
            ready = wait(handles) if handles else []
            if completions.failed_behind:
                flush()  # the thread could not record: here, with errors contained
            if pipe not in ready:
                continue
            try:
                batch = pipe.recv()
            except (EOFError, OSError):
                return
            receive(batch)
    finally:
        units.let_go()
        completions.close()
        beside.close()
        connections.close_all()


def _then(waiting: deque[tuple[int, units.Unit]], beside: aio.AsyncUnits,
          completions: Completions) -> units.Unit | None:
    """The unit the child runs right after the one it starts now, with nothing in between
    (no task completions to record first, no async unit to start or wait for): its
    transaction may begin with this one's completion (``units.run``); None if unknown."""
    if (not waiting or len(completions) or completions.behind or completions.has_recorded
            or beside.running):
        return None
    then = waiting[0][1]
    return None if beside.slots > 1 and aio.concurrent(then) else then


def _blocked(claim: tuple[int, units.Unit], beside: aio.AsyncUnits) -> bool:
    """Whether the next waiting unit must wait for a running async unit to finish."""
    if beside.slots > 1 and aio.concurrent(claim[1]):
        return not beside.free()
    return bool(beside.running)
