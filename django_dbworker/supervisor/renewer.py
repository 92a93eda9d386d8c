"""The renewer: lease renewal and the heartbeat on a schedule and a connection of their own.

The main loop claims, sweeps, reaps and prunes; any of those may take seconds (a slow
``eligible`` queryset, a big table, a busy server). Renewal ran in that loop once, so one
slow query delayed it past a short lease: healthy units were reaped and their commits
refused. Now ``duties.leases.Renewal`` runs here, in a thread of the supervisor, and no
claim, discovery or maintenance query can hold it up: neither the renewal (every third of
the lease) nor the heartbeat (every ``HEARTBEAT_INTERVAL``), whose silence other
supervisors take for death (``takeover.py``). A round runs the duty while it is due, each
run (the beat, the renewal) a transaction of its own.

Why a thread and not a process: a renewer process would be one more child of
``runworkers`` (what operators and the tests count, what the subreaper collects, what a
kill of the process group must take down too), and it would see nothing of the main
loop; the thread reads what the heartbeat shows (which child runs what) from memory, and
renews without being told which units are held: ``units.renew`` finds them by this
supervisor's id.

Its connection is its own (Django's connections are per thread) and exists only inside a
round: opened for the round, closed after it. The supervisor forks its children and a
forked socket or SQLite handle must not be shared (SQLite's locks are per process), so a
fork and a round exclude each other (``paused``); between rounds nothing is open to
share. Its statements wait at most ``LOCK_WAIT`` for a lock (``bound_lock_waits``; on
PostgreSQL a round is one transaction with ``SET LOCAL lock_timeout``, ``lock_wait_scope``:
nothing of it stays on a pooler's server connection), so a
fork never waits long for a round: on SQLite a renewal waits while a claim or a
transactional handler holds the write lock (nobody can reap meanwhile either), and the
supervisor's own reaper never takes back its own units (``leases.Reaping``).

A round that failed on the database is logged and tried again (``outage.Outage``:
``database_error``, then one ``reconnected`` line; backing off at most a heartbeat
interval, so a lease, and the bound of three missed beats, outlive the wait). One that
waited in vain for a lock (``units.transient``: SQLite's write lock) is tried again at
once, and said once a minute (``renewal_delayed``); anything else it raises too
(``duty_failed``). It stops, and is joined, before the supervisor's last heartbeat write.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Iterator

from django.db import DatabaseError, connections

from ..db.connections import bound_lock_waits, lock_wait_scope, own_process
from ..logs import log_event
from . import units
from .duties.base import FAILURE_LOG_INTERVAL, Clock, Every
from .duties.leases import Renewal
from .duties.outage import Outage

#: Seconds a renewal statement waits for a lock another connection holds, at most.
LOCK_WAIT = 1.0
#: Seconds between two tries of a renewal that waited ``LOCK_WAIT`` in vain (the fork's turn).
RETRY_PAUSE = 0.01
#: Seconds ``stop`` waits for a round in progress.
STOP_WAIT = 5.0
#: Signals the main thread handles: never delivered to this thread. (A SIGCHLD taken
#: here would run the main thread's handler inside ``pool.start``, which blocks it.)
MAIN_THREAD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD}


class Renewer:
    """Runs ``renewal`` every time it is due, in a thread, on ``using``."""

    def __init__(self, renewal: Renewal, using: str, clock: Clock = time.monotonic) -> None:
        self.renewal = renewal
        self.using = using
        self.clock = clock
        self.outage = Outage(clock, longest=renewal.every.interval, part="renewer")
        self._logged: dict[str, Every] = {}
        self._stopping = threading.Event()
        #: Held for a whole round (while this thread's connection is open), and by a fork.
        self._fork = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dbworker-renewer",
                                        daemon=True)  # a round stuck at exit never blocks it
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, MAIN_THREAD_SIGNALS)
        try:
            self._thread.start()  # with the signals blocked, as is this thread's mask
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No round runs inside, and the renewer has no connection open: fork here."""
        with self._fork:
            yield

    def stop(self, timeout: float = STOP_WAIT) -> None:
        """Stop and join the thread (before the heartbeat's last write)."""
        self._stopping.set()
        if self._thread is None:
            return
        self._thread.join(timeout)
        if self._thread.is_alive():
            log_event(logging.ERROR, "renewer_stuck", waited=timeout,
                      reason="a renewal round did not end; stopping without it")

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # ----- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            own_process(self.using)  # this thread's connection is its own
            bound_lock_waits(self.using, min(LOCK_WAIT, self.renewal.every.interval))
            while not self._stopping.is_set():
                self._stopping.wait(self.round())
        except BaseException as exc:
            log_event(logging.CRITICAL, "renewer_died",
                      error=f"{type(exc).__name__}: {str(exc).strip()[:300]}")
            raise
        finally:
            with contextlib.suppress(DatabaseError):
                connections[self.using].close()

    def round(self) -> float:
        """Renew if due; returns the seconds until the next round."""
        now = self.clock()
        if self.renewal.due(now):
            try:
                with self._fork:
                    try:
                        while self.renewal.due(now):  # each part a transaction of its own
                            with lock_wait_scope(self.using):
                                self.renewal.run(now)
                    finally:
                        with contextlib.suppress(DatabaseError):
                            connections[self.using].close()
            except DatabaseError as exc:  # due again at once (``Periodic``)
                if units.transient(exc):  # a lock still held (SQLite's write lock): no outage
                    self._log_once(exc, now, "renewal_delayed", retry_in=RETRY_PAUSE)
                    return RETRY_PAUSE
                return self.outage.failed(exc)
            except Exception as exc:
                self._log_once(exc, now, "duty_failed", duty=self.renewal.name)
            else:
                self.outage.went_through(connected=True)
        return max(0.0, self.renewal.left(self.clock()))

    def _log_once(self, exc: Exception, now: float, event: str, **fields: object) -> None:
        """At most one line a minute about rounds that fail the same way."""
        logged = self._logged.setdefault(event, Every(FAILURE_LOG_INTERVAL))
        if logged.due(now):
            logged.ran(now)
            log_event(logging.WARNING if event == "renewal_delayed" else logging.ERROR, event,
                      **fields, error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                      next_log_in=FAILURE_LOG_INTERVAL)
