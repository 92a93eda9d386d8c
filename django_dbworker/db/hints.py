"""Index hints where a guard cannot keep an index out: MariaDB and MySQL.

PostgreSQL and SQLite keep a query off a partial index whose condition it does not state
(the every-queue claim index carries such a guard: ``models.ANY_QUEUE_GUARD``). MariaDB
and MySQL have no partial indexes: their flag-led indexes (``db.partial``) match any query
that names the flag, and their optimizer may take the every-queue index for a claim of one
queue, then walk past every other queue's waiting tasks that come first in claim order (a
paused queue's backlog: 10,000 rows read per claim). There the query names the index it
must not use (``IGNORE INDEX``); elsewhere the SQL is Django's own.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.db.models.sql.datastructures import BaseTable


class _WithoutIndex(BaseTable):
    """The query's base table, ``IGNORE INDEX (index)`` after it on MariaDB/MySQL."""

    def __init__(self, table_name: str, alias: str | None, index: str) -> None:
        super().__init__(table_name, alias)
        self.index = index

    def relabeled_clone(self, change_map: dict[str | None, str]) -> _WithoutIndex:
        return _WithoutIndex(self.table_name, change_map.get(self.table_alias, self.table_alias),
                             self.index)

    def as_mysql(self, compiler: Any, connection: Any) -> tuple[str, Any]:
        sql, params = self.as_sql(compiler, connection)
        return f"{sql} IGNORE INDEX ({compiler.quote_name(self.index)})", params


def without_index[QS: QuerySet[Any, Any]](qs: QS, index: str) -> QS:
    """``qs`` whose base table MariaDB/MySQL must not read through ``index`` (an index of
    the table that exists there: ``IGNORE INDEX`` of a missing one is an error)."""
    qs = qs.all()
    query = qs.query
    alias = query.get_initial_alias()
    table = query.alias_map[alias]
    query.alias_map[alias] = _WithoutIndex(table.table_name, table.table_alias, index)
    return qs
