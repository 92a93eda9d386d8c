"""``runworkers``' start-up checks, each run in a short-lived forked process.

Django's system checks import what a supervisor never uses again: the ``migrate`` and
``makemigrations`` commands with the migration autodetector, writer and questioner (the
check that their autodetectors agree), the URLconf with its views, and every app's
migrations for the unapplied-migrations check. Imported in the supervisor, all of it stays
in the supervisor and, through the fork, in every child's memory (counted in each one's
RSS). In a forked process of their own they are gone when it exits; what the check raised
is raised here, its output already written to the same stdout and stderr.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from collections.abc import Callable

from django.core.management.base import CommandError
from django.db import connections


class CheckProcessKilled(CommandError):
    """The checks' process was killed by a signal before it answered (the OOM killer, a
    ``kill -9`` aimed at the supervisor's children): nothing is known of the checks, which
    the caller may run again in its own process."""

    def __init__(self, signum: int) -> None:
        try:
            self.signal_name = signal.Signals(signum).name
        except ValueError:
            self.signal_name = f"signal {signum}"
        super().__init__(f"runworkers' start-up checks were killed by {self.signal_name} "
                         "before they answered; run 'manage.py check' to see whether they "
                         "pass.")


def run_forked(check: Callable[[], object]) -> None:
    """Run ``check`` in a forked process; raise here what it raised there.

    Our database connections close first: a forked socket must not be shared (the check's
    process opens its own, and closes it)."""
    connections.close_all()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the check's process (coverage does not follow it)
        os.close(read)
        _check_and_exit(check, write)
    os.close(write)
    try:
        with os.fdopen(read, "rb") as pipe:
            found = pipe.read()
    finally:
        _, status = os.waitpid(pid, 0)
    if not found:
        if os.WIFSIGNALED(status):
            raise CheckProcessKilled(os.WTERMSIG(status))
        raise CommandError(f"runworkers' start-up checks ended without an answer (wait "
                           f"status {status}); run 'manage.py check' to see why.")
    raised = pickle.loads(found)
    if raised is not None:
        raise raised


def _check_and_exit(check: Callable[[], object], write: int) -> None:  # pragma: no cover
    raised: BaseException | None = None
    try:
        check()
    except BaseException as exc:  # every outcome goes back to the parent
        raised = exc
    try:
        answer = pickle.dumps(raised)
    except Exception:  # an exception that does not pickle: its text does
        answer = pickle.dumps(CommandError(f"{type(raised).__name__}: {raised}"))
    try:
        with os.fdopen(write, "wb") as pipe:
            pipe.write(answer)
        with contextlib.suppress(Exception):
            connections.close_all()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(0)  # no atexit, no finalizers: they belong to the parent
