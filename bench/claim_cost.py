"""Does a claim cost the same with a million finished rows as with a thousand?

    .venv/bin/python bench/claim_cost.py [--db postgres|sqlite|mariadb|all] [--iterations 200]

For each database, in a database of its own (PostgreSQL and MariaDB:
``dbworker_bench_<pid>``, created and dropped; SQLite: a temporary file), two tables are
measured, both with 1,000 units waiting:

- small: 1,000 source rows, all 1,000 pending;
- large: 1,000,000 source rows, the newest 1,000 pending, the other 999,000 FINISHED.

Each for a pk-ordered worker (``by_pk``) and a worker ordered by another indexed column
(``by_priority``), claiming 1 and 10 units at a time. Two figures per case, in µs:

- ``claim``: the whole ``planner.claim()`` call as the supervisor makes it (build and compile
  the query, the claim's statements (``Engine.claim``), COMMIT). The claimed units are then
  put back (not timed), so every repetition sees the same table.
- ``statement``: only the statement that finds the candidates, on the database (execute +
  fetch), inside a transaction that is rolled back: on PostgreSQL the whole claim (one
  UPDATE), on SQLite and MariaDB the candidate SELECT (MariaDB: ``... FOR UPDATE SKIP
  LOCKED``; the UPDATE of the ids it found, by primary key, and on MariaDB the SELECT of
  what the claim returns, are in ``claim``).

A count that does not wobble with the machine, per case: PostgreSQL's shared buffers
(``EXPLAIN (ANALYZE, BUFFERS)``), MariaDB's handler reads (the ``Handler_read_%`` session
counters the candidate statement adds: index entries and rows InnoDB handed to the server).

Loading (not measured): the rows with one ``INSERT ... SELECT`` (PostgreSQL:
``generate_series``; MariaDB: the sequence engine's ``seq_1_to_<n>``; SQLite:
``executemany``), the executions with ``INSERT ... SELECT`` from the rows; then PostgreSQL
``VACUUM (ANALYZE)``, MariaDB ``ANALYZE TABLE``, SQLite nothing (``--sqlite-analyze``).

Writes bench/results/claim_cost.json (with the plans: EXPLAIN ANALYZE on PostgreSQL,
``ANALYZE FORMAT=JSON`` on MariaDB, EXPLAIN QUERY PLAN on SQLite) and prints a Markdown
table. Target: large within 1.5x of small.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import benchlib

SIZES = {"small": 1_000, "large": 1_000_000}
PENDING = 1_000
LIMITS = (1, 10)
WORKERS = {"by_pk": "pk", "by_priority": "priority (indexed column)"}
TARGET = 1.5
LEASE = 60.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--large", type=int, default=SIZES["large"],
                        help="source rows of the large table (default 1,000,000)")
    parser.add_argument("--sqlite-analyze", action="store_true",
                        help="run ANALYZE on SQLite too (Django never does; default: no)")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = {"small": SIZES["small"], "large": args.large}
    config = {
        "sizes": sizes,
        "pending": PENDING,
        "limits": list(LIMITS),
        "iterations": args.iterations,
        "warmup": args.warmup,
        "workers": WORKERS,
        "lease_seconds": LEASE,
        "analyze": {"postgres": "VACUUM (ANALYZE) after loading",
                    "mariadb": "ANALYZE TABLE after loading", "sqlite": args.sqlite_analyze},
        "target_max_ratio": TARGET,
    }
    if args.child:
        result = measure_database(args.child, sizes, args)
        Path(args.out).write_text(json.dumps(result))
        return
    dbs = benchlib.chosen(args.db)
    passed = [f"--iterations={args.iterations}", f"--warmup={args.warmup}",
              f"--large={args.large}", *(["--sqlite-analyze"] if args.sqlite_analyze else [])]
    found = benchlib.per_database(Path(__file__), dbs, passed)
    rows = [row for db in dbs for row in found[db]["rows"]]
    ratios = ratios_of(rows)
    path = benchlib.write_results("claim_cost.json", {
        "benchmark": "claim_cost",
        "machine": benchlib.machine(),
        "config": config,
        "figures_unit": "microseconds",
        "ratios": ratios,
        "target_met": all(r["claim_ok"] and r["statement_ok"] for r in ratios),
        "rows": rows,
        "plans": {db: found[db]["plans"] for db in dbs},
    })
    print(report(ratios))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


# ----- in the child: one kind of database -------------------------------------------------


def measure_database(db: str, sizes: dict[str, int], args: argparse.Namespace) -> dict[str, Any]:
    """Load the small table into database ``default`` and the large one into ``large``, then
    measure them alternately, so that whatever else the machine does hits both alike."""
    rows: list[dict[str, Any]] = []
    plans: dict[str, dict[str, str]] = {}
    with (benchlib.scratch_database(db, "small") as small,
          benchlib.scratch_database(db, "large") as large):
        benchlib.setup_django(db, small, large)
        aliases = {"small": "default", "large": "large"}
        for label, size in sizes.items():
            started = time.monotonic()
            benchlib.load_rows(size, aliases[label])
            for worker_name in WORKERS:
                benchlib.load_executions(worker_name, size, PENDING, aliases[label])
            if db != "sqlite" or args.sqlite_analyze:
                benchlib.analyze(aliases[label])
            print(f"{db}: {label} table ({size:,} rows, {PENDING:,} pending per worker) "
                  f"loaded in {time.monotonic() - started:.1f}s", file=sys.stderr, flush=True)
        for worker_name in WORKERS:
            for label, alias in aliases.items():
                plans.setdefault(worker_name, {})[label] = plan(worker_name, 10, alias)
            for limit in LIMITS:
                if db == "postgres":
                    for alias in aliases.values():  # every series starts without dead rows
                        benchlib.analyze(alias)
                claim = time_alternately(time_claim, worker_name, limit, aliases, args)
                stmt = time_alternately(time_statement, worker_name, limit, aliases, args)
                for label, alias in aliases.items():
                    rows.append({
                        "db": db, "worker": worker_name, "ordering": WORKERS[worker_name],
                        "limit": limit, "table": label, "source_rows": sizes[label],
                        "pending": PENDING,
                        "claim_us": benchlib.summary(claim[label]),
                        "statement_us": benchlib.summary(stmt[label]),
                        "buffers": buffers(worker_name, limit, alias),
                    })
                    print(f"  {worker_name} limit={limit} {label}: claim() "
                          f"{rows[-1]['claim_us']['median']}µs, statement "
                          f"{rows[-1]['statement_us']['median']}µs", file=sys.stderr, flush=True)
    return {"rows": rows, "plans": plans}


def time_alternately(timer: Any, worker_name: str, limit: int, aliases: dict[str, str],
                     args: argparse.Namespace) -> dict[str, list[int]]:
    """``timer`` on each database in turn (the order flips every round); samples in ns."""
    samples: dict[str, list[int]] = {label: [] for label in aliases}
    order = list(aliases.items())
    for i in range(args.warmup + args.iterations):
        for label, alias in order if i % 2 else order[::-1]:
            elapsed = timer(worker_name, limit, alias)
            if i >= args.warmup:
                samples[label].append(elapsed)
    return samples


def time_claim(worker_name: str, limit: int, alias: str) -> int:
    """Nanoseconds of one whole ``planner.claim()`` call; the claim is put back afterwards."""
    from django_dbworker.rows import planner
    from django_dbworker.rows.registry import workers
    from django_dbworker.units.claimant import Claimant

    benchlib.use_database(alias)
    claimant = Claimant(pid=os.getpid())
    started = time.perf_counter_ns()
    claims = planner.claim(workers[worker_name], limit, claimant, LEASE)
    elapsed = time.perf_counter_ns() - started
    if len(claims) != limit:
        raise RuntimeError(f"claimed {len(claims)} units of {worker_name}, not {limit}")
    put_back([c.execution_id for c in claims], alias)
    return elapsed


def put_back(execution_ids: list[int], alias: str) -> None:
    """Undo a claim exactly: the units are PENDING again, as if never claimed."""
    from django.db.models import F

    from django_dbworker.models import Execution, State

    Execution.objects.using(alias).filter(id__in=execution_ids).update(
        state=State.PENDING, token=None, supervisor_id=None, claimed_host="",
        claimed_pid=None, attempts=F("attempts") - 1, started_at=None, finished_at=None,
        lease_expires_at=None,
    )


def statement(worker_name: str, limit: int, alias: str) -> tuple[str, list[Any]]:
    """The first (PostgreSQL: the only) statement ``planner.claim()`` would send now (call
    inside a transaction): the one that finds the candidates."""
    from django.utils import timezone

    from django_dbworker.rows import store
    from django_dbworker.rows.registry import workers
    from django_dbworker.units.claimant import Claimant

    benchlib.use_database(alias)
    now = timezone.now()
    return store.claim_sql(workers[worker_name], limit, Claimant(pid=os.getpid()),
                           token=uuid.uuid4(), now=now, expires=now + timedelta(seconds=LEASE))


def time_statement(worker_name: str, limit: int, alias: str) -> int:
    """Nanoseconds of the claim statement alone (execute + fetch), rolled back."""
    from django.db import connections, transaction

    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        sql, params = statement(worker_name, limit, alias)
        cursor.execute("SELECT 1")  # the transaction has begun before the clock starts
        started = time.perf_counter_ns()
        cursor.execute(sql, params)
        claimed = cursor.fetchall()
        elapsed = time.perf_counter_ns() - started
        transaction.set_rollback(True, using=alias)
    if len(claimed) != limit:
        raise RuntimeError(f"claimed {len(claimed)} units of {worker_name}, not {limit}")
    return elapsed


def plan(worker_name: str, limit: int, alias: str) -> str:
    """PostgreSQL: EXPLAIN (ANALYZE, BUFFERS) of the claim, rolled back. MariaDB: ANALYZE
    FORMAT=JSON of the candidate SELECT (it runs), rolled back. SQLite: the EXPLAIN QUERY
    PLAN lines."""
    from django.db import connections, transaction

    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        sql, params = statement(worker_name, limit, alias)
        if connections[alias].vendor == "postgresql":
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", params)
            lines = [row[0] for row in cursor.fetchall()]
        elif connections[alias].vendor == "mysql":
            cursor.execute(f"ANALYZE FORMAT=JSON {sql}", params)
            lines = [row[0] for row in cursor.fetchall()]
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}", params)
            lines = [row[-1] for row in cursor.fetchall()]
        transaction.set_rollback(True, using=alias)
    return "\n".join(lines)


def buffers(worker_name: str, limit: int, alias: str) -> int | None:
    """PostgreSQL: shared buffers one claim statement touches (hit + read), rolled back.

    A count of pages, not a time: it does not wobble with the machine's load.
    """
    from django.db import connections, transaction

    if connections[alias].vendor == "mysql":
        return handler_reads(worker_name, limit, alias)
    if connections[alias].vendor != "postgresql":
        return None
    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        sql, params = statement(worker_name, limit, alias)
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
        document = cursor.fetchone()[0]
        transaction.set_rollback(True, using=alias)
    top = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0))


def handler_reads(worker_name: str, limit: int, alias: str) -> int:
    """MariaDB: the ``Handler_read_%`` session counters one candidate statement adds
    (index entries and rows read), rolled back; what reading the counters adds is taken
    off (measured the same way with no statement in between)."""
    from django.db import connections, transaction

    def counters(cursor: Any) -> int:
        cursor.execute("SHOW SESSION STATUS LIKE 'Handler_read%%'")
        return sum(int(value) for _, value in cursor.fetchall())

    with transaction.atomic(using=alias), connections[alias].cursor() as cursor:
        sql, params = statement(worker_name, limit, alias)
        first = counters(cursor)
        overhead = counters(cursor) - first
        before = counters(cursor)
        cursor.execute(sql, params)
        cursor.fetchall()
        after = counters(cursor)
        transaction.set_rollback(True, using=alias)
    return after - before - overhead


# ----- in the parent: the report --------------------------------------------------------------


def ratios_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_case: dict[tuple[str, str, int], dict[str, dict[str, Any]]] = {}
    for row in rows:
        by_case.setdefault((row["db"], row["worker"], row["limit"]), {})[row["table"]] = row
    ratios = []
    for (db, worker_name, limit), tables in by_case.items():
        small, large = tables["small"], tables["large"]
        claim = large["claim_us"]["median"] / small["claim_us"]["median"]
        stmt = large["statement_us"]["median"] / small["statement_us"]["median"]
        ratios.append({
            "db": db, "worker": worker_name, "ordering": WORKERS[worker_name], "limit": limit,
            "claim_small_us": small["claim_us"]["median"],
            "claim_large_us": large["claim_us"]["median"],
            "claim_ratio": round(claim, 2), "claim_ok": claim <= TARGET,
            "statement_small_us": small["statement_us"]["median"],
            "statement_large_us": large["statement_us"]["median"],
            "statement_ratio": round(stmt, 2), "statement_ok": stmt <= TARGET,
            "buffers_small": small["buffers"], "buffers_large": large["buffers"],
        })
    return ratios


def report(ratios: list[dict[str, Any]]) -> str:
    headers = ["db", "order", "units", "claim() 1k µs", "claim() 1M µs", "ratio",
               "statement 1k µs", "statement 1M µs", "ratio",
               "buffers (PG) / handler reads (MariaDB) 1k/1M",
               f"≤ {TARGET}x"]
    rows = [
        [r["db"], r["ordering"], r["limit"], r["claim_small_us"], r["claim_large_us"],
         r["claim_ratio"], r["statement_small_us"], r["statement_large_us"],
         r["statement_ratio"],
         "-" if r["buffers_small"] is None else f"{r['buffers_small']}/{r['buffers_large']}",
         "yes" if r["claim_ok"] and r["statement_ok"] else "NO"]
        for r in ratios
    ]
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
