"""A child process: receives claims over a pipe, runs them, reports results."""

from __future__ import annotations

import ctypes
import os
import signal
from multiprocessing.connection import Connection

from django.db import DatabaseError, connections

from ..db import use_immediate_transactions
from . import units

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


def main(pipe: Connection, using: str, max_tasks: int | None, parent_pid: int) -> None:
    signal.set_wakeup_fd(-1)
    # The supervisor decides when we stop; a terminal's Ctrl-C or a group SIGTERM does not.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent(parent_pid)
    use_immediate_transactions(using)
    done = 0
    try:
        while True:
            try:
                claim = pipe.recv()
            except (EOFError, OSError):
                return
            if claim is None:
                return
            try:
                result = units.run(claim)
            except DatabaseError as exc:
                connections[using].close()
                pipe.send(("db_error", str(units.describe(claim)), str(exc)))
                continue
            done += 1
            retiring = bool(max_tasks and done >= max_tasks)
            # One message: the supervisor must learn we retire before it sees us idle.
            pipe.send(("result", result, retiring))
            if retiring:
                return
    finally:
        connections.close_all()
