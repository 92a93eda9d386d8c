"""What keeps the database from cleaning up after the units: the oldest open transaction
of another connection (PostgreSQL's MVCC horizon, ``backend_xmin``; InnoDB's oldest read
view), the dead row versions of our tables (PostgreSQL) and InnoDB's history list.

A unit that finishes leaves a dead row version behind (its old state); VACUUM (PostgreSQL)
or purge (InnoDB) removes those that no open transaction can still see. One session left
"idle in transaction" for an hour keeps every dead version of that hour, in every table:
the claim index grows, each claim steps over more dead entries, and the units queue up
while nothing looks wrong. The health view, the metrics and ``dbworker stats`` say who holds
it, and warn past ``DBWORKER["HEALTH_MAX_TRANSACTION_AGE"]``. docs/operating.md, "The
database's horizon", says what to do."""

from __future__ import annotations

from typing import Any

from django.db import connections

from .. import conf
from ..db import engine_for
from ..models import Execution, TaskRecord

#: The tables whose dead rows are reported: where the units live.
UNITS = (Execution._meta.db_table, TaskRecord._meta.db_table)


def read(using: str | None = None) -> dict[str, Any]:
    """``oldest_transaction`` (``seconds``, ``holder``, ``pid``, ``state``; None: there
    is none, or the database does not say), ``dead_rows`` by table (PostgreSQL; else
    None), ``history_length`` (MariaDB/MySQL; else None). The server's own views only."""
    connection = connections[using or conf.get().DATABASE]
    return engine_for(connection).horizon(connection, UNITS)


def warnings(horizon: dict[str, Any], limit: float | None = None) -> list[str]:
    """A sentence naming the holder when the oldest transaction is older than ``limit``
    (default: ``DBWORKER["HEALTH_MAX_TRANSACTION_AGE"]``; None: never)."""
    if limit is None:
        limit = conf.get().HEALTH_MAX_TRANSACTION_AGE
    oldest = horizon.get("oldest_transaction")
    if limit is None or oldest is None or oldest["seconds"] <= limit:
        return []
    pid = "" if oldest["pid"] is None else f", pid {oldest['pid']}"
    return [f"a transaction has been open {oldest['seconds']:.0f}s ({oldest['holder']!r}"
            f"{pid}, {oldest['state']}): the database keeps every row version it may still "
            "see, so dead rows pile up in the units' tables and indexes; end it "
            f"(docs/operating.md). DBWORKER['HEALTH_MAX_TRANSACTION_AGE'] is {limit:g}s"]
