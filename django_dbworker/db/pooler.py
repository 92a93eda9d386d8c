"""Is our database reached through a transaction-pooling connection pooler (PgBouncer with
``pool_mode = transaction``)?

Behind one, each transaction of a client connection may run on another server connection,
so what lives in a session does not last: ``LISTEN`` (the notifications go to whichever
client uses that server connection next, and pile up in its psycopg backlog), SQL-level
prepared statements, session ``SET`` commands (they stay on the server connection, for the
next client), ``WITH HOLD`` cursors. ``runworkers`` asks once, at start-up
(``transaction_pooled``): behind such a pooler it neither LISTENs nor prepares, whatever the
settings say, and system check ``django_dbworker.W005`` warns about the settings.

How it is told (PostgreSQL; ``PostgreSQL.transaction_pooled``), with two short-lived
connections of the database's settings and three to seven one-row queries:

1. A server's BackendKeyData carries the backend's process id: psycopg's
   ``info.backend_pid`` equals ``SELECT pg_backend_pid()`` on a direct connection. A
   pooler answers the start-up itself, with a key of its own (PgBouncer: random): they
   differ. Equal: no pooler (False).
2. Behind a pooler, a second client connection is opened while the first stays open, and
   each asks ``pg_backend_pid()`` in turn, outside a transaction. A session pooler pins a
   server connection to each client connection for its whole life: the two never share a
   backend, and one client's backend never changes. A transaction pooler gives the
   backend back after each transaction, and PgBouncer hands out the one given back last:
   the second client gets the first one's backend (True).
3. Different backends every time (three rounds): a session pooler, or a transaction pool
   so busy that another client took the backend in between: unknown (None), and nothing
   is changed.

Not used: ``SHOW pool_mode`` (PgBouncer answers ``SHOW`` only on its admin database, which
needs an admin user); ``application_name`` (PgBouncer passes the client's on); the
``server_version`` parameter (PgBouncer reports the server's); ``inet_server_port()``
(the server's own port, whatever the client dialled). A pooler that forwards the server's
key (none in transaction mode can: the server changes) would read as no pooler.
"""

from __future__ import annotations

from django.db import connections

from . import engine_for

_found: dict[str, bool | None] = {}


def transaction_pooled(using: str, *, fresh: bool = False) -> bool | None:
    """Whether database alias ``using`` is reached through a transaction-pooling pooler
    (None: cannot tell). Asked once per process and alias (a forked child inherits the
    answer) unless ``fresh``; raises ``DatabaseError`` when the database is unreachable."""
    if fresh or using not in _found:
        connection = connections[using]
        _found[using] = engine_for(connection).transaction_pooled(connection)
    return _found[using]


def known(using: str) -> bool | None:
    """What ``transaction_pooled`` found in this process, without asking (None: not asked,
    or unknown)."""
    return _found.get(using)
