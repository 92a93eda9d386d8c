"""What a database error says about the unit whose statement met it: written once, for
every path that records a unit (a handler's completion, the batched completions of tasks,
the records written behind, the one-by-one fallback, failures, releases, progress).

Each database's codes are its engine's (``Engine.connection_gone``, ``session_lost``,
``transient``, ``server_trouble``); docs/bad-input.md has the table. Only ``VALUE`` is the
unit's fault: the database refused a value it was sent, on a session that is still there,
and that unit's FAILED record says so. Every other kind gives the unit back:

- ``GONE``: the connection or the server went away (a restart, a failover, a terminated
  session, a network failure). An outage for every unit recorded through that connection,
  whichever call saw it first: the unit runs again (a plain task at least once, a
  transactional unit's writes rolled back with it), never FAILED.
- ``SESSION``: the session is there but lost something of ours (PostgreSQL's prepared
  statements) or psycopg could not read the server's answer: given back, a new session.
- ``TRANSIENT``: the same statements may simply not meet it again (a deadlock, a
  serialization failure, a lock wait timeout, SQLite's write lock past its busy timeout).
- ``SERVER``: the server's own state (out of disk, memory or connections, read-only, a
  statement cancelled or past its time limit): given back as a crash, so a unit that meets
  it every time is ended by ``MAX_CRASHES`` instead of looping.
"""

from __future__ import annotations

from typing import Any

from django.db import DatabaseError, OperationalError

from .. import conf
from . import engine
from .connections import UNSET, connected

GONE = "gone"
SESSION = "session"
TRANSIENT = "transient"
SERVER = "server"
VALUE = "value"


def transient(exc: BaseException, using: str | None = None) -> bool:
    """A database error no unit's value causes, that the same statements may meet no
    more: SQLite's write lock still held after its busy timeout, a deadlock or
    serialization failure (PostgreSQL's class 40), MariaDB's and MySQL's deadlock or lock
    wait timeout (the engine's ``transient``)."""
    if not isinstance(exc, OperationalError):
        return False
    text = str(exc)
    state = getattr(exc.__cause__, "sqlstate", None) or ""
    if "database is locked" in text or "database table is locked" in text \
            or state.startswith("40"):
        return True
    return engine(using).transient(exc)


def gone(exc: BaseException, using: str | None = None, raw: Any = UNSET) -> bool:
    """Whether ``exc`` says the connection or the server went away: by its code (the
    engine's ``connection_gone``), or, given ``raw`` (the DB-API connection the statement
    began on; None: whichever is open), because that connection no longer answers."""
    if not isinstance(exc, DatabaseError):
        return False
    if engine(using).connection_gone(exc):
        return True
    return raw is not UNSET and not transient(exc, using) and not connected(
        using or conf.get().DATABASE, raw)


def classify(exc: BaseException, using: str | None = None, raw: Any = UNSET) -> str:
    """One of ``GONE``, ``SESSION``, ``TRANSIENT``, ``SERVER``, ``VALUE`` for a database
    error met while running or recording a unit (anything else is ``VALUE``: the unit's)."""
    if not isinstance(exc, DatabaseError):
        return VALUE
    if transient(exc, using):
        return TRANSIENT
    if gone(exc, using, raw):
        return GONE
    db = engine(using)
    if db.session_lost(exc):
        return SESSION
    if db.server_trouble(exc):
        return SERVER
    return VALUE

