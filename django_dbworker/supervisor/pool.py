"""The children of one supervisor and what each is running."""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from django.db import connections

from . import child
from .handoff import Handoff
from .units import Unit

_fork = multiprocessing.get_context("fork")


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
        return self.sent.pop(seq, None)

    def forget(self, c: Unit) -> None:
        for number, unit in list(self.sent.items()):
            if unit is c:
                del self.sent[number]

    def settle(self) -> tuple[Unit | None, list[Unit], list[Unit]]:
        """After it exited: the unit it died running, those it ran without reporting
        back, and those it never started. Everything is forgotten."""
        started = self.handoff.started()
        running = self.handoff.running()
        died_in = None
        ran, never = [], []
        for number, c in self.sent.items():
            if number > started:
                never.append(c)
            elif running is not None and number == running[0]:
                died_in = c
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
        if self.process.pid and self.process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(5)


def start(slot: int, using: str, max_tasks: int | None) -> Child:
    """Fork a child. Our connections close first: a forked socket must not be shared.

    Before the first fork, what the supervisor holds (Django, its apps, the registry: most
    of the heap) is frozen for the garbage collector (``gc.freeze()``, as Python's
    documentation advises before a fork): collections in the children and the supervisor
    no longer walk it, the children do not copy its pages by touching their GC headers,
    and exit does not collect it (0.1-0.2 s of every ``runworkers`` start and stop
    before). Once only: a cycle that was garbage when frozen is never freed, so freezing
    again at every fork (children retire, ``--max-tasks-per-child``) would keep some."""
    connections.close_all()
    if not gc.get_freeze_count():
        gc.freeze()
    ours, theirs = _fork.Pipe()
    handoff = Handoff(_fork)
    process = _fork.Process(
        target=child.main,
        args=(theirs, using, max_tasks, os.getpid(), handoff),
        name=f"dbworker-child-{slot}",
        daemon=False,
    )
    process.start()
    theirs.close()
    return Child(slot, process, ours, handoff)
