"""The flush between transactional tests (pytest-django's ``transactional_db``, Django's
``TransactionTestCase``), made cheap where Django's is slow; the test database is still the
real one, emptied for real.

Django empties every table after each transactional test and then sends ``post_migrate``,
which writes the content types and permissions again. Measured on the 2-CPU CI machine
with the suite's 29 tables, under the CI's load:

- PostgreSQL's ``TRUNCATE`` of every table takes 0.3-0.5 s (each table and index gets a new
  file, and the old ones are unlinked at commit), where a ``DELETE`` of the few rows a test
  wrote takes about 0.01 s; about a thousand transactional tests ran on PostgreSQL, so the
  flush alone was some 400 s of the suite's 1,270 s.
- ``post_migrate`` after the content types and permissions were emptied takes 0.08-0.23 s
  (MariaDB the most); with them kept, it only reads them (0.02-0.1 s).

So, installed for the test run's connections (``install``):

- the content types and permissions are kept (``KEEP``): what ``post_migrate`` would write
  back the same;
- on PostgreSQL a table no test wrote since it was last emptied (no page: size 0) is left
  alone; one with a few pages is emptied by ``DELETE``; one past ``BIG`` bytes (with its
  indexes) by ``TRUNCATE``, so that dead rows never pile up in a table (autovacuum is off
  on the test server, and the plan tests read plans of small tables).
- MariaDB's ``TRUNCATE`` (0.02 s for all) and SQLite's ``DELETE`` stay as Django writes them.
"""

from __future__ import annotations

from typing import Any

#: Tables kept between tests: ``post_migrate`` would write the same rows back.
KEEP = frozenset({"django_content_type", "auth_permission"})
#: Bytes (a table with its indexes and TOAST) past which PostgreSQL's table is truncated.
BIG = 512 * 1024


def install(connection: Any) -> None:
    """Make ``connection``'s flush the cheaper one described above (once per class)."""
    ops_class = type(connection.ops)
    if getattr(ops_class, "_dbworker_test_flush", False):
        return
    original = ops_class.sql_flush

    def sql_flush(self: Any, style: Any, tables: Any, *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        tables = [t for t in tables if t not in KEEP]
        if reset_sequences or self.connection.vendor != "postgresql" or not tables:
            return original(self, style, tables, reset_sequences=reset_sequences,
                            allow_cascade=allow_cascade)
        return _postgresql(self, tables)

    ops_class.sql_flush = sql_flush
    ops_class._dbworker_test_flush = True


def _postgresql(ops: Any, tables: list[str]) -> list[str]:
    with ops.connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.relname, pg_relation_size(c.oid), pg_total_relation_size(c.oid) "
            "FROM pg_class c WHERE c.relkind = 'r' AND c.relname = ANY(%s) "
            "AND pg_table_is_visible(c.oid)", [tables])
        sizes = {name: (size, total) for name, size, total in cursor.fetchall()}
    q = ops.quote_name
    written = [t for t in tables if sizes.get(t, (0, 0))[0] > 0]  # no page: never written
    big = [t for t in written if sizes[t][1] > BIG]
    small = [t for t in written if t not in big]
    statements = ["SET CONSTRAINTS ALL DEFERRED"]
    if big:  # CASCADE: what references them is emptied too (it is being flushed anyway)
        statements.append(f"TRUNCATE {', '.join(q(t) for t in big)} CASCADE")
    statements += [f"DELETE FROM {q(t)}" for t in small]
    return statements
