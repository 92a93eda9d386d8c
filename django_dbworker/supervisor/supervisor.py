"""The supervisor: claims, dispatches to children, renews, reaps, sweeps, stops."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TextIO

from django.db import DatabaseError, connections

from .. import conf
from ..claims import pending, store
from ..claims.store import Claimant, FailureInfo
from ..db import use_immediate_transactions
from ..logs import log_event
from ..registry import Worker
from . import pool
from .pool import Child, describe_exit
from .progress import Progress

CHILD_DIED = "django_dbworker.exceptions.ChildProcessDied"
#: Seconds a worker whose claim or sweep raised is left alone before it is tried again.
BROKEN_WORKER_PAUSE = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    workers: list[Worker]
    concurrency: int
    burst: bool = False
    max_tasks_per_child: int | None = None
    grace_period: float = 30.0


class Supervisor:
    def __init__(self, options: Options, config: conf.Config, progress: TextIO | None) -> None:
        self.options = options
        self.config = config
        self.using = config.DATABASE
        self.claimant = Claimant(pid=os.getpid())
        self.children: list[Child] = []
        self.progress = Progress(progress)
        self.sweepers = [pending.Sweeper(w, config.SWEEP_BATCH) for w in options.workers]
        self.sweeping: set[int] = set()
        self.stop_requested_at: float | None = None
        self.hard_stop = False
        self.retry_release: list[tuple[store.Claim, FailureInfo | None]] = []
        self._rotation = 0
        self._next = {"renew": 0.0, "reap": 0.0, "sweep": 0.0}
        self._backoff = 0.0
        self._broken: dict[str, float] = {}
        self._wake_r, self._wake_w = socket.socketpair()

    # ----- life cycle ---------------------------------------------------------------

    def run(self) -> int:
        use_immediate_transactions(self.using)
        self._install_signals()
        names = ",".join(w.name for w in self.options.workers)
        log_event(logging.INFO, "supervisor_started", supervisor=self.claimant.supervisor_id,
                  host=self.claimant.host, pid=self.claimant.pid, workers=names,
                  concurrency=self.options.concurrency, burst=self.options.burst)
        for slot in range(self.options.concurrency):
            self.children.append(self._start_child(slot))
        try:
            code = self._loop()
        finally:
            self._shutdown_children()
            self.progress.close()
        log_event(logging.INFO, "supervisor_stopped", supervisor=self.claimant.supervisor_id,
                  exit_code=code, units=self.progress.done)
        return code

    def _loop(self) -> int:
        while True:
            if self.hard_stop:
                return self._cut_off("second signal")
            stopping = self.stop_requested_at is not None
            if stopping:
                for ch in self.children:
                    if ch.claim is None:
                        ch.ask_to_stop()
            if stopping and not self._busy():
                return 0
            if stopping and time.monotonic() - self.stop_requested_at > self.options.grace_period:
                return self._cut_off("grace period over")
            claimed: int | None = 0
            try:
                self._maintain()
                if not stopping:
                    claimed = self._fill()
                self._backoff = 0.0
            except DatabaseError as exc:
                self._database_down(exc)
            if (self.options.burst and not stopping and claimed == 0 and not self._busy()
                    and not self.sweeping and self._backoff == 0.0):
                return self._burst_done()
            self.progress.show()
            room = any(ch.claim is None for ch in self.children)
            timeout = 0.0 if claimed and room else self._idle_timeout()
            self._wait(timeout)

    # ----- claims and dispatch ------------------------------------------------------

    def _busy(self) -> bool:
        return any(ch.claim is not None for ch in self.children)

    def _fill(self) -> int | None:
        """Claim work for the idle children; the number of units claimed, or None when no
        child was free (so nothing is known about what is claimable: --burst keeps going)."""
        idle = [ch for ch in self.children if ch.claim is None and not ch.retiring
                and not ch.stopping and ch.process.exitcode is None]
        if not idle:
            return None
        running: dict[str, int] = {}
        for ch in self.children:
            if ch.claim is not None:
                running[ch.claim.worker] = running.get(ch.claim.worker, 0) + 1
        workers = self.options.workers
        start = self._rotation % len(workers)
        self._rotation += 1
        claimed = 0
        for worker in workers[start:] + workers[:start]:
            room = min(len(idle), worker.concurrency - running.get(worker.name, 0))
            if room <= 0 or self._broken.get(worker.name, 0.0) > time.monotonic():
                continue
            try:
                claims = store.claim(worker, room, self.claimant, self.config.LEASE_SECONDS)
            except Exception as exc:
                self._worker_broken(worker, exc)
                continue
            for c in claims:
                claimed += 1  # work was found, even if it goes back below
                child = idle.pop()
                log_event(logging.DEBUG, "claimed", worker=c.worker, execution=c.execution_id,
                          source=c.source_key, attempt=c.attempt, child=child.pid)
                try:
                    child.dispatch(c)
                except OSError:  # the child is gone; its exit is handled by its sentinel
                    store.release(c, crashed=None, max_crashes=self.config.MAX_CRASHES)
            if not idle:
                break
        return claimed

    def _burst_done(self) -> int:
        if self._broken:
            log_event(logging.ERROR, "burst_incomplete", workers=",".join(sorted(self._broken)),
                      reason="their claims or sweeps failed; see claim_failed above")
            return 1
        return 0

    def _worker_broken(self, worker: Worker, exc: Exception) -> None:
        """A claim failed: a lost connection stops everything; anything else only this worker.

        A worker whose eligible queryset raises (a typo, a missing table) is skipped for a
        while and logged, so the other workers keep flowing.
        """
        if isinstance(exc, DatabaseError) and not self._connection_usable():
            raise exc
        log_event(logging.ERROR, "claim_failed", worker=worker.name,
                  error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                  retry_in=BROKEN_WORKER_PAUSE)
        self._broken[worker.name] = time.monotonic() + BROKEN_WORKER_PAUSE

    def _connection_usable(self) -> bool:
        connection = connections[self.using]
        try:
            return connection.connection is not None and connection.is_usable()
        except DatabaseError:
            return False

    # ----- periodic work --------------------------------------------------------------

    def _maintain(self) -> None:
        now = time.monotonic()
        third = self.config.LEASE_SECONDS / 3
        self._retry_releases()
        if now >= self._next["renew"]:
            ids = [ch.claim.execution_id for ch in self.children if ch.claim is not None]
            store.renew(self.claimant, ids, self.config.LEASE_SECONDS)
            self._next["renew"] = now + third
        if now >= self._next["reap"]:
            reaped = store.reap(self.config.MAX_CRASHES)
            if reaped:
                log_event(logging.WARNING, "reaped", units=reaped,
                          reason="lease expired")
            self._next["reap"] = now + min(third, 5.0)
        if now >= self._next["sweep"]:
            self.sweeping = set(range(len(self.sweepers)))
            self._next["sweep"] = now + self.config.SWEEP_INTERVAL
        for i in list(self.sweeping):
            sweeper = self.sweepers[i]
            if self._broken.get(sweeper.worker.name, 0.0) > now:
                continue
            try:
                added, done = sweeper.step()
            except Exception as exc:
                self._worker_broken(sweeper.worker, exc)
                continue
            if added:
                log_event(logging.INFO, "swept", worker=sweeper.worker.name, added=added)
            if done:
                self.sweeping.discard(i)

    def _retry_releases(self) -> None:
        while self.retry_release:
            c, crashed = self.retry_release[0]
            store.release(c, crashed=crashed, max_crashes=self.config.MAX_CRASHES)
            self.retry_release.pop(0)

    def _database_down(self, exc: DatabaseError) -> None:
        self._backoff = min(max(self._backoff * 2, 0.5), 30.0)
        log_event(logging.WARNING, "database_error", error=str(exc).strip()[:300],
                  retry_in=self._backoff)
        with contextlib.suppress(DatabaseError):
            connections[self.using].close()
        self._wait(self._backoff)

    def _idle_timeout(self) -> float:
        until_renew = self._next["renew"] - time.monotonic()
        poll = 0.0 if self.sweeping else self.config.POLL_INTERVAL
        return max(0.0, min(poll, until_renew))

    # ----- children -------------------------------------------------------------------

    def _start_child(self, slot: int) -> Child:
        child = pool.start(slot, self.using, self.options.max_tasks_per_child)
        log_event(logging.DEBUG, "child_started", slot=slot, child=child.pid)
        return child

    def _wait(self, timeout: float) -> None:
        handles: list = [self._wake_r]
        for ch in self.children:
            handles += [ch.pipe, ch.process.sentinel]
        ready = wait(handles, timeout)
        if self._wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                self._wake_r.recv(4096)
        for ch in list(self.children):
            if ch.pipe in ready:
                self._read(ch)
        for ch in list(self.children):
            if ch.process.sentinel in ready:
                ch.process.join(0)
                if ch.process.exitcode is not None:
                    self._drain(ch)
                    self._child_exited(ch)

    def _read(self, ch: Child) -> None:
        try:
            message = ch.pipe.recv()
        except (EOFError, OSError):
            return  # its exit is handled through its sentinel
        self._handle(ch, message)

    def _drain(self, ch: Child) -> None:
        try:
            while ch.pipe.poll():
                self._handle(ch, ch.pipe.recv())
        except (EOFError, OSError):
            pass

    def _handle(self, ch: Child, message: tuple) -> None:
        kind = message[0]
        if kind == "result":
            ch.claim = None
            ch.retiring = ch.retiring or message[2]
            self.progress.add(message[1].outcome)
            if self.stop_requested_at is not None:
                ch.ask_to_stop()
        elif kind == "db_error":
            c, ch.claim = ch.claim, None
            log_event(logging.WARNING, "child_database_error", child=ch.pid,
                      execution=message[1], error=message[2][:300])
            if c is not None:
                self.retry_release.append((c, None))

    def _child_exited(self, ch: Child) -> None:
        self.children.remove(ch)
        ch.pipe.close()
        c = ch.claim
        if c is not None:
            how = describe_exit(ch.process.exitcode)
            crashed = FailureInfo(
                CHILD_DIED,
                f"the process running this unit (pid {ch.pid}) died while running it: {how}",
            )
            self.progress.add("crashed")
            log_event(logging.ERROR, "child_died", worker=c.worker, execution=c.execution_id,
                      source=c.source_key, attempt=c.attempt, child=ch.pid, reason=how)
            try:
                store.release(c, crashed=crashed, max_crashes=self.config.MAX_CRASHES)
            except DatabaseError:
                self.retry_release.append((c, crashed))
        elif not ch.retiring and not ch.stopping:
            log_event(logging.WARNING, "child_exited", child=ch.pid,
                      reason=describe_exit(ch.process.exitcode))
        if self.stop_requested_at is None:
            if not ch.retiring and time.monotonic() - ch.started < 1.0:
                time.sleep(0.5)  # a child that dies at once should not spin
            self.children.append(self._start_child(ch.slot))

    def _cut_off(self, why: str) -> int:
        cut = [ch for ch in self.children if ch.claim is not None]
        for ch in self.children:
            ch.kill()
        for ch in cut:
            c = ch.claim
            ch.claim = None
            log_event(logging.WARNING, "cut_off", worker=c.worker, execution=c.execution_id,
                      source=c.source_key, reason=why)
            try:
                store.release(c, crashed=None, max_crashes=self.config.MAX_CRASHES)
            except DatabaseError as exc:
                log_event(logging.ERROR, "release_failed", execution=c.execution_id,
                          error=str(exc)[:300])
        return 1 if cut else 0

    def _shutdown_children(self) -> None:
        for ch in self.children:
            ch.ask_to_stop()
        deadline = time.monotonic() + 5
        for ch in self.children:
            ch.process.join(max(0.0, deadline - time.monotonic()))
            if ch.process.exitcode is None:
                ch.kill()
            ch.pipe.close()
        self.children = []

    # ----- signals --------------------------------------------------------------------

    def _install_signals(self) -> None:
        self._wake_w.setblocking(False)
        self._wake_r.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: object) -> None:
        name = signal.Signals(signum).name
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
            log_event(logging.WARNING, "stopping", signal=name,
                      grace_period=self.options.grace_period,
                      running=sum(ch.claim is not None for ch in self.children))
        else:
            self.hard_stop = True
            log_event(logging.WARNING, "stopping_now", signal=name)
