"""What an operator's surfaces cost as the tables grow (issue 39): the health view, the
metrics view and ``dbworker stats --json``, at each size, before and after ANALYZE.

Each size is a fresh database: ``size`` source rows with an execution each of ``by_pk``
(half FINISHED an hour ago, the newest half PENDING, as the sweep and the runner leave
them) and ``size`` tasks (half READY, half SUCCESSFUL an hour ago), loaded with set-based
SQL into the product's own tables and indexes. Each surface runs ``--runs`` times (the
median is kept) on the fresh tables, then again after ``VACUUM ANALYZE``.

    PYTHONPATH=. .venv/bin/python bench/operator.py --db postgres --sizes 10000 1000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib

SURFACES = ("health", "metrics", "stats")


def load_tasks(size: int) -> None:
    """``size`` tasks of benchapp.tasks.noop: the first half SUCCESSFUL an hour ago, the
    rest READY (PostgreSQL: one INSERT ... SELECT over generate_series)."""
    from django.db import connection
    from django.utils import timezone

    from django_dbworker.models import TaskRecord

    now = timezone.now()
    hour_ago = now - timezone.timedelta(hours=1)
    columns, expressions, params = [], [], []
    special = {"status": "CASE WHEN i <= %s THEN 'SUCCESSFUL' ELSE 'READY' END",
               "finished_at": "CASE WHEN i <= %s THEN %s::timestamptz END",
               "last_attempted_at": "CASE WHEN i <= %s THEN %s::timestamptz END",
               "id": "md5(i::text)::uuid"}
    values = {"task_path": "benchapp.tasks.noop", "available_at": now, "enqueued_at": now}
    for field in TaskRecord._meta.concrete_fields:
        columns.append(connection.ops.quote_name(field.column))
        if field.name in special:
            expressions.append(special[field.name])
            params += {"status": [size // 2], "id": []}.get(field.name, [size // 2, hour_ago])
            continue
        expressions.append("%s")
        params.append(field.get_db_prep_save(values.get(field.name, field.get_default()),
                                             connection))
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {TaskRecord._meta.db_table} ({', '.join(columns)}) "
                       f"SELECT {', '.join(expressions)} FROM generate_series(1, %s) i",
                       [*params, size])


def surfaces() -> dict[str, Any]:
    from io import StringIO

    from django.core.management import call_command
    from django.test import RequestFactory

    from django_dbworker import views

    def stats() -> int:
        call_command("dbworker", "stats", "--json", stdout=StringIO())
        return 0

    get = RequestFactory().get("/")
    return {"health": lambda: views.health(get).status_code,
            "metrics": lambda: views.metrics(get).status_code,
            "stats": stats}


def measure(runs: int) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, call in surfaces().items():
        times, status = [], None
        for _ in range(runs):
            start = time.perf_counter()
            status = call()
            times.append(time.perf_counter() - start)
        found[name] = {"median_s": round(statistics.median(times), 4),
                       "runs_s": [round(t, 4) for t in times], "status": status}
        print(f"    {name}: {found[name]['median_s']:.4f} s (status {status})",
              file=sys.stderr, flush=True)
    return found


def child(db: str, size: int, runs: int, out: str) -> None:
    with benchlib.scratch_database(db, tag=str(size)) as name:
        benchlib.setup_django(db, name)
        import django_dbworker

        print(f"  code: {Path(django_dbworker.__file__).parent}", file=sys.stderr)
        from django.conf import settings

        settings.DBWORKER["HEALTH_MIN_SUPERVISORS"] = 0
        started = time.perf_counter()
        benchlib.load_rows(size)
        benchlib.load_executions("by_pk", size, pending=size // 2)
        load_tasks(size)
        loaded = time.perf_counter() - started
        print(f"  {size}: loaded in {loaded:.1f} s", file=sys.stderr, flush=True)
        result = {"size": size, "load_s": round(loaded, 1), "fresh": measure(runs)}
        benchlib.analyze()
        result["analyzed"] = measure(runs)
        Path(out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="postgres", choices=["postgres"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--label", default="after", help="before or after (the results' name)")
    parser.add_argument("--child-size", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child_size:
        child(args.db, args.child_size, args.runs, args.out)
        return
    results = benchlib.per_size(__file__, args.sizes,
                                ["--db", args.db, "--runs", str(args.runs)])
    rows = [(r["size"], when, *(f"{r[when][s]['median_s']:.3f} s" for s in SURFACES))
            for r in results for when in ("fresh", "analyzed")]
    print(benchlib.markdown_table(["units", "statistics", *SURFACES], rows))
    benchlib.write_results(f"operator-{args.label}.json", {
        "benchmark": "operator", "db": args.db, "label": args.label,
        "machine": benchlib.machine(), "results": results})


if __name__ == "__main__":
    main()
