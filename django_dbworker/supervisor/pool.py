"""The children of one supervisor and what each is running."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import multiprocessing
import multiprocessing.process
import os
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from django.db import connections

from .. import conf
from . import child
from .handoff import Handoff
from .units import Unit

_fork = multiprocessing.get_context("fork")
#: Whether ``start`` has frozen this process's heap (``gc.freeze()``). Not
#: ``gc.get_freeze_count()``: on Python 3.12 it is not 0 when nothing was frozen, since
#: every collection (one runs at startup) moves the immortal objects it meets (the
#: ``__bases__`` and ``__mro__`` tuples of the builtin types, some 375) to the permanent
#: generation that ``gc.freeze()`` fills; "frozen already" was always true there and the
#: heap was never frozen. On 3.13 the count stays 0 until ``gc.freeze()``.
_frozen = False
PR_SET_CHILD_SUBREAPER = 36
#: Seconds the processes a task left behind get after SIGTERM at stop, before SIGKILL.
ORPHAN_GRACE = 1.0


def describe_exit(code: int | None) -> str:
    if code is None:
        return "it stopped answering"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"it was killed by {name}"
    return f"it exited with status {code}"


@dataclass
class Child:
    slot: int
    process: BaseProcess
    pipe: Connection
    handoff: Handoff
    started: float = field(default_factory=time.monotonic)
    #: Units sent and not reported back yet, by number, oldest first.
    sent: dict[int, Unit] = field(default_factory=dict)
    #: The number the next unit sent gets.
    next_seq: int = 0
    retiring: bool = False
    stopping: bool = False
    #: Async units (``aio``) asked to cancel on the child's loop: when, by number.
    cancelling: dict[int, float] = field(default_factory=dict)
    #: The last unit it said it ran to its end (``("ran", seq)``) before reporting it:
    #: its record (and those of the units before it) is on its way. -1: none.
    ran_upto: int = -1

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def dispatch(self, batch: list[Unit]) -> None:
        """Send units to run in this order, after those it has (one message)."""
        numbered = [(self.next_seq + i, c) for i, c in enumerate(batch)]
        self.pipe.send(numbered)
        self.next_seq += len(numbered)
        self.sent.update(numbered)

    def running(self) -> tuple[Unit, float] | None:
        """The unit it runs now and since when (``time.monotonic()``); None between units."""
        now = self.handoff.running()
        if now is None:
            return None
        seq, since = now
        c = self.sent.get(seq)
        return None if c is None else (c, since)

    def running_all(self) -> list[tuple[Unit, float]]:
        """Every unit it runs now and since when, first started first: one at most, or
        several async units at once (``aio``)."""
        return [(c, since) for seq, since in self.handoff.running_all()
                if (c := self.sent.get(seq)) is not None]

    def cancel(self, c: Unit) -> float | None:
        """Ask it to cancel the async unit ``c`` on its loop (once); returns the seconds
        since it was first asked, None if ``c`` is not one of its units."""
        seq = next((n for n, u in self.sent.items() if u is c), None)
        if seq is None:
            return None
        asked = self.cancelling.get(seq)
        if asked is None:
            asked = self.cancelling[seq] = time.monotonic()
            with contextlib.suppress(OSError):
                self.pipe.send(("cancel", seq))
        return time.monotonic() - asked

    def open(self) -> int:
        """Units sent that it has not run to their end (as far as it said)."""
        upto = self.ran_upto
        return len(self.sent) if upto < 0 else sum(1 for n in self.sent if n > upto)

    def waiting(self) -> list[Unit]:
        """Units sent that it has not started."""
        started = self.handoff.started()
        return [c for number, c in self.sent.items() if number > started]

    def take_back(self) -> list[Unit]:
        """Make sure the units it has not started never start; returns them."""
        if not self.sent or next(reversed(self.sent)) <= self.handoff.started():
            return []
        started = self.handoff.take_back(self.next_seq)
        back = [self.sent.pop(number) for number in list(self.sent) if number > started]
        return back

    def reported(self, seq: int) -> Unit | None:
        """Unit ``seq`` was reported back: forget it; returns it (None: already forgotten)."""
        self.cancelling.pop(seq, None)
        return self.sent.pop(seq, None)

    def forget(self, c: Unit) -> None:
        for number, unit in list(self.sent.items()):
            if unit is c:
                del self.sent[number]

    def settle(self) -> tuple[list[Unit], list[Unit], list[Unit]]:
        """After it exited: the units it died running (one at most, but for async units:
        ``aio``), those it ran without reporting back, and those it never started.
        Everything is forgotten."""
        started = self.handoff.started()
        running = {seq for seq, _ in self.handoff.running_all()}
        died_in: list[Unit] = []
        ran, never = [], []
        for number, c in self.sent.items():
            if number > started:
                never.append(c)
            elif number in running:
                died_in.append(c)
            else:
                ran.append(c)
        self.sent.clear()
        return died_in, ran, never

    def ask_to_stop(self) -> None:
        if not self.stopping:
            self.stopping = True
            with contextlib.suppress(OSError):
                self.pipe.send(None)

    def kill(self) -> None:
        """SIGKILL the child and every process it started (a task's ``Popen``, even in a
        session of its own): they were part of the unit it was running."""
        tree: list[int] = []
        if self.process.pid and self.process.exitcode is None:
            tree = descendants(self.process.pid)
            for pid in [*tree, self.process.pid]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self.process.join(5)
        reap(tree)  # reparented to us (a subreaper) once the child died


# ----- the processes tasks leave behind -----------------------------------------------------
# A task may start a process that outlives its unit (``Popen(..., start_new_session=True)``
# and never waited for). The supervisor is a child subreaper (Linux): such a process, once
# its parent (the child) exits, becomes the supervisor's child instead of init's, so it is
# found and stopped when the supervisor stops (``stop_orphans``), and its exit status is
# collected (``adopt_orphans``) rather than left as a zombie.


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``); False where
    that does not exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (``/proc/PID/task/*/children``)."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for tid in threads:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                found += [int(p) for p in f.read().split()]
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    found: list[int] = []
    todo = children_of(pid)
    while todo:
        p = todo.pop(0)
        if p not in found:
            found.append(p)
            todo += children_of(p)
    return found


def _ours() -> set[int]:
    """Our own multiprocessing children: never reaped or stopped here."""
    return {pid for p in list(multiprocessing.process._children)  # type: ignore[attr-defined]
            if (pid := p.pid) is not None}


def orphans() -> list[int]:
    """Processes reparented to this supervisor (a subreaper), and their descendants."""
    ours = _ours()
    adopted = [p for p in children_of(os.getpid()) if p not in ours]
    return adopted + [d for p in adopted for d in descendants(p)]


def reap(pids: Iterable[int]) -> int:
    """Collect the exit status of those of ``pids`` that are our children and exited."""
    done = 0
    ours = _ours()
    for pid in pids:
        if pid in ours:
            continue
        try:
            done += os.waitpid(pid, os.WNOHANG)[0] != 0
        except ChildProcessError:
            continue
    return done


def _on_sigchld(signum: int, frame: object) -> None:
    reap(children_of(os.getpid()))


_before: list[object] = []


def adopt_orphans() -> bool:
    """Become a subreaper and collect the exit of every process reparented to us as it
    exits (SIGCHLD); children forked by ``start`` put SIGCHLD back to its default.
    ``release_orphans`` undoes it (``call_command("runworkers")`` in a process that goes
    on)."""
    if not become_subreaper():
        return False
    if not _before:
        _before.append(signal.signal(signal.SIGCHLD, _on_sigchld))
    return True


def release_orphans() -> None:
    """No longer a subreaper; SIGCHLD handled as before ``adopt_orphans``."""
    if _before:
        previous = _before.pop()
        signal.signal(signal.SIGCHLD, signal.SIG_DFL if previous is None
                      else previous)  # type: ignore[arg-type]
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)


def stop_orphans(grace: float = ORPHAN_GRACE) -> list[int]:
    """SIGTERM what tasks left behind (``orphans``), SIGKILL what is left after ``grace``
    seconds, and collect them; returns the pids that were stopped."""
    stopped: list[int] = []
    deadline = time.monotonic() + grace
    killing_at = deadline + 2.0
    while (left := orphans()) and time.monotonic() < killing_at:
        hard = time.monotonic() >= deadline
        for pid in left:
            if pid not in stopped or hard:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL if hard else signal.SIGTERM)
            if pid not in stopped:
                stopped.append(pid)
        reap(left)
        time.sleep(0.02)  # polls their exit (no event to wait on), bounded by killing_at
    reap(orphans())
    return stopped


def _child_main(*args: object) -> None:
    """``child.main`` with SIGCHLD as a child expects it: a task's ``subprocess`` must get
    its own exit statuses (the supervisor collects the exits of adopted processes)."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
    child.main(*args)  # type: ignore[arg-type]


def start(slot: int, using: str, max_tasks: int | None) -> Child:
    """Fork a child. Our connections close first: a forked socket must not be shared.

    Before the first fork, what the supervisor holds (Django, its apps, the registry: most
    of the heap) is frozen for the garbage collector (``gc.freeze()``, as Python's
    documentation advises before a fork): collections in the children and the supervisor
    no longer walk it, the children do not copy its pages by touching their GC headers,
    and exit does not collect it (0.1-0.2 s of every ``runworkers`` start and stop
    before). Once only: a cycle that was garbage when frozen is never freed, so freezing
    again at every fork (children retire, ``--max-tasks-per-child``) would keep some."""
    global _frozen
    connections.close_all()
    if not _frozen:
        gc.freeze()
        _frozen = True
    ours, theirs = _fork.Pipe()
    handoff = Handoff(_fork, slots=conf.get().ASYNC_CONCURRENCY)
    process = _fork.Process(
        target=_child_main,
        args=(theirs, using, max_tasks, os.getpid(), handoff),
        name=f"dbworker-child-{slot}",
        daemon=False,
    )
    # No SIGCHLD until the new child is one of multiprocessing's: reap() leaves those alone.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    try:
        process.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    theirs.close()
    return Child(slot, process, ours, handoff)
