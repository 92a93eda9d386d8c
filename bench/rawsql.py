"""The reference: how fast can two processes drain a queue table with raw SQL, one row and
one commit per job? No Django, no ORM, nothing but the database driver.

    python bench/rawsql.py --db postgres|sqlite|mariadb --name <database> --rows 5000
                           [--processes 2]

Loads ``--rows`` ready rows into ``bench_raw_job`` (created here), then starts
``--processes`` processes that each loop until the queue is empty:

- PostgreSQL: ``BEGIN; SELECT id ... WHERE state = 'ready' ORDER BY id LIMIT 1 FOR UPDATE
  SKIP LOCKED; UPDATE ... SET state = 'done' WHERE id = ...; COMMIT`` (what a worker that
  holds its job's row lock while it runs does, with nothing to run);
- MariaDB: the same as PostgreSQL (InnoDB, READ COMMITTED as Django's connections use;
  no partial index there: the index is ``(state, id)``), mysqlclient;
- SQLite: the same in ``BEGIN IMMEDIATE`` (one writer at a time, WAL, synchronous=NORMAL).

Prints one JSON object: rows, processes, wall seconds (from the start of the processes to
the end of the last), jobs per second. ``throughput.py`` runs it beside ``runworkers``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

import benchlib

TABLE = "bench_raw_job"


def connect(db: str, name: str) -> Any:
    if db == "postgres":
        import psycopg

        return psycopg.connect(dbname=name, **benchlib.pg_connect_kwargs())
    if db == "mariadb":
        import MySQLdb

        connection = MySQLdb.connect(database=name, **benchlib.mysql_connect_kwargs())
        connection.cursor().execute(
            "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
        return connection
    import sqlite3

    connection = sqlite3.connect(name, isolation_level=None, timeout=30)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute("PRAGMA synchronous = NORMAL")
    return connection


def load(db: str, name: str, rows: int) -> None:
    c = connect(db, name)
    if db == "postgres":
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        c.execute(f"CREATE TABLE {TABLE} (id bigserial PRIMARY KEY, state text NOT NULL, "
                  "payload text)")
        c.execute(f"CREATE INDEX {TABLE}_ready ON {TABLE} (id) WHERE state = 'ready'")
        c.execute(f"INSERT INTO {TABLE} (state, payload) SELECT 'ready', 'payload ' || i "
                  "FROM generate_series(1, %s) i", [rows])
        c.commit()
        c.autocommit = True
        c.execute(f"VACUUM ANALYZE {TABLE}")
    elif db == "mariadb":
        cursor = c.cursor()
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cursor.execute(f"CREATE TABLE {TABLE} (id bigint AUTO_INCREMENT PRIMARY KEY, "
                       "state varchar(10) NOT NULL, payload text, "
                       f"INDEX {TABLE}_ready (state, id))")
        if rows:
            cursor.execute(f"INSERT INTO {TABLE} (state, payload) SELECT 'ready', "
                           f"CONCAT('payload ', seq) FROM seq_1_to_{int(rows)}")
        c.commit()
        cursor.execute(f"ANALYZE TABLE {TABLE}")
        cursor.fetchall()
    else:
        c.execute(f"DROP TABLE IF EXISTS {TABLE}")
        c.execute(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY, state text NOT NULL, "
                  "payload text)")
        c.execute(f"CREATE INDEX {TABLE}_ready ON {TABLE} (id) WHERE state = 'ready'")
        c.execute("BEGIN")
        c.executemany(f"INSERT INTO {TABLE} (state, payload) VALUES ('ready', ?)",
                      ((f"payload {i}",) for i in range(rows)))
        c.execute("COMMIT")
    c.close()


def work(db: str, name: str) -> int:
    """Drain the table one job per transaction; the number of jobs done."""
    c = connect(db, name)
    done = 0
    if db == "postgres":
        pick = (f"SELECT id FROM {TABLE} WHERE state = 'ready' ORDER BY id LIMIT 1 "
                "FOR UPDATE SKIP LOCKED")
        while True:
            row = c.execute(pick).fetchone()  # psycopg begins the transaction
            if row is None:
                c.rollback()
                return done
            c.execute(f"UPDATE {TABLE} SET state = 'done' WHERE id = %s", row)
            c.commit()
            done += 1
    if db == "mariadb":
        cursor = c.cursor()
        pick = (f"SELECT id FROM {TABLE} WHERE state = 'ready' ORDER BY id LIMIT 1 "
                "FOR UPDATE SKIP LOCKED")
        while True:
            cursor.execute("BEGIN")
            cursor.execute(pick)
            row = cursor.fetchone()
            if row is None:
                c.rollback()
                return done
            cursor.execute(f"UPDATE {TABLE} SET state = 'done' WHERE id = %s", row)
            c.commit()
            done += 1
    pick = f"SELECT id FROM {TABLE} WHERE state = 'ready' ORDER BY id LIMIT 1"
    while True:
        c.execute("BEGIN IMMEDIATE")
        row = c.execute(pick).fetchone()
        if row is None:
            c.execute("COMMIT")
            return done
        c.execute(f"UPDATE {TABLE} SET state = 'done' WHERE id = ?", row)
        c.execute("COMMIT")
        done += 1


def drain(db: str, name: str, rows: int, processes: int = 2, *,
          fill: bool = True) -> dict[str, Any]:
    """Load (unless done already), then time ``processes`` raw workers until the table
    is drained."""
    if fill:
        load(db, name, rows)
    command = [sys.executable, __file__, "--db", db, "--name", name, "--work"]
    started = time.perf_counter()
    running = [subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
               for _ in range(processes)]
    done = sum(int(p.communicate()[0] or 0) for p in running)
    wall = time.perf_counter() - started
    if done != rows or any(p.returncode for p in running):
        raise RuntimeError(f"raw SQL workers did {done} of {rows} jobs")
    return {"rows": rows, "processes": processes, "wall_s": round(wall, 3),
            "jobs_per_s": round(rows / wall)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=list(benchlib.DATABASES), required=True)
    parser.add_argument("--name", required=True, help="database name (SQLite: file path)")
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--work", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.work:
        print(work(args.db, args.name))
        return
    print(json.dumps(drain(args.db, args.name, args.rows, args.processes)))


if __name__ == "__main__":
    main()
