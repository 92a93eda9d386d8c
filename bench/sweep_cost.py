"""What discovery costs with a large history: a pass over new rows, and the full pass.

    .venv/bin/python bench/sweep_cost.py [--db postgres|sqlite|both] [--rows 1000000]

For each database, in a database of its own, ``--rows`` source rows of ``benchapp_row`` whose
``by_pk`` units are all FINISHED (the history; loaded with one INSERT ... SELECT, a shortcut
for the load only: nothing measured depends on how the history got there), never analyzed.
Then, with ``rows/sweep.Sweeper`` as the supervisor drives it:

- ``first_walk_s``: the first pass of a worker that has no watermark yet (it walks every
  row once: what the first ``runworkers`` over an existing table pays);
- ``idle_pass_ms``: a pass with nothing new (median of 50): what every ``SWEEP_INTERVAL``
  costs for ever after;
- ``new_rows_pass_ms``: a pass after 100 rows were created with ``bulk_create()`` (median of
  5; the units it adds are deleted with their rows between repetitions);
- ``full_pass_s``: a full pass (rows, then executions for orphans) walked without its pacing
  pauses, and ``full_pass_s_per_million_rows``.

The same with 1,000 rows of history gives the comparison. Writes bench/results/sweep_cost.json
and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

SMALL = 1_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["postgres", "sqlite", "both"], default="both")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--child", choices=["postgres", "sqlite"], help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args.rows)))
        return
    dbs = benchlib.chosen(args.db)
    found = benchlib.per_database(Path(__file__), dbs, [f"--rows={args.rows}"])
    rows = [row for db in dbs for row in found[db]["rows"]]
    path = benchlib.write_results("sweep_cost.json", {
        "benchmark": "sweep_cost", "machine": benchlib.machine(),
        "config": {"history_rows": [SMALL, args.rows], "new_rows": 100, "batch": 1000},
        "rows": rows,
    })
    print(benchlib.markdown_table(
        ["db", "history rows", "first walk (s)", "idle pass (ms)", "pass with 100 new (ms)",
         "full pass (s)", "full pass per 1M rows (s)"],
        [[r["db"], f"{r['history_rows']:,}", r["first_walk_s"], r["idle_pass_ms"],
          r["new_rows_pass_ms"], r["full_pass_s"], r["full_pass_s_per_million_rows"]]
         for r in rows]))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def measure_database(db: str, size: int) -> dict[str, Any]:
    rows = []
    with (benchlib.scratch_database(db, "small") as small,
          benchlib.scratch_database(db, "large") as large):
        benchlib.setup_django(db, small, large)
        from django.db import connections

        for alias, n in (("default", SMALL), ("large", size)):
            benchlib.use_database(alias)
            started = time.monotonic()
            benchlib.load_rows(n, alias)
            benchlib.load_executions("by_pk", n, 0, alias)
            connection = connections[alias]
            if connection.vendor == "postgresql":  # the history took ids 1..n by hand
                with connection.cursor() as cursor:
                    cursor.execute("SELECT setval(pg_get_serial_sequence('benchapp_row', 'id'),"
                                   " (SELECT max(id) FROM benchapp_row))")
            print(f"{db}: {n:,} rows of history loaded in {time.monotonic() - started:.1f}s",
                  file=sys.stderr, flush=True)
            rows.append({"db": db, "history_rows": n, **measure(n, alias)})
            print(f"  {rows[-1]}", file=sys.stderr, flush=True)
    return {"rows": rows}


def measure(n: int, alias: str) -> dict[str, Any]:
    from benchapp.models import Row

    from django_dbworker import workers
    from django_dbworker.models import Execution
    from django_dbworker.rows.sweep import Sweeper

    worker = workers["by_pk"]

    def one_pass(sweeper: Sweeper) -> float:
        started = time.perf_counter()
        sweeper.restart()
        while not sweeper.step(0.0)[1]:
            pass
        return time.perf_counter() - started

    first = one_pass(Sweeper(worker, 1000))
    sweeper = Sweeper(worker, 1000)
    idle = [one_pass(sweeper) for _ in range(50)]
    new = []
    for _ in range(5):
        created = Row.objects.using(alias).bulk_create(
            [Row(priority=0, payload="new") for _ in range(100)])
        new.append(one_pass(sweeper))
        assert Execution.objects.using(alias).filter(worker="by_pk", state="PENDING").count() == 100
        Execution.objects.using(alias).filter(worker="by_pk", state="PENDING").delete()
        Row.objects.using(alias).filter(pk__in=[r.pk for r in created]).delete()
    started = time.perf_counter()
    Sweeper(worker, 1000).sweep_all()  # the full pass's chunks, one after the other
    full_s = time.perf_counter() - started
    return {
        "first_walk_s": round(first, 3),
        "idle_pass_ms": round(statistics.median(idle) * 1000, 3),
        "new_rows_pass_ms": round(statistics.median(new) * 1000, 2),
        "full_pass_s": round(full_s, 3),
        "full_pass_s_per_million_rows": round(full_s * 1_000_000 / n, 2),
    }


if __name__ == "__main__":
    main()
