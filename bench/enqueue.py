"""How fast are tasks enqueued: ``enqueue_many`` of 10,000 calls, and one ``enqueue()`` at
a time for comparison?

    .venv/bin/python bench/enqueue.py [--db postgres|sqlite|mariadb|all] [--tasks 10000]
                                      [--loop 1000] [--runs 5]

For each database (its own, created and removed here): ``--runs`` times, alternately,
``noop.enqueue_many([((), {})] * --tasks)`` (one transaction, a multi-row INSERT per
1,000 calls, pipelined on PostgreSQL),
``touch.enqueue_many([((i,), {"note": "n<i>"}) for i in range(--tasks)])`` (the same with
arguments that differ per call, as most real calls), ``noop.enqueue_many(calls,
workflow="bench")`` (a batch with an id: a Workflow row too) and a loop of ``--loop`` calls of
``noop.enqueue()`` (each its own transaction, as a web request would), on an emptied task
table each time.

Figures: ``many_per_s`` = tasks / median seconds of ``enqueue_many`` without arguments,
``many_args_per_s`` the same with arguments, ``many_batch_per_s`` as a batch with an id;
``loop_per_s`` = loop calls / median seconds
of the loop; ``ratio`` = seconds per task in the loop / seconds per task in
``enqueue_many``. Targets: ``many_per_s`` >= 50,000 on PostgreSQL, ratio >= 20.

Writes bench/results/enqueue.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

TASK = "benchapp.tasks.noop"
TASK_WITH_ARGS = "benchapp.tasks.touch"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--loop", type=int, default=1_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    dbs = benchlib.chosen(args.db)
    passed = [f"--tasks={args.tasks}", f"--loop={args.loop}", f"--runs={args.runs}"]
    found = benchlib.per_database(Path(__file__), dbs, passed)
    results = [found[db] for db in dbs]
    path = benchlib.write_results("enqueue.json", {
        "benchmark": "enqueue",
        "machine": benchlib.machine(),
        "config": {"tasks": args.tasks, "loop": args.loop, "runs": args.runs, "task": TASK,
                   "targets": {"many_per_s_postgres": 50_000, "ratio": 20}},
        "results": results,
        "table": report(results),
    })
    print(report(results))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        from django.utils.module_loading import import_string

        task = import_string(TASK)
        touch = import_string(TASK_WITH_ARGS)
        calls = [((), {})] * args.tasks
        with_args = [((i,), {"note": f"n{i}"}) for i in range(args.tasks)]
        many, many_args, loop, loads, batch = [], [], [], [], []
        benchlib.load_tasks(TASK, 0)
        task.enqueue_many(calls[:100])  # warm up: imports, connection, compiled statements
        for _ in range(args.runs):
            loads.append(round(os.getloadavg()[0], 2))
            benchlib.load_tasks(TASK, 0)
            started = time.perf_counter()
            task.enqueue_many(calls)
            many.append(time.perf_counter() - started)
            benchlib.load_tasks(TASK, 0)
            started = time.perf_counter()
            touch.enqueue_many(with_args)
            many_args.append(time.perf_counter() - started)
            if hasattr(task, "step"):  # a batch with an id (workflows; not before them)
                benchlib.load_tasks(TASK, 0)
                started = time.perf_counter()
                task.enqueue_many(calls, workflow="bench")
                batch.append(time.perf_counter() - started)
            benchlib.load_tasks(TASK, 0)
            started = time.perf_counter()
            for _ in range(args.loop):
                task.enqueue()
            loop.append(time.perf_counter() - started)
            print(f"{db}: enqueue_many {args.tasks / many[-1]:.0f}/s "
                  f"({args.tasks / many_args[-1]:.0f}/s with arguments), "
                  f"enqueue() {args.loop / loop[-1]:.0f}/s (load {loads[-1]})",
                  file=sys.stderr, flush=True)
        per_many = statistics.median(many) / args.tasks
        per_loop = statistics.median(loop) / args.loop
        return {
            "db": db, "tasks": args.tasks, "loop": args.loop, "loadavg_1m": loads,
            "many_s": [round(s, 4) for s in many], "loop_s": [round(s, 4) for s in loop],
            "many_args_s": [round(s, 4) for s in many_args],
            "many_per_s": round(1 / per_many), "loop_per_s": round(1 / per_loop),
            "many_args_per_s": round(args.tasks / statistics.median(many_args)),
            "ratio": round(per_loop / per_many, 1),
            "many_batch_s": [round(s, 4) for s in batch],
            "many_batch_per_s": round(args.tasks / statistics.median(batch)) if batch else None,
        }


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "enqueue_many tasks", "enqueue_many tasks/s (median)",
               "with arguments", "enqueue() calls", "enqueue() tasks/s", "per-task ratio"]
    rows = [[r["db"], r["tasks"], r["many_per_s"], r.get("many_args_per_s", ""), r["loop"],
             r["loop_per_s"], f"{r['ratio']}x"] for r in results]
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
