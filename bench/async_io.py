"""What do async tasks gain from running beside each other in a child, on I/O-bound work?

    .venv/bin/python bench/async_io.py [--db postgres|sqlite|mariadb|all] [--tasks 200]
                                       [--wait 0.05] [--bounds 1,10,50] [--runs 2]

For each database (its own, created and removed here): ``--tasks`` calls of
``benchapp.tasks.wait_io`` (an ``async def`` that awaits ``--wait`` seconds, standing for a
call to another service) are enqueued, then ``runworkers --burst --concurrency 1 --queue
default`` drains them with ``DBWORKER["ASYNC_CONCURRENCY"]`` set to each of ``--bounds``
in turn (1: one at a time, as before async units ran beside each other), ``--runs`` times,
interleaved in the same run (1, 10, 50, 1, 10, 50, ...). One child: the gain is the
child's, not more processes'.

Drain time = last ``finished_at`` - first ``started_at`` of the tasks (the supervisor's
start-up and exit are left out); throughput = tasks / drain time; the floor is
``--wait`` x tasks / bound (the awaits alone). Writes bench/results/async_io.json and
prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

TASK = "benchapp.tasks.wait_io"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--tasks", type=int, default=200)
    parser.add_argument("--wait", type=float, default=0.05)
    parser.add_argument("--bounds", default="1,10,50")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    bounds = [int(b) for b in args.bounds.split(",")]
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args, bounds)))
        return
    loads = [round(os.getloadavg()[0], 2)]
    passed = [f"--tasks={args.tasks}", f"--wait={args.wait}", f"--bounds={args.bounds}",
              f"--runs={args.runs}"]
    found = benchlib.per_database(Path(__file__), benchlib.chosen(args.db), passed)
    loads.append(round(os.getloadavg()[0], 2))
    results = list(found.values())
    path = benchlib.write_results("async_io.json", {
        "benchmark": "async_io",
        "machine": benchlib.machine(),
        "config": {"tasks": args.tasks, "wait_s": args.wait, "bounds": bounds,
                   "runs": args.runs, "task": TASK,
                   "command": "runworkers --burst --concurrency 1 --queue default",
                   "setting": "DBWORKER['ASYNC_CONCURRENCY']"},
        "loadavg_1m": loads,
        "results": results,
        "table": report(results, args),
    })
    print(report(results, args))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def measure_database(db: str, args: argparse.Namespace, bounds: list[int]) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        runs: dict[str, list[dict[str, Any]]] = {str(b): [] for b in bounds}
        loads = [round(os.getloadavg()[0], 2)]
        for _ in range(args.runs):
            for bound in bounds:  # interleaved: the same load for every bound
                runs[str(bound)].append(drain(db, name, bound, args))
        loads.append(round(os.getloadavg()[0], 2))
    by_bound = {b: {"runs": r, "tasks_per_s": statistics.median(x["tasks_per_s"] for x in r),
                    "drain_s": statistics.median(x["drain_s"] for x in r)}
                for b, r in runs.items()}
    return {"db": db, "loadavg_1m": loads, "by_bound": by_bound}


def drain(db: str, name: str, bound: int, args: argparse.Namespace) -> dict[str, Any]:
    from django.db import connections
    from django.db.models import Max, Min

    from django_dbworker.models import TaskRecord, TaskStatus

    benchlib.load_tasks(TASK, 0)
    from django.utils.module_loading import import_string

    import_string(TASK).enqueue_many([((args.wait,), {})] * args.tasks)
    connections.close_all()
    env = {**benchlib.environment(db, name), "BENCH_ASYNC_CONCURRENCY": str(bound)}
    command = [sys.executable, "-m", "django", "runworkers", "--burst", "--concurrency=1",
               "--queue=default", "--verbosity=0"]
    started = time.monotonic()
    subprocess.run(command, env=env, cwd=benchlib.ROOT, check=True, timeout=600)
    wall = time.monotonic() - started
    done = TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL)
    span = done.aggregate(first=Min("started_at"), last=Max("finished_at"))
    count = done.count()
    if count != args.tasks:
        raise RuntimeError(f"{count} of {args.tasks} tasks succeeded with bound {bound}")
    seconds = (span["last"] - span["first"]).total_seconds()
    return {"drain_s": round(seconds, 3), "wall_s": round(wall, 3),
            "tasks_per_s": round(count / seconds, 1),
            "floor_s": round(args.wait * args.tasks / bound, 3)}


def report(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    rows = []
    for r in results:
        one = r["by_bound"].get("1")
        for bound, figures in r["by_bound"].items():
            gain = (f"{figures['tasks_per_s'] / one['tasks_per_s']:.1f}x"
                    if one and bound != "1" else "")
            floor = args.wait * args.tasks / int(bound)
            rows.append([r["db"], bound, f"{figures['tasks_per_s']:,.1f}",
                         f"{figures['drain_s']:.2f} s (floor {floor:.2f} s)", gain,
                         " / ".join(str(x) for x in r["loadavg_1m"])])
    return (f"{args.tasks} async tasks awaiting {args.wait * 1000:g} ms each, one child "
            "(`runworkers --burst --concurrency 1`), median of "
            f"{args.runs} interleaved runs\n\n" + benchlib.markdown_table(
                ["db", "ASYNC_CONCURRENCY", "tasks/s", "drain", "vs 1", "load 1m"], rows))


if __name__ == "__main__":
    main()
