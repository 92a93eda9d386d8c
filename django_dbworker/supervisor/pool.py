"""The children of one supervisor and what each is running."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from django.db import connections

from ..claims.store import Claim
from . import child

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
    started: float = field(default_factory=time.monotonic)
    claim: Claim | None = None
    claimed_at: float = 0.0
    retiring: bool = False
    stopping: bool = False

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def dispatch(self, c: Claim) -> None:
        self.pipe.send(c)
        self.claim = c
        self.claimed_at = time.monotonic()

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
    """Fork a child. Our connections close first: a forked socket must not be shared."""
    connections.close_all()
    ours, theirs = _fork.Pipe()
    process = _fork.Process(
        target=child.main,
        args=(theirs, using, max_tasks, os.getpid()),
        name=f"dbworker-child-{slot}",
        daemon=False,
    )
    process.start()
    theirs.close()
    return Child(slot, process, ours)
