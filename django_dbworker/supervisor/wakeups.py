"""Wake-ups of an idle supervisor: listening for announcements where the engine notifies
(PostgreSQL's LISTEN) and commit watching where it can tell (SQLite); and what a supervisor
behind a transaction-pooling pooler does without (``behind_transaction_pooler``)."""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any

from django.db import connections

from .. import conf
from ..db import engine_for, pooler, prepared
from ..db.notify import CHANNEL, enabled
from ..logs import log_event

#: Seconds before LISTEN is tried again after it failed: doubling from the first to the last.
RETRY = (1.0, 30.0)


def behind_transaction_pooler(using: str) -> bool | None:
    """Ask once, at start-up, whether ``using`` is reached through a transaction-pooling
    pooler (``db/pooler.py``); if so, this supervisor does not LISTEN (it would listen on
    a server connection other clients get next) and neither it nor its children prepare
    statements, whatever ``DBWORKER`` says: they poll every ``POLL_INTERVAL``. Logged once
    (``transaction_pooler``). Never fatal: an error leaves everything as configured."""
    if not engine_for(connections[using]).notifies:
        return False
    try:
        pooled = pooler.transaction_pooled(using)
    except Exception as exc:  # unreachable now: the main loop's outage handling copes
        log_event(logging.WARNING, "pooler_unknown", error=str(exc).strip()[:200])
        return None
    if pooled:
        prepared.turn_off()
        config = conf.get()
        on = [f"DBWORKER[{key!r}] = False" for key in ("NOTIFY", "PREPARED_STATEMENTS")
              if getattr(config, key)]
        log_event(logging.WARNING, "transaction_pooler", listen="off",
                  prepared_statements="off", fallback="polling",
                  hint=f"set {' and '.join(on)} (check django_dbworker.W005)" if on else "")
    return pooled


class Listener:
    """A connection of its own listening on our channel (``Engine.listen``).

    When listening cannot be set up (the database is down, a pooler refuses it) the supervisor
    polls; LISTEN is tried again after 1 s, doubling up to 30 s, and the failure is logged
    once (``listen_failed``) until it works again (``listening``).
    """

    def __init__(self, using: str) -> None:
        self.using = using
        self.active = enabled(using)
        self._conn: Any = None
        self._retry_at = 0.0
        self._delay = 0.0
        self._failures = 0

    def fileno(self) -> int | None:
        """The socket to wait on, connecting first if needed; None without LISTEN."""
        if self.active and pooler.known(self.using):
            self.active = False  # behind a transaction pooler (``behind_transaction_pooler``)
        if not self.active:
            return None
        if (self._conn is None or self._conn.closed) and time.monotonic() >= self._retry_at:
            self._connect()
        return None if self._conn is None or self._conn.closed else self._conn.fileno()

    def drain(self) -> set[str]:
        """The payloads announced since the last call."""
        if self._conn is None:
            return set()
        try:
            return self._conn.received()
        except Exception as exc:  # a lost LISTEN falls back to polling
            log_event(logging.WARNING, "listen_lost", error=str(exc)[:200])
            self.close()
            return set()

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def _connect(self) -> None:
        connection = connections[self.using]
        try:
            self._conn = engine_for(connection).listen(connection, CHANNEL)
        except Exception as exc:  # polling still works without it
            self.close()
            self._delay = min(max(self._delay * 2, RETRY[0]), RETRY[1])
            self._retry_at = time.monotonic() + self._delay
            self._failures += 1
            if self._failures == 1:
                log_event(logging.WARNING, "listen_failed", error=str(exc)[:200],
                          fallback="polling", retry_in=self._delay)
            return
        if self._failures:
            log_event(logging.WARNING, "listening", after_failures=self._failures)
        self._failures, self._delay = 0, 0.0


class Commits:
    """Has another connection committed since we last looked (``Engine.commit_counter``)?

    SQLite cannot announce work, but ``PRAGMA data_version`` tells, from shared memory and
    for a few microseconds, whether any other connection committed to the database. An
    idle supervisor checks it every ``INTERVAL`` seconds and claims when it changed, so new
    work starts within tens of milliseconds while it still claims only when something was
    written; ``POLL_INTERVAL`` polling stays as the fallback.
    """

    INTERVAL = 0.05

    def __init__(self, using: str) -> None:
        self.using = using
        self.active = engine_for(connections[using]).watches_commits
        self._seen: int | None = None

    def changed(self) -> bool:
        if not self.active:
            return False
        try:
            # An idle supervisor asks twenty times a second: the engine reads it cheaply.
            connection = connections[self.using]
            version = engine_for(connection).commit_counter(connection)
        except Exception:  # polling (and the next claim) will meet the broken database
            return False
        changed = self._seen is not None and version != self._seen
        self._seen = version
        return changed
