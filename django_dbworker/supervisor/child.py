"""A child process: receives units over a pipe, runs them, reports the results."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from django.db import DatabaseError, connections

from .. import prepared
from ..completions import Completions, Kept
from ..db import use_immediate_transactions
from . import units
from .handoff import Handoff

PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to kill us when the supervisor dies, so no orphan keeps running units."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def main(pipe: Connection, using: str, max_tasks: int | None, parent_pid: int,
         handoff: Handoff) -> None:
    """Run the units the supervisor sends, in order; report them back a batch at a time.

    A batch is reported when it is through: the supervisor tops up a child from its
    reports, so the next batch is usually in the pipe already. Successful tasks of a batch
    are recorded together before it is reported (``completions``)."""
    signal.set_wakeup_fd(-1)
    # The supervisor decides when we stop; a terminal's Ctrl-C or a group SIGTERM does not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    use_immediate_transactions(using)
    prepared.activate()
    completions = Completions(using)
    report: list[tuple[Any, ...]] = []
    done = 0

    def keep(seq: int) -> Callable[[Kept], None]:
        def add(kept: Kept) -> None:
            kept.tag = seq
            completions.add(kept)
        return add

    def flush() -> None:
        for kept, outcome in completions.flush():
            if isinstance(outcome, Exception):
                connections[using].close()
                report.append((kept.tag, "db_error", str(units.describe(kept.claim)),
                               str(outcome)))
            else:
                report.append((kept.tag, "result", kept.after(outcome)))

    try:
        while True:
            try:
                batch = pipe.recv()
            except (EOFError, OSError):
                return
            if batch is None:
                return
            for seq, claim in batch:
                if not handoff.start(seq):
                    continue  # taken back: it runs elsewhere, or later
                if completions.due():
                    flush()
                completions.started()
                try:
                    result = units.run(claim, keep(seq))
                    if result is not None:
                        report.append((seq, "result", result))
                except DatabaseError as exc:
                    connections[using].close()
                    report.append((seq, "db_error", str(units.describe(claim)), str(exc)))
                completions.finished()
                handoff.finish(seq)
                done += 1
                if max_tasks and done >= max_tasks:
                    flush()
                    # One message: the supervisor must learn we retire before it sees us idle.
                    pipe.send(("report", report, True))
                    return
            flush()
            if report:
                pipe.send(("report", report, False))
                report = []
    finally:
        completions.close()
        connections.close_all()
