"""Run the workers from your own process: ``start()`` returns while they run, and the
handle's ``stop(timeout=...)`` stops them gracefully (docs/operations.md, "Embedding").

The supervisor is a process of its own, exactly ``manage.py runworkers`` with the options
given, started from this interpreter with this process's settings and import path: the
same children, leases, fencing and graceful stop, and no signal handler, thread or fork in
the embedding process (a supervisor forks its children; forking a process that runs
threads, like a web server or a test runner, is not safe). On Linux it is also stopped when
the embedding process dies, however it dies.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import IO, Any

from django.conf import settings

from .. import conf

#: prctl(2)'s PR_SET_PDEATHSIG: the signal a process gets when its parent dies (Linux).
_PR_SET_PDEATHSIG = 1


class StartFailed(RuntimeError):
    """The supervisor exited, or did not come up, before ``start()`` returned."""


#: Set by ``start()`` in the supervisor's environment: the pid of the process it belongs to.
PARENT_ENV = "DBWORKER_EMBEDDED_BY"


def die_with_parent() -> None:
    """In a supervisor ``start()`` made (``runworkers`` calls it first thing): be sent
    SIGTERM, a graceful stop, when the embedding process dies, however it dies (Linux's
    PR_SET_PDEATHSIG; elsewhere the embedding process's exit stops it, not its crash). If it
    already died, stop now."""
    expected = os.environ.get(PARENT_ENV)
    if not expected:
        return
    if sys.platform == "linux":
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != expected:
        os.kill(os.getpid(), signal.SIGTERM)


class Workers:
    """A running supervisor started by ``start()``. A context manager: leaving the
    ``with`` block stops it (``stop()``)."""

    def __init__(self, process: subprocess.Popen[bytes], grace_period: float) -> None:
        self._process = process
        #: Seconds running units get after ``stop()`` asks the supervisor to stop.
        self.grace_period = grace_period

    @property
    def pid(self) -> int:
        """The supervisor's process id (its ``Supervisor`` row has it)."""
        return self._process.pid

    @property
    def running(self) -> bool:
        """Whether the supervisor process still runs."""
        return self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        """Its exit status once it has exited (negative: killed by that signal)."""
        return self._process.poll()

    def wait(self, timeout: float | None = None) -> int | None:
        """Its exit status once it has exited (a ``burst`` run ends by itself), or None
        if it still runs after ``timeout`` seconds."""
        try:
            return self._process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float | None = None) -> int:
        """Stop gracefully, as SIGTERM stops ``runworkers``: no new claims, running units
        get the grace period to finish, then the supervisor gives back what is left and
        exits. ``timeout`` (default: the grace period plus 10 s) is how long to wait for
        that; after it the supervisor and its children are killed (their units are taken
        back by another supervisor's reaper once their leases expire). Returns the exit
        status (0: a clean stop; 1: units had to be cut off)."""
        if self.running:
            with contextlib.suppress(ProcessLookupError):
                self._process.send_signal(signal.SIGTERM)
        wait = self.grace_period + 10.0 if timeout is None else timeout
        code = self.wait(wait)
        if code is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)
            code = self._process.wait()
        return code

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start(
    *,
    workers: Iterable[str] | None = None,
    queues: Iterable[str] | None = None,
    concurrency: int | None = None,
    burst: bool = False,
    grace_period: float | None = None,
    max_tasks_per_child: int | None = None,
    log_format: str | None = None,
    settings_module: str | None = None,
    env: Mapping[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    ready_timeout: float = 60.0,
) -> Workers:
    """Start a supervisor (``runworkers`` with these options) and return once it runs:
    its heartbeat is in the database. The options are ``runworkers``' (``workers``:
    ``--worker`` names, ``queues``: ``--queue`` names; neither: everything). Its output
    goes where this process's goes unless ``stdout``/``stderr`` say otherwise
    (``subprocess.DEVNULL``, a file). ``settings_module`` defaults to this process's
    ``DJANGO_SETTINGS_MODULE``; ``env`` adds to this process's environment.

    Raises ``StartFailed`` (with what it printed, when captured) if the supervisor exits
    or has not beaten within ``ready_timeout`` seconds; a bad option fails the same way,
    with runworkers' own message."""
    config = conf.get()
    module = settings_module or os.environ.get("DJANGO_SETTINGS_MODULE") \
        or getattr(settings, "SETTINGS_MODULE", None)
    if not module:
        raise StartFailed("django_dbworker.start() needs the settings module: set "
                          "DJANGO_SETTINGS_MODULE or pass settings_module=.")
    args = [sys.executable, "-m", "django", "runworkers", f"--settings={module}"]
    args += [f"--worker={name}" for name in workers or ()]
    args += [f"--queue={name}" for name in queues or ()]
    if concurrency is not None:
        args.append(f"--concurrency={concurrency}")
    if burst:
        args.append("--burst")
    if grace_period is not None:
        args.append(f"--grace-period={grace_period}")
    if max_tasks_per_child is not None:
        args.append(f"--max-tasks-per-child={max_tasks_per_child}")
    if log_format is not None:
        args.append(f"--log-format={log_format}")
    path = os.pathsep.join(p for p in sys.path if p)
    child_env = {**os.environ, "PYTHONPATH": path, "DJANGO_SETTINGS_MODULE": module,
                 **(env or {}), PARENT_ENV: str(os.getpid())}
    # Its own session: a Ctrl-C meant for this process does not cut it short (this
    # process's exit stops it gracefully: atexit), and killpg reaches its children.
    process = subprocess.Popen(args, env=child_env, cwd=os.getcwd(), stdout=stdout,
                               stderr=stderr, start_new_session=True)
    handle = Workers(process, config.GRACE_PERIOD if grace_period is None else grace_period)
    atexit.register(_stop_at_exit, handle)
    _wait_until_beating(handle, ready_timeout, burst=burst)
    return handle


def _stop_at_exit(handle: Workers) -> None:
    if handle.running:
        handle.stop()


def _wait_until_beating(handle: Workers, timeout: float, *, burst: bool) -> None:
    """Until the supervisor's heartbeat row exists (it writes it as it starts)."""
    from ..models import Supervisor

    using = conf.get().DATABASE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code = handle.returncode
        if code is not None:
            if burst and code == 0:
                return  # a burst with nothing to do ends at once
            raise StartFailed(f"runworkers (pid {handle.pid}) exited with status {code} "
                              "before it ran; its output says why.")
        if Supervisor.objects.using(using).filter(host=socket.gethostname(),
                                                  pid=handle.pid).exists():
            return
        time.sleep(0.05)
    handle.stop(timeout=5.0)
    raise StartFailed(f"runworkers (pid {handle.pid}) did not beat within {timeout:.0f} s; "
                      "it was stopped.")
