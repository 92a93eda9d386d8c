"""Wake-ups on PostgreSQL: NOTIFY when work appears, so idle supervisors claim at once.

``announce()`` runs inside the writer's transaction: PostgreSQL delivers the notification
when (and only if) it commits. Supervisors LISTEN on a connection of their own
(``supervisor/wakeups.py``) and keep polling every ``POLL_INTERVAL`` as the fallback for
rows written by other programs, SQLite, and poolers that cannot LISTEN.
"""

from __future__ import annotations

from django.db import connections

from .. import conf

CHANNEL = "dbworker"


def enabled(using: str) -> bool:
    return connections[using].vendor == "postgresql" and conf.get().NOTIFY


def announce(using: str, what: str) -> None:
    """Tell listening supervisors that ``what`` (a worker name, or ``task``) has work."""
    if not enabled(using):
        return
    with connections[using].cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [CHANNEL, what])
