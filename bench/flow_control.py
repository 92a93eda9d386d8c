"""What flow control costs on the hot path: tasks drained by a real ``runworkers``, each
mechanism next to plain tasks in the same run.

    .venv/bin/python bench/flow_control.py [--db postgres|sqlite|mariadb|all] [--tasks 5000]
                                           [--runs 3] [--backlog 10000] [--concurrency 2]

For each database (its own, created and removed here), ``--runs`` times, the kinds in a
rotating order so that a load spike hits them alike. Every kind enqueues ``--tasks`` calls
with ``enqueue_many`` as an application would, then times ``runworkers --burst
--concurrency 2`` (every queue) until it exits:

- ``plain``: ``benchapp.tasks.noop``, no option;
- ``unique``: ``benchapp.tasks.unique_noop``, declared ``@task(unique_key=lambda n:
  f"noop:{n}")``: every call has a key of its own (each enqueue takes its key's
  ``TaskUniqueness`` row; the drain is what the issue bounds);
- ``keyed``: ``benchkeyed.tasks.keyed_noop``, declared ``@task(concurrency_limit=2,
  concurrency_key=lambda n: f"key:{n % 50}")``: 50 keys, 2 at most running per key (with 2
  children the limit binds only while the supervisor holds more than 100 tasks claimed
  ahead, which count as running: up to ``PREFETCH`` per child in the supervisor and as
  many in each child; the figure is mostly the keyed claim's own cost). Its app is
  installed for the keyed runs only (``BENCH_KEYED=1``): a supervisor that knows a keyed
  task claims every task the keyed way, so the other kinds run as in a project without
  one;
- ``paused``: plain tasks, while the queue ``paused`` is paused and holds ``--backlog``
  tasks enqueued before them (so they are ahead in claim order): a paused queue should cost
  the claim nothing.

Figures: ``per_s`` = tasks / median wall time of the drain (start-up included);
``net_per_s`` = tasks / (that wall time - the median wall time of a burst run with nothing
to do: Python/Django start-up and the children's fork); ``vs_plain`` and ``net_vs_plain``:
each against plain's of the same database; ``enqueue_per_s`` = tasks / median seconds of
the ``enqueue_many`` call (the unique kind enqueues a key per call, one at a time).
Writes bench/results/flow_control.json and prints a Markdown table.
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
import throughput

KINDS = ("plain", "unique", "keyed", "paused")
TASKS = {"plain": "benchapp.tasks.noop", "unique": "benchapp.tasks.unique_noop",
         "keyed": "benchkeyed.tasks.keyed_noop", "paused": "benchapp.tasks.noop"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--tasks", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help="comma-separated, plain always included (default: all four)")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.kinds = ["plain", *(k for k in KINDS if k != "plain" and k in args.kinds.split(","))]
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    passed = [f"--tasks={args.tasks}", f"--runs={args.runs}", f"--backlog={args.backlog}",
              f"--concurrency={args.concurrency}", f"--kinds={','.join(args.kinds)}"]
    results = list(benchlib.per_database(Path(__file__), benchlib.chosen(args.db),
                                         passed).values())
    data = {"benchmark": "flow_control", "machine": benchlib.machine(),
            "config": {"tasks": args.tasks, "runs": args.runs, "backlog": args.backlog,
                       "concurrency": args.concurrency, "command": " ".join(
                           command(args.concurrency)[3:]), "tasks_by_kind": TASKS},
            "results": results}
    path = benchlib.write_results("flow_control.json", data)
    print(report(results))
    print(f"\nwritten to {path}")


def command(concurrency: int) -> list[str]:
    return [sys.executable, "-m", "django", "runworkers", "--burst",
            f"--concurrency={concurrency}", "--verbosity=0"]


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        env = benchlib.environment(db, name)
        kinds = args.kinds
        walls: dict[str, list[float]] = {k: [] for k in kinds}
        enqueues: dict[str, list[float]] = {k: [] for k in kinds}
        loads = []
        empty = []  # runworkers --burst with nothing to do: start-up and exit
        for _ in range(args.runs):
            benchlib.load_tasks(TASKS["plain"], 0)
            empty.append(throughput.drain(command(args.concurrency), env))
        for run in range(args.runs):
            for kind in kinds[run % len(kinds):] + kinds[:run % len(kinds)]:
                loads.append(round(os.getloadavg()[0], 2))
                enqueue_s = fill(kind, args.tasks, args.backlog)
                # Only the keyed runs' supervisors know a keyed task (benchkeyed): the others
                # claim as a project without one does.
                wall = throughput.drain(command(args.concurrency),
                                        {**env, "BENCH_KEYED": "1"} if kind == "keyed" else env)
                check(kind, args.tasks, args.backlog)
                walls[kind].append(wall)
                enqueues[kind].append(enqueue_s)
                print(f"{db}: run {run + 1}: {kind}: {args.tasks} in {wall:.2f}s "
                      f"({args.tasks / wall:.0f}/s; enqueue {enqueue_s:.2f}s; load "
                      f"{loads[-1]})", file=sys.stderr, flush=True)
        idle = statistics.median(empty)
        result: dict[str, Any] = {"db": db, "tasks": args.tasks, "loadavg_1m": loads,
                                  "empty_burst_wall_s": [round(w, 3) for w in empty]}
        for kind in kinds:
            wall = statistics.median(walls[kind])
            result[kind] = {
                "wall_s": [round(w, 3) for w in walls[kind]],
                "per_s": round(args.tasks / wall),
                "net_per_s": round(args.tasks / (wall - idle)) if wall > idle else None,
                "enqueue_s": [round(e, 3) for e in enqueues[kind]],
                "enqueue_per_s": round(args.tasks / statistics.median(enqueues[kind])),
            }
        for kind in kinds:
            result[kind]["vs_plain"] = round(result[kind]["per_s"] / result["plain"]["per_s"], 3)
            net, plain_net = result[kind]["net_per_s"], result["plain"]["net_per_s"]
            result[kind]["net_vs_plain"] = round(net / plain_net, 3) if net and plain_net \
                else None
    return result


def fill(kind: str, tasks: int, backlog: int) -> float:
    """An empty task table (and no pause), then the kind's tasks; the seconds that the
    ``enqueue_many`` of the measured tasks took."""
    from django.db import connections
    from django.utils.module_loading import import_string

    from django_dbworker import pause
    from django_dbworker.models import Pause, TaskUniqueness

    benchlib.load_tasks(TASKS["plain"], 0)
    TaskUniqueness.objects.all().delete()
    Pause.objects.all().delete()
    if kind == "paused":
        pause(queue="paused", reason="bench")
        noop = import_string(TASKS["plain"])
        noop.using(queue_name="paused").enqueue_many([((), {})] * backlog)
    task = import_string(TASKS[kind])
    calls = [((n,), {}) for n in range(tasks)] if kind in ("unique", "keyed") \
        else [((), {})] * tasks
    started = time.perf_counter()
    task.enqueue_many(calls)
    seconds = time.perf_counter() - started
    connections.close_all()
    return seconds


def check(kind: str, tasks: int, backlog: int) -> None:
    from django.db import connections

    from django_dbworker.models import TaskRecord, TaskStatus

    done = TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count()
    left = TaskRecord.objects.exclude(status=TaskStatus.SUCCESSFUL).count()
    connections.close_all()
    expected_left = backlog if kind == "paused" else 0
    if done != tasks or left != expected_left:
        raise RuntimeError(f"{kind}: runworkers exited with {done} of {tasks} done and "
                           f"{left} left (expected {expected_left})")


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "kind", "tasks", "runs: wall s", "drained/s (median)", "vs plain",
               "net drained/s", "net vs plain", "enqueue_many/s"]
    rows = []
    for r in results:
        for kind in (k for k in KINDS if k in r):
            f = r[kind]
            net = f["net_vs_plain"]
            rows.append([r["db"], kind, r["tasks"], ", ".join(f"{w:.2f}" for w in f["wall_s"]),
                         f["per_s"], f"{f['vs_plain']:.0%}", f["net_per_s"],
                         f"{net:.0%}" if net else "", f["enqueue_per_s"]])
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
