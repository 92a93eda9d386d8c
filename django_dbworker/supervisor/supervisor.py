"""The supervisor: claims, dispatches to children, renews, reaps, sweeps, stops."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import selectors
import signal
import socket
import time
from collections import Counter
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import TextIO

from django.db import DatabaseError, connections

from .. import conf, pausing
from ..db import engine_for, notify
from ..db.connections import bound_lock_waits, connected, opened_at, own_process
from ..logs import log_event, logger
from ..outcomes import RunOutcome
from ..rows import triggers
from ..rows.registry import Worker
from ..rows.sweep import Sweeper
from ..units import aio
from ..units.claimant import Claimant
from ..units.failures import FailureInfo
from . import pool, trace, units
from .caps import Caps
from .duties.base import Duties
from .duties.discovery import Discovery
from .duties.leases import Reaping, Renewal, Retries
from .duties.outage import Outage
from .duties.row_dependencies import RowDependencies
from .duties.timeouts import Timeouts
from .heartbeat import Heartbeat
from .pauses import Pauses
from .pool import Child, describe_exit
from .prefetch import Prefetch
from .progress import Progress
from .renewer import Renewer
from .sources import TASK_SOURCE, RowSource, Source, TaskSource
from .taskwork import TaskWork
from .units import Unit
from .wakeups import Commits, Listener, behind_transaction_pooler

CHILD_DIED = "django_dbworker.exceptions.ChildProcessDied"
SESSION_ENDED = "django_dbworker.exceptions.SessionEnded"
#: Seconds a worker whose claim or sweep raised is left alone before it is tried again.
BROKEN_WORKER_PAUSE = 30.0
#: Seconds before a claim that lost to another transaction (a deadlock, a lock wait timed
#: out: ``units.transient``) runs again; the source is not paused for it.
TRANSIENT_CLAIM_RETRY = 0.05
#: Seconds the loop's statements wait for SQLite's write lock before they are tried again
#: in a later round (the children's wait SQLITE_BUSY_TIMEOUT).
MAIN_LOCK_WAIT = 1.0
#: Seconds between two ``claim_retried`` lines of one source.
CLAIM_RETRIED_LOG_INTERVAL = 60.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    workers: list[Worker]
    #: Run enqueued tasks too; ``queues`` None means every queue.
    tasks: bool = False
    queues: list[str] | None = None
    concurrency: int
    burst: bool = False
    max_tasks_per_child: int | None = None
    grace_period: float = 30.0


def _without_triggers(worker: Worker) -> bool:
    """Whether ``worker``'s periodic full pass is needed: not while its database triggers
    are current (they give every inserted row its unit and delete a deleted one's)."""
    return not triggers.installed(worker)


class Supervisor:
    def __init__(self, options: Options, config: conf.Config, progress: TextIO | None) -> None:
        self.options = options
        self.config = config
        self.using = config.DATABASE
        self.claimant = Claimant(pid=os.getpid())
        self.children: list[Child] = []
        self.progress = Progress(progress)
        self.stop_requested_at: float | None = None
        self.hard_stop = False
        self.prefetch = Prefetch(config.PREFETCH, options.concurrency, config.LEASE_SECONDS)
        self.caps = Caps(options.workers, options.concurrency)
        self.tasks = (
            # --burst runs what is there and stops; cron would keep it going forever
            TaskWork(options.queues, config, self.claimant, schedule=not options.burst)
            if options.tasks else None
        )
        self.prefetch.limited = (any(w.concurrency_limit for w in options.workers)
                                 or (self.tasks is not None and self.tasks.keyed))
        self._last_claim = 0.0
        self._rotation = 0
        self._broken: dict[str, float] = {}
        #: When each source may log ``claim_retried`` / ``sweep_retried`` again (monotonic
        #: seconds), by "claim:name" / "sweep:name".
        self._retried_logged: dict[str, float] = {}
        #: A claim of this round failed with a transient error: claimed again soon.
        self._claims_deferred = False
        #: Every source of the last round gave fewer units than asked: claiming again at
        #: once would find nothing new (new work wakes us: NOTIFY, commits, a probe, a
        #: poll), so the loop waits instead of claiming again beside the units it started.
        self._short = False
        self._wake_r, self._wake_w = socket.socketpair()
        self.listener = Listener(self.using)
        self.commits = Commits(self.using)
        #: The loop's first round is still to come: it claims before the duties (where
        #: the duties' writes do not wait for a running handler's transaction).
        self._first_round = engine_for(connections[self.using]).concurrent_writers
        #: What NOTIFY announced since the last claim ("task", "rows", worker names).
        self._announced: set[str] = set()
        #: Sources (TASK_SOURCE, worker names) whose last claim gave fewer units than
        #: asked (when: monotonic seconds), with nothing since that could have made more
        #: claimable but announcements of other sources (``_nothing_new``): a round that
        #: an announcement woke claims what was announced, not every source again (each
        #: a statement), for POLL_INTERVAL at most.
        self._found_short: dict[str, float] = {}
        #: Paused queues and workers (``pausing``): read per POLL_INTERVAL or when announced.
        self.pauses = Pauses(self.using, config.POLL_INTERVAL)
        #: What claims take units from, in turn: each row worker, then the task queues.
        self.sources: list[Source] = [
            RowSource(w, pauses=self.pauses, caps=self.caps, prefetch=self.prefetch,
                      claimant=self.claimant, lease=config.LEASE_SECONDS)
            for w in options.workers]
        if self.tasks is not None:
            self.sources.append(TaskSource(self.tasks, pauses=self.pauses))
        self.heartbeat = Heartbeat(
            self.claimant, lease=config.LEASE_SECONDS, concurrency=options.concurrency,
            workers=[w.name for w in options.workers], queues=options.queues,
            tasks=options.tasks, burst=options.burst, interval=config.HEARTBEAT_INTERVAL)
        self.outage = Outage()
        self.retries = Retries(config.MAX_CRASHES)
        #: Writes to retry once the database answers (``Retries``).
        self.retry_release = self.retries.releases
        self.retry_unclaim = self.retries.unclaims
        # Renewal and the heartbeat run in a thread of their own (renewer.py); what they
        # read of the main loop's is copied there: the children list, the count done.
        self.renewer = Renewer(Renewal(
            self.claimant, config.LEASE_SECONDS, tasks=options.tasks,
            beat=lambda: self.heartbeat.beat(list(self.children), self.progress.done),
            heartbeat=self.heartbeat.interval),
            self.using)
        self.reaping = Reaping(config.LEASE_SECONDS, config.MAX_CRASHES,
                               tasks=self.tasks is not None, spare=self.claimant,
                               held=self._held, witness=self.heartbeat)
        self.discovery = Discovery(
            [Sweeper(w, config.SWEEP_BATCH, full_interval=config.FULL_SWEEP_INTERVAL,
                     owner=self.claimant.supervisor_id, periodic_full=_without_triggers)
             for w in options.workers],
            config.SWEEP_INTERVAL, self._paused, self._sweep_failed)
        # In this order, every round, before claims (after them in a round NOTIFY woke: new
        # work first), renewal not among them (renewer.py).
        self.duties = Duties([
            self.retries,
            *(self.tasks.duties(lambda: self.children, self._stop_child, self.prefetch)
              if self.tasks is not None else []),
            Timeouts(lambda: self.children, self._stop_child),
            self.reaping,
            self.discovery,
            # tasks waiting for rows (after_row): released once the row's execution ended
            RowDependencies(config.POLL_INTERVAL, self.using),
        ])

    # ----- life cycle ---------------------------------------------------------------

    def _started_line(self) -> str:
        """What this supervisor serves, for people (verbosity 1 and up, text logs)."""
        workers = ", ".join(w.name for w in self.options.workers) or "none"
        if self.tasks is None:
            queues = "none"
        else:
            queues = ", ".join(self.options.queues) if self.options.queues else "all"
        vendor = connections[self.using].vendor
        mode = " (--burst: stops when nothing is left)" if self.options.burst else ""
        return (f"runworkers: {self.options.concurrency} child process(es) on database "
                f"{self.using!r} ({vendor}); workers: {workers}; task queues: {queues}{mode}")

    def run(self) -> int:
        own_process(self.using)
        if not engine_for(connections[self.using]).concurrent_writers:
            # One write lock serves all (SQLite): a transactional handler holds it for as
            # long as it runs. The loop's writes (sweeps, claims, releases) wait for it at
            # most MAIN_LOCK_WAIT and are tried again in a later round (``units.transient``),
            # so the loop keeps answering signals and its children.
            bound_lock_waits(self.using, MAIN_LOCK_WAIT)
        if trace.ON:
            trace.statements(self.using)
        behind_transaction_pooler(self.using)  # before the children fork: they inherit it
        self._install_signals()
        pool.adopt_orphans()  # what tasks start and leave behind is ours to stop (Linux)
        names = ",".join(w.name for w in self.options.workers)
        log_event(logging.INFO, "supervisor_started", supervisor=self.claimant.supervisor_id,
                  host=self.claimant.host, pid=self.claimant.pid, workers=names,
                  tasks=",".join(self.options.queues or ["*"]) if self.tasks else "",
                  concurrency=self.options.concurrency, burst=self.options.burst)
        self.progress.announce(self._started_line())
        for slot in range(self.options.concurrency):
            self.children.append(self._start_child(slot))
        self.renewer.start()
        try:
            code = self._loop()
        finally:
            self._shutdown_children()
            with contextlib.suppress(DatabaseError):
                self._give_back(self.prefetch.drain())
            self.listener.close()
            self.progress.close()
            self.renewer.stop()  # its last beat before the heartbeat's stop below
        with contextlib.suppress(DatabaseError):
            self.heartbeat.stop(code, self.progress.done)
        log_event(logging.INFO, "supervisor_stopped", supervisor=self.claimant.supervisor_id,
                  exit_code=code, units=self.progress.done)
        return code

    def _loop(self) -> int:
        while True:
            if self.hard_stop:
                return self._cut_off("second signal")
            requested = self.stop_requested_at  # set once, by a signal
            stopping = requested is not None
            if stopping:
                for ch in self.children:  # what waits in a child goes back too
                    self.prefetch.put(ch.take_back(), time.monotonic())
                if self._may_write_now():
                    self._give_back_now(self.prefetch.drain())
                for ch in self.children:
                    if not ch.sent:
                        ch.ask_to_stop()
            if stopping and not self._busy():
                return 0
            if requested is not None and time.monotonic() - requested > self.options.grace_period:
                return self._cut_off("grace period over")
            claimed: int | None = 0
            if trace.ON:
                trace.mark("round")
            first, self._first_round = self._first_round, False
            try:
                if (self._announced or first) and not stopping:
                    # New work woke us: its claim first, to its handler before the duties
                    # that fell due meanwhile (each a statement or more). The first round
                    # too: what waits already runs while the duties run (the first time
                    # all of them: reaping, sweeps, schedules, dependencies); what they
                    # make claimable is claimed in the round after, at once. Not where
                    # one write lock serves all (SQLite): the duties' writes would wait
                    # for the transaction of a handler the claim just started.
                    claimed = self._fill()
                    self._ran_duties(self.duties.run_due())
                else:
                    self._ran_duties(self.duties.run_due())
                    if not stopping:
                        claimed = self._fill()
                self.outage.went_through(connections[self.using].connection is not None)
            except DatabaseError as exc:
                self._database_down(exc)
            last_round = False
            if (self.options.burst and not stopping and claimed == 0 and not self._busy()
                    and not self.discovery.sweeping and self.outage.backoff == 0.0):
                if self.discovery.started > self._last_claim:
                    return self._burst_done()
                self.discovery.start(time.monotonic())  # rows may have become eligible since
                last_round = True  # its steps and one more claim, at once, not after a poll
            self.progress.show()
            self._wait(self._round_timeout(claimed, last_round))

    def _round_timeout(self, claimed: int | None, last_round: bool) -> float:
        """Seconds to wait for an event before the next round: none while claims bring
        work and a child has room, unless every source gave fewer units than asked
        (``_short``): a round at once would claim nothing new beside the units just
        started, and new work wakes the loop (NOTIFY, another connection's commit, the
        probe, a child's report, the poll)."""
        room = any(self._room(ch) or aio.room_beside(ch) for ch in self.children)
        again = bool(claimed) and room and not self._short
        timeout = 0.0 if again or last_round else self._idle_timeout()
        if self._claims_deferred:
            timeout = min(timeout, TRANSIENT_CLAIM_RETRY)
        return timeout

    # ----- claims and dispatch ------------------------------------------------------

    def _busy(self) -> bool:
        """Units are running or waiting in a child, or claimed ahead and waiting here."""
        return bool(len(self.prefetch)) or any(ch.sent for ch in self.children)

    def _room(self, ch: Child) -> int:
        """How many units to send ``ch`` now: a batch of ``Prefetch.depth`` units once it
        holds one batch or less, so the next batch waits in its pipe while it runs one (a
        child reports a batch when it is through). One unit at a time while units are not
        known to be short."""
        if ch.retiring or ch.stopping or ch.process.exitcode is not None:
            return 0
        if ch.sent and self._stuck(ch, time.monotonic()):
            return 0
        depth = self.prefetch.depth()
        if depth == 1:
            return 0 if ch.sent else 1
        # Units it ran whose records are on their way (``("ran", seq)``) take no room, up
        # to a batch more than two: a database that answers slowly slows the feed. Where
        # claims take long, it is topped up as many units sooner as it runs during one
        # (``Prefetch.cover``): it does not run out while we wait for the database.
        cover = self.prefetch.cover()
        return depth if (ch.open() <= depth + cover
                         and len(ch.sent) <= 3 * depth + cover) else 0

    def _feed(self) -> int:
        """Send each child with room units claimed ahead; returns the room left."""
        left = 0
        for ch in self.children:
            room = self._room(ch)
            if room and len(self.prefetch):
                batch = self.prefetch.take(room, self.caps.admit(ch, self.children))
                if batch:
                    self._dispatch(ch, batch)
                    room = self._room(ch)
            beside = aio.room_beside(ch)
            if beside and len(self.prefetch):
                batch = self.prefetch.take(beside, aio.admit(self.caps.admit(ch, self.children)))
                if batch:
                    self._dispatch(ch, batch)
                    beside = aio.room_beside(ch)
            left += max(room, beside)
        return left

    def _unstick(self, now: float) -> None:
        """Units waiting in a child behind one that runs long come back here: another child
        may run them, or they go back to the database when they waited too long."""
        back = [c for ch in self.children if self._stuck(ch, now) for c in ch.take_back()]
        self.prefetch.put(back, now, front=True)  # claimed before the ones waiting here

    def _stuck(self, ch: Child, now: float) -> bool:
        """Whether the unit ``ch`` runs has run too long for units to wait behind it."""
        running = ch.running()
        return running is not None and now - running[1] > self.prefetch.patience()

    def _fill(self) -> int | None:
        """Feed the children, from the units claimed ahead first, and claim more.

        Returns the number of units claimed, or None when no claim was tried (no child had
        room and enough units wait: nothing is known about what is claimable, so --burst
        keeps going).
        """
        now = time.monotonic()
        self._claims_deferred = False
        self._short = False
        if self.tasks is not None:  # before the pauses take their announcement
            self.tasks.listening = self.listener.fileno() is not None
            self.tasks.announced(self._announced)
        if self._announced and pausing.ANNOUNCEMENT not in self._announced:
            # New work was announced, so pauses and resumes are announced to this
            # supervisor too (LISTEN): their read by time, when due, is the safety net
            # against a missed announcement, and waits until the claims. Read first, it was
            # a round trip between the new unit and its handler in about half the rounds a
            # NOTIFY woke (bench/latency_trace.py through 5 ms: 10 of 15 tasks).
            claimed = self._claim_round(now)
            self._check_pauses(time.monotonic())
            return claimed
        self._check_pauses(now)
        return self._claim_round(now)

    def _claim_round(self, now: float) -> int | None:
        """``_fill``'s claims, once the pauses are known."""
        self._unstick(now)
        room = self._feed()
        self._give_back(self.prefetch.expired(now))
        ahead = self.prefetch.ahead()
        if not room and len(self.prefetch) > ahead // 2:
            return None
        want = room + ahead - len(self.prefetch)
        if want <= 0:
            return None
        held = self.prefetch.groups()
        for ch in self.children:
            for c in ch.sent.values():
                held[units.group(c)] += 1
        sources = self.sources
        start = self._rotation % len(sources)
        self._rotation += 1
        sources = sources[start:] + sources[:start]
        if self._announced:  # what woke us first: one claim sooner to its handler
            sources.sort(key=lambda source: not source.announced(self._announced))
            self._announced = set()
        claimed = 0
        for source in sources:
            key = source.key
            if (not self.options.burst
                    and now - self._found_short.get(key, -math.inf) < self.config.POLL_INTERVAL):
                continue  # short at its last claim, and nothing new announced for it
            began = time.monotonic()
            asked = want - claimed
            claims = self._claim(source, asked, held)
            if len(claims) < asked and not self._claims_deferred:
                self._found_short[key] = began
            else:
                self._found_short.pop(key, None)
            if claims:
                self.prefetch.claimed(time.monotonic() - began)
            if trace.ON:
                trace.mark("claimed", f"{len(claims)} of {source.name}")
            claimed += len(claims)  # work was found, even if it goes back below
            self.prefetch.put(claims, now)
            self._feed()
            if claimed >= want:
                break
        else:
            self._short = not self._claims_deferred
        if claimed:
            self._last_claim = time.monotonic()
        elif self._claims_deferred:
            return None  # nothing is known about what is claimable: --burst goes on
        return claimed

    def _check_pauses(self, now: float) -> None:
        """Read the pauses when due; units claimed ahead of what was paused since (waiting
        here or in a child's pipe) go back to the database: they were not started."""
        announced = pausing.ANNOUNCEMENT in self._announced
        self._announced.discard(pausing.ANNOUNCEMENT)
        if not self.pauses.refresh(now, announced=announced):
            return
        waiting = [c for ch in self.children for c in ch.take_back()]
        self.prefetch.put(waiting, now, front=True)  # claimed before the ones waiting here
        back = self.pauses.of(self.prefetch.units())
        for c in back:
            self.prefetch.remove(c)
        if back:
            log_event(logging.INFO, "gave_back", units=len(back), reason="paused")
            self._give_back(back)

    def _nothing_new(self, announced: set[str]) -> None:
        """What an announcement tells of the sources found short: new tasks, new rows (of
        every worker or of one); anything else (a pause, a resume) may change any."""
        workers = {w.name for w in self.options.workers}
        for payload in announced:
            if payload in (notify.TASKS, notify.KEYLESS_TASKS):
                self._found_short.pop(TASK_SOURCE, None)
            elif payload == "rows":
                for name in workers:
                    self._found_short.pop(name, None)
            elif payload in workers:
                self._found_short.pop(payload, None)
            else:
                self._found_short.clear()

    def _ran_duties(self, ran: bool) -> None:
        """Duties ran: they may have released units or made tasks ready (reaping,
        retries, schedules, dependencies), which a claim should find at once."""
        if ran:
            self._found_short.clear()

    def _dispatch(self, child: Child, batch: list[Unit]) -> None:
        if logger.isEnabledFor(logging.DEBUG):
            for c in batch:
                log_event(logging.DEBUG, "claimed", **units.describe(c), child=child.pid)
        try:
            child.dispatch(batch)
            if trace.ON:
                trace.mark("sent", f"{len(batch)} to {child.pid}")
        except OSError:  # the child is gone; its exit is handled by its sentinel
            self._give_back(batch)

    def _give_back(self, claimed: list[Unit]) -> None:
        """Unclaim units that never ran; retried later if the database does not answer."""
        if not claimed:
            return
        self._found_short.clear()  # claimable again
        try:
            units.unclaim(claimed)
        except DatabaseError:
            self.retry_unclaim.extend(claimed)
            raise

    def _may_write_now(self) -> bool:
        """Whether a write returns at once. On SQLite a running transactional handler holds
        the only write lock: the supervisor would wait for it, and could not cut it off
        after the grace period meanwhile. Nobody else can claim then either, so units
        claimed ahead are given back once no unit runs."""
        return not self.commits.active or not any(ch.sent for ch in self.children)

    def _give_back_now(self, claimed: list[Unit]) -> None:
        if claimed:
            log_event(logging.INFO, "gave_back", units=len(claimed),
                      reason="stopping: units claimed ahead go back at once")
        with contextlib.suppress(DatabaseError):  # retried by Retries
            self._give_back(claimed)

    def _claim(self, source: Source, want: int, held: Counter[str]) -> list[Unit]:
        """Claim up to ``want`` units of ``source``; ``held``: units running or waiting
        here per concurrency group, for a worker's own ``concurrency`` (``caps``)."""
        name = source.name
        if want <= 0 or self._broken.get(name, 0.0) > time.monotonic():
            return []
        raw = connections[self.using].connection  # to tell a reconnect from a live session
        try:
            return source.claim(want, held)
        except Exception as exc:  # one bad source stops only itself
            if self._retried(name, exc, "claim"):
                self._claims_deferred = True
                return []
            self._broken_source(name, exc, raw)
            return []

    def _sweep_failed(self, name: str, exc: Exception, raw: object = None) -> None:
        """A discovery step of worker ``name`` failed: tried again in a later round when
        another transaction's locks were the cause (SQLite's write lock held past
        MAIN_LOCK_WAIT, a deadlock), else the worker is left alone (``_broken_source``)."""
        if not self._retried(name, exc, "sweep"):
            self._broken_source(name, exc, raw)

    def _retried(self, name: str, exc: Exception, what: str) -> bool:
        """Whether ``exc`` is transient (``units.transient``): another transaction's locks,
        not the source's fault. Then a ``claim_retried`` or ``sweep_retried`` line says so,
        once per CLAIM_RETRIED_LOG_INTERVAL per source, and the step is tried again."""
        if not units.transient(exc):
            return False
        now = time.monotonic()
        key = f"{what}:{name}"
        if now >= self._retried_logged.get(key, -math.inf):
            self._retried_logged[key] = now + CLAIM_RETRIED_LOG_INTERVAL
            log_event(logging.INFO, f"{what}_retried", source=name,
                      error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                      retry_in=TRANSIENT_CLAIM_RETRY if what == "claim" else "next round",
                      next_log_in=CLAIM_RETRIED_LOG_INTERVAL)
        return True

    def _burst_done(self) -> int:
        if self._broken:
            log_event(logging.ERROR, "burst_incomplete", workers=",".join(sorted(self._broken)),
                      reason="their claims or sweeps failed; see claim_failed above")
            return 1
        return 0

    def _broken_source(self, name: str, exc: Exception, raw: object = None) -> None:
        """A claim failed: a lost connection stops everything; anything else only this source.

        A worker whose eligible queryset raises (a typo, a missing table) is skipped for a
        while and logged, so the other workers keep flowing. ``raw``: the DB-API connection
        the claim began on, if one was open: a session the server ended mid-claim is a lost
        connection even where leaving the claim's ``atomic()`` opened a new one, which
        answers (else the source was left alone for BROKEN_WORKER_PAUSE, 30 s).
        """
        if isinstance(exc, DatabaseError) and not connected(self.using, raw):
            raise exc
        log_event(logging.ERROR, "claim_failed", source=name,
                  error=f"{type(exc).__name__}: {str(exc).strip()[:300]}",
                  retry_in=BROKEN_WORKER_PAUSE)
        self._broken[name] = time.monotonic() + BROKEN_WORKER_PAUSE

    def _paused(self, name: str, now: float) -> bool:
        """Whether the source ``name`` is left alone after a failure (``_broken_source``)."""
        return self._broken.get(name, 0.0) > now

    # ----- periodic work --------------------------------------------------------------

    def _held(self) -> list[Unit]:
        """Units this supervisor holds: running or waiting in a child, claimed ahead, or
        to be released or given back (``Retries``). Read by ``Reaping`` in this loop."""
        held = [c for ch in self.children for c in ch.sent.values()]
        retried = [c for c, _ in self.retries.releases] + self.retries.unclaims
        return held + self.prefetch.units() + retried

    def _database_down(self, exc: DatabaseError) -> None:
        backoff = self.outage.failed(exc)
        with contextlib.suppress(DatabaseError):
            connections[self.using].close()
        self._wait(backoff)

    def _idle_timeout(self) -> float:
        now = time.monotonic()
        until_reap = self.reaping.every.left(now)
        poll = min(self.config.POLL_INTERVAL, self.discovery.left(now))
        expiry = self.prefetch.next_expiry(now)
        if expiry is not None:
            poll = min(poll, expiry)
        return max(0.0, min(poll, until_reap))

    # ----- children -------------------------------------------------------------------

    def _start_child(self, slot: int) -> Child:
        self.listener.close()  # a forked child must not share its socket; reopened on wait
        with self.renewer.paused():  # nor the renewer's connection: none open meanwhile
            child = pool.start(slot, self.using, self.options.max_tasks_per_child)
        log_event(logging.DEBUG, "child_started", slot=slot, child=child.pid)
        return child

    def _wait(self, timeout: float) -> None:
        handles: list = [self._wake_r]
        listening = self.listener.fileno()
        if listening is not None:
            handles.append(listening)
        for ch in self.children:
            handles += [ch.pipe, ch.process.sentinel]
        ready = self._wait_for(handles, timeout)
        if not ready or any(h != listening for h in ready):
            # A poll, a child's report or exit, a signal: what is claimable may have
            # changed in ways nobody announces (run_after reached, units released)
            self._found_short.clear()
        if listening is not None and listening in ready:
            announced = self.listener.drain()
            self._nothing_new(announced)
            self._announced |= announced  # the next loop claims these first
            if trace.ON:
                trace.mark("woke", ",".join(sorted(self._announced)))
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

    def _wait_for(self, handles: list, timeout: float) -> list:
        """Until a handle is ready or ``timeout`` passed; on SQLite also until another
        connection committed (``wakeups.Commits``), looked at every few milliseconds."""
        step = self.commits.INTERVAL
        if not self.commits.active or timeout <= step:
            return wait(handles, timeout)
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as selector:  # one for all the steps
            for handle in handles:
                selector.register(handle, selectors.EVENT_READ)
            while True:
                left = deadline - time.monotonic()
                ready = [key.fileobj for key, _ in selector.select(max(0.0, min(step, left)))]
                if ready or left <= step or self.commits.changed():
                    return ready

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
        if message[0] == "ran":  # run to its end, its record on the way: room
            ch.ran_upto = max(ch.ran_upto, message[1])
            return
        _, report, retiring = message
        ch.retiring = ch.retiring or retiring
        for seq, kind, *details in report:
            c = ch.reported(seq)
            if kind == "result":
                (result,) = details
                if result.outcome == RunOutcome.LEASE_LOST and c is not None:
                    # Its lease expired before it could record (this supervisor could not
                    # renew it): give it back now rather than when a reaper finds it.
                    # Fenced by the token: nothing changes if another process took it over.
                    self.retry_release.append((c, None))
                self.progress.add(result.outcome)
                self.prefetch.ran(result.seconds)
            elif kind == "db_error":
                unit, error = details
                log_event(logging.WARNING, "child_database_error", child=ch.pid,
                          unit=unit, error=error[:300])
                if c is not None:
                    self.retry_release.append((c, None))
            elif kind == "session_ended":
                # Its session ended and the database answered right after. Where our own
                # session lived through it, only the child's ended (a handler that ends its
                # session each time): released as a crash, so MAX_CRASHES ends it, never a
                # loop. Where ours ended too (a restart, a failover, every session
                # terminated), an outage: given back, nothing counted (``child.contain``).
                unit, error, since = details
                if not self._session_survived(since):
                    log_event(logging.WARNING, "child_database_error", child=ch.pid,
                              unit=unit, error=error[:300],
                              reason="every session ended, the supervisor's too")
                    if c is not None:
                        self.retry_release.append((c, None))
                    continue
                log_event(logging.WARNING, "unit_session_ended", child=ch.pid, unit=unit,
                          error=error[:300])
                self._crashed(c, FailureInfo(
                    SESSION_ENDED,
                    "the database session running this unit ended while it ran, and "
                    f"the database answered a new connection right after: {error[:500]}"))
            elif kind == "db_trouble":
                # The server's own state (disk full, read-only, a statement timeout), not
                # the unit's value: released as a crash, so one that meets it each time
                # is ended by MAX_CRASHES, never a loop; never FAILED at first sight.
                unit, error, exception_class = details
                log_event(logging.WARNING, "unit_database_trouble", child=ch.pid, unit=unit,
                          error=error[:300])
                self._crashed(c, FailureInfo(
                    exception_class,
                    "the database could not run or record this unit for a reason of its "
                    f"own, not the unit's value: {error[:500]}"))
            elif kind == "unrecordable":
                # Not even its fallback FAILED record could be written on a working
                # connection: released as a crash, so MAX_CRASHES ends it, never a loop.
                info, error = details
                log_event(logging.ERROR, "unit_unrecordable", child=ch.pid,
                          error=f"{info.exception_class}: {info.message}"[:300],
                          record_error=error[:300])
                self._crashed(c, FailureInfo(
                    info.exception_class,
                    f"{info.message}; and recording that failed too ({error[:500]})",
                    info.traceback))
        if self.stop_requested_at is not None and not ch.sent:
            ch.ask_to_stop()

    def _crashed(self, c: Unit | None, info: FailureInfo) -> None:
        """A unit a child reported lost to a crash (``info``): counted, and released as
        one (MAX_CRASHES ends a unit that does it each time)."""
        self.progress.add(RunOutcome.CRASHED)
        if c is not None:
            self.retry_release.append((c, info))

    def _session_survived(self, since: float) -> bool:
        """Whether this supervisor's own session began before the child's session that
        ended (``since``, when that one began: ``time.monotonic()`` is shared by a
        supervisor and its children) and still answers (one round trip; only when a child
        reports a session that ended): ours lived through the whole life of the child's,
        so that one ended alone. Not where ours began later (it ended too, or was
        replaced) or no longer answers (closed now: the next round opens a new one)."""
        connection = connections[self.using]
        opened = opened_at(self.using)
        if connection.connection is None or opened is None or opened > since:
            return False
        if connected(self.using):
            return True
        with contextlib.suppress(DatabaseError):
            connection.close()
        return False

    def _child_exited(self, ch: Child) -> None:
        self.children.remove(ch)
        ch.pipe.close()
        died, ran, never = ch.settle()
        self._after_child(ran, never)
        for c in died:  # several: async units that ran together (aio)
            how = describe_exit(ch.process.exitcode)
            crashed = FailureInfo(
                CHILD_DIED,
                f"the process running this unit (pid {ch.pid}) died while running it: {how}",
            )
            self.progress.add(RunOutcome.CRASHED)
            log_event(logging.ERROR, "child_died", **units.describe(c), child=ch.pid, reason=how)
            try:
                units.release(c, crashed=crashed, max_crashes=self.config.MAX_CRASHES)
            except DatabaseError:
                self.retry_release.append((c, crashed))
        if not died and not ch.retiring and not ch.stopping:
            log_event(logging.WARNING, "child_exited", child=ch.pid,
                      reason=describe_exit(ch.process.exitcode))
        if self.stop_requested_at is None:
            if not ch.retiring and time.monotonic() - ch.started < 1.0:
                time.sleep(0.5)  # a child that dies at once should not spin
            self.children.append(self._start_child(ch.slot))

    def _after_child(self, ran: list[Unit], never: list[Unit]) -> None:
        """Units of a child that exited, other than the one it died in: those it never
        started are given back; those it ran without reporting are released, fenced by
        their tokens: a no-op for those it recorded."""
        for c in ran:
            self.retry_release.append((c, None))
        with contextlib.suppress(DatabaseError):  # retried by Retries
            self._give_back(never)

    def _stop_child(self, ch: Child, c: Unit) -> bool:
        """Kill a child on purpose, for the unit ``c`` it runs (a task that timed out or was
        cancelled; the caller records it); replace it later. The units waiting behind ``c``
        go to another child. False if it no longer runs ``c``: nothing is killed."""
        self.prefetch.put(ch.take_back(), time.monotonic())  # now it starts nothing more
        running = [u for u, _ in ch.running_all()]
        if not any(u is c for u in running):
            return False
        for u in running:
            ch.forget(u)
        ch.retiring = True
        ch.kill()
        for u in running:  # async units beside it (aio): cut off, not their fault
            if u is not c:
                log_event(logging.WARNING, "cut_off", **units.describe(u),
                          reason="stopped with the unit beside it")
                self.retry_release.append((u, None))
        return True

    def _cut_off(self, why: str) -> int:
        for ch in self.children:
            ch.kill()
        cut = []
        for ch in self.children:
            died, ran, never = ch.settle()
            self.prefetch.put(never, time.monotonic())
            self.retry_release.extend((unit, None) for unit in ran)
            cut.extend(died)
        self._give_back_now(self.prefetch.drain())
        with contextlib.suppress(DatabaseError):
            self.retries.release_all()
        for c in cut:
            log_event(logging.WARNING, "cut_off", **units.describe(c), reason=why)
            try:
                units.release(c, crashed=None, max_crashes=self.config.MAX_CRASHES)
            except DatabaseError as exc:
                log_event(logging.ERROR, "release_failed", **units.describe(c),
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
        stopped = pool.stop_orphans()  # processes tasks started that outlived their child
        pool.release_orphans()
        if stopped:
            log_event(logging.WARNING, "orphans_stopped", pids=",".join(map(str, stopped)),
                      reason="processes started by tasks were still running at stop")

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
                      running=sum(len(ch.running_all()) for ch in self.children))
        else:
            self.hard_stop = True
            log_event(logging.WARNING, "stopping_now", signal=name)
