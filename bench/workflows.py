"""What workflows cost: a fan-out/fan-in drained next to independent tasks, and the claim
with 100,000 finished workflows in history next to none.

    .venv/bin/python bench/workflows.py [--db postgres|sqlite|mariadb|all] [--tasks 10000]
                                        [--runs 3] [--concurrency 2] [--history 100000]
                                        [--iterations 100] [--warmup 10] [--parts drain,claim]

For each database (its own, created and removed here), two parts:

``drain`` (``--runs`` times, the two kinds in a rotating order so that a load spike hits
both alike): each kind is enqueued as an application would, then ``runworkers --burst
--concurrency 2`` (every queue) is timed until it exits:

- ``independent``: ``--tasks`` calls of ``benchapp.tasks.noop`` (``enqueue_many``);
- ``workflow``: a fan-out/fan-in of the same task: one root, ``--tasks`` calls after it
  (``noop.using(after=[root]).enqueue_many(...)``), one join after all of them
  (``noop.using(after=members).enqueue()``): ``--tasks`` + 2 tasks, each member's end
  lowering the join's ``waiting_for`` in its own transaction.

Figures: ``per_s`` = tasks / median wall time of the drain (start-up included);
``net_per_s`` = tasks / (that wall time - the median wall time of a burst run with nothing
to do); ``vs_independent``: the workflow's against the independent tasks' of the same run
(target >= 70%); ``enqueue_s``: the enqueue of each kind (not in the drain).

``claim`` (two databases of the same kind, measured alternately, as in claim_cost.py):
both hold the same pending work, 1,000 READY tasks and 1,000 WAITING ones (each after one
of the READY ones, through ``after=``); ``history`` also holds 100,000 finished workflows
(``--history``): a ``Workflow`` row and two SUCCESSFUL members each, the second after the
first (200,000 tasks, 100,000 met edges), stored with ``executemany``. Timed: the whole
``claim()`` of 1 and 10 tasks as the supervisor makes it (every queue), put back after each
(not timed). Target: history within 1.5x of none.

Writes bench/results/workflows.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import benchlib
import throughput

KINDS = ("independent", "workflow")
TASK = "benchapp.tasks.noop"
PENDING = 1_000
LIMITS = (1, 10)
LEASE = 60.0
DRAIN_TARGET = 0.70
CLAIM_TARGET = 1.5
#: The workflow's root and join task ids (``fill``, read by ``check``).
SHAPE: list[str] = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--history", type=int, default=100_000,
                        help="finished workflows in the history database (default 100,000)")
    parser.add_argument("--iterations", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--parts", default="drain,claim")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.parts = [p for p in ("drain", "claim") if p in args.parts.split(",")]
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    passed = [f"--tasks={args.tasks}", f"--runs={args.runs}",
              f"--concurrency={args.concurrency}", f"--history={args.history}",
              f"--iterations={args.iterations}", f"--warmup={args.warmup}"]
    dbs = benchlib.chosen(args.db)
    results = [{"db": db} for db in dbs]
    for part in args.parts:  # each part in processes of its own (Django's settings)
        found = benchlib.per_database(Path(__file__), dbs, [*passed, f"--parts={part}"])
        for result in results:
            result[part] = found[result["db"]][part]
    data = {"benchmark": "workflows", "machine": benchlib.machine(),
            "config": {"tasks": args.tasks, "runs": args.runs,
                       "concurrency": args.concurrency, "history_workflows": args.history,
                       "pending": {"ready": PENDING, "waiting": PENDING},
                       "limits": list(LIMITS), "iterations": args.iterations,
                       "warmup": args.warmup, "parts": args.parts,
                       "command": " ".join(command(args.concurrency)[3:]), "task": TASK,
                       "targets": {"drain_vs_independent": DRAIN_TARGET,
                                   "claim_history_vs_none": CLAIM_TARGET}},
            "results": results}
    path = benchlib.write_results("workflows.json", data)
    print(report(results))
    print(f"\nwritten to {path}")


def command(concurrency: int) -> list[str]:
    return [sys.executable, "-m", "django", "runworkers", "--burst",
            f"--concurrency={concurrency}", "--verbosity=0"]


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"db": db}
    if "drain" in args.parts:
        with benchlib.scratch_database(db) as name:
            benchlib.setup_django(db, name)
            result["drain"] = measure_drain(db, benchlib.environment(db, name), args)
    if "claim" in args.parts:
        with (benchlib.scratch_database(db, "none") as none,
              benchlib.scratch_database(db, "history") as history):
            benchlib.setup_django(db, none, history)
            result["claim"] = measure_claim(db, args)
    return result


# ----- drain -------------------------------------------------------------------------------


def measure_drain(db: str, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    walls: dict[str, list[float]] = {k: [] for k in KINDS}
    enqueues: dict[str, list[float]] = {k: [] for k in KINDS}
    loads, empty = [], []
    for _ in range(args.runs):
        empty_tables()
        empty.append(throughput.drain(command(args.concurrency), env))
    for run in range(args.runs):
        for kind in KINDS[run % 2:] + KINDS[:run % 2]:
            loads.append(round(os.getloadavg()[0], 2))
            enqueue_s = fill(kind, args.tasks)
            wall = throughput.drain(command(args.concurrency), env)
            check(kind, args.tasks)
            walls[kind].append(wall)
            enqueues[kind].append(enqueue_s)
            print(f"{db}: run {run + 1}: {kind}: {count(kind, args.tasks)} tasks in "
                  f"{wall:.2f}s ({count(kind, args.tasks) / wall:.0f}/s; enqueue "
                  f"{enqueue_s:.2f}s; load {loads[-1]})", file=sys.stderr, flush=True)
    idle = statistics.median(empty)
    result: dict[str, Any] = {"tasks": args.tasks, "loadavg_1m": loads,
                              "empty_burst_wall_s": [round(w, 3) for w in empty]}
    for kind in KINDS:
        wall = statistics.median(walls[kind])
        n = count(kind, args.tasks)
        result[kind] = {
            "tasks": n,
            "wall_s": [round(w, 3) for w in walls[kind]],
            "per_s": round(n / wall),
            "net_per_s": round(n / (wall - idle)) if wall > idle else None,
            "enqueue_s": [round(e, 3) for e in enqueues[kind]],
        }
    ours, theirs = result["workflow"], result["independent"]
    ours["vs_independent"] = round(ours["per_s"] / theirs["per_s"], 3)
    ours["net_vs_independent"] = (round(ours["net_per_s"] / theirs["net_per_s"], 3)
                                  if ours["net_per_s"] and theirs["net_per_s"] else None)
    ours["target_met"] = ours["vs_independent"] >= DRAIN_TARGET
    return result


def count(kind: str, tasks: int) -> int:
    return tasks + 2 if kind == "workflow" else tasks


def empty_tables(using: str = "default") -> None:
    """No task, edge or workflow left (the truncation of ``benchlib.load_tasks``)."""
    from django.db import connections

    from django_dbworker.models import TaskDependency, Workflow

    benchlib.load_tasks(TASK, 0, using)
    with connections[using].cursor() as cursor:
        for model in (TaskDependency, Workflow):
            cursor.execute(f"DELETE FROM {model._meta.db_table}")


def fill(kind: str, tasks: int) -> float:
    """Empty tables, then the kind's tasks, enqueued as an application would; the seconds
    the enqueue took."""
    from django.db import connections
    from django.utils.module_loading import import_string

    empty_tables()
    noop = import_string(TASK)
    calls = [((), {})] * tasks
    started = time.perf_counter()
    if kind == "independent":
        noop.enqueue_many(calls)
    else:
        root = noop.enqueue()
        members = noop.using(after=[root]).enqueue_many(calls)
        join = noop.using(after=members).enqueue()
        SHAPE[:] = [root.id, join.id]
    seconds = time.perf_counter() - started
    connections.close_all()
    return seconds


def check(kind: str, tasks: int) -> None:
    """Every task SUCCESSFUL; in the workflow, the root ended before any member started
    and the join started after every member ended."""
    from django.db import connections
    from django.db.models import Max, Min

    from django_dbworker.models import TaskRecord, TaskStatus

    done = TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count()
    left = TaskRecord.objects.exclude(status=TaskStatus.SUCCESSFUL).count()
    expected = count(kind, tasks)
    if done != expected or left:
        raise RuntimeError(f"{kind}: runworkers exited with {done} of {expected} done and "
                           f"{left} left")
    if kind == "workflow":
        root, join = (TaskRecord.objects.get(pk=pk) for pk in SHAPE)
        members = TaskRecord.objects.exclude(pk__in=SHAPE).aggregate(
            first=Min("started_at"), last=Max("finished_at"))
        if not (root.finished_at <= members["first"] and members["last"] <= join.started_at):
            raise RuntimeError(f"workflow order broken: root ended {root.finished_at}, "
                               f"members {members}, join started {join.started_at}")
    connections.close_all()


# ----- claim -------------------------------------------------------------------------------


def measure_claim(db: str, args: argparse.Namespace) -> dict[str, Any]:
    aliases = {"none": "default", "history": "large"}
    loaded: dict[str, float] = {}
    for label, alias in aliases.items():
        started = time.monotonic()
        benchlib.use_database(alias)
        empty_tables(alias)
        if label == "history":
            load_history(alias, args.history)
        load_pending(alias)
        if db != "sqlite":
            analyze(alias)
        loaded[label] = round(time.monotonic() - started, 1)
        print(f"{db}: claim, {label}: loaded in {loaded[label]}s", file=sys.stderr,
              flush=True)
    rows = []
    for limit in LIMITS:
        samples = alternately(limit, aliases, args)
        row: dict[str, Any] = {"limit": limit}
        for label in aliases:
            row[label] = benchlib.summary(samples[label])
        row["ratio"] = round(row["history"]["median"] / row["none"]["median"], 2)
        row["target_met"] = row["ratio"] <= CLAIM_TARGET
        rows.append(row)
        print(f"{db}: claim {limit}: none {row['none']['median']}µs, history "
              f"{row['history']['median']}µs ({row['ratio']}x)", file=sys.stderr, flush=True)
    benchlib.use_database("default")
    return {"history_workflows": args.history, "loaded_s": loaded, "rows": rows,
            "counts": {label: counts(alias) for label, alias in aliases.items()}}


def load_pending(alias: str) -> None:
    """1,000 READY tasks and 1,000 WAITING ones, each after one of the READY ones, enqueued
    through the API (the same in both databases)."""
    from django.db import transaction
    from django.utils.module_loading import import_string

    noop = import_string(TASK)
    with transaction.atomic(using=alias):
        ready = noop.enqueue_many([((), {})] * PENDING)
        for dependency in ready:
            noop.using(after=[dependency]).enqueue()


def load_history(alias: str, workflows: int) -> None:
    """``workflows`` finished workflows of two members (the second after the first), with
    their Workflow rows and met edges, stored directly (``executemany``), not run."""
    from django.db import transaction
    from django.utils import timezone

    from django_dbworker.models import TaskDependency, TaskRecord, Workflow

    now = timezone.now()
    step = 10_000
    for start in range(0, workflows, step):
        group, tasks, edges = [], [], []
        for i in range(start, min(start + step, workflows)):
            at = now - timedelta(seconds=workflows - i)
            flow, first, second = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
            group.append({"id": flow, "name": f"history {i}", "created_at": at})
            for pk, has in ((first, True), (second, False)):
                tasks.append({"id": pk, "task_path": TASK, "status": "SUCCESSFUL",
                              "enqueued_at": at, "available_at": at, "started_at": at,
                              "finished_at": at, "attempts": 1, "workflow_id": flow,
                              "has_dependents": has})
            edges.append({"dependent_id": second, "dependency_id": first, "position": 0,
                          "state": "met", "resolved_at": at})
        with transaction.atomic(using=alias):
            for model, rows in ((Workflow, group), (TaskRecord, tasks),
                                (TaskDependency, edges)):
                insert_rows(model, rows, alias)


def insert_rows(model: Any, rows: list[dict[str, Any]], alias: str) -> None:
    """One ``executemany`` INSERT of ``rows`` (field name -> value) into ``model``'s table;
    the fields a row does not name get their default (prepared once)."""
    from django.db import connections

    connection = connections[alias]
    fields = [f for f in model._meta.concrete_fields
              if not (f.primary_key and f.name not in rows[0])]
    defaults = {f.name: f.get_db_prep_save(f.get_default(), connection) for f in fields}
    named = {f.name: f for f in fields}
    table = connection.ops.quote_name(model._meta.db_table)
    columns = ", ".join(connection.ops.quote_name(f.column) for f in fields)
    sql = f"INSERT INTO {table} ({columns}) VALUES ({', '.join(['%s'] * len(fields))})"
    values = [[named[f.name].get_db_prep_save(row[f.name], connection) if f.name in row
               else defaults[f.name] for f in fields] for row in rows]
    with connection.cursor() as cursor:
        cursor.executemany(sql, values)


def analyze(alias: str) -> None:
    from django.db import connections

    from django_dbworker.models import TaskDependency, TaskRecord, Workflow

    connection = connections[alias]
    with connection.cursor() as cursor:
        for model in (TaskRecord, TaskDependency, Workflow):
            table = model._meta.db_table
            if connection.vendor == "postgresql":
                cursor.execute(f"VACUUM (ANALYZE) {table}")
            else:
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()


def counts(alias: str) -> dict[str, Any]:
    from django.db.models import Count

    from django_dbworker.models import TaskDependency, TaskRecord, Workflow

    by_status = dict(TaskRecord.objects.using(alias).values_list("status")
                     .annotate(n=Count("pk")).values_list("status", "n"))
    return {"tasks": by_status, "edges": TaskDependency.objects.using(alias).count(),
            "workflows": Workflow.objects.using(alias).count()}


def alternately(limit: int, aliases: dict[str, str],
                args: argparse.Namespace) -> dict[str, list[int]]:
    samples: dict[str, list[int]] = {label: [] for label in aliases}
    order = list(aliases.items())
    for i in range(args.warmup + args.iterations):
        for label, alias in order if i % 2 else order[::-1]:
            elapsed = time_claim(limit, alias)
            if i >= args.warmup:
                samples[label].append(elapsed)
    return samples


def time_claim(limit: int, alias: str) -> int:
    """Nanoseconds of one ``claim()`` of every queue, as the supervisor makes it; the
    claimed tasks are given back afterwards (not timed)."""
    from django_dbworker.tasks import planner, store
    from django_dbworker.units.claimant import Claimant

    benchlib.use_database(alias)
    claimant = Claimant(pid=os.getpid())
    started = time.perf_counter_ns()
    claims = planner.claim(None, limit, claimant, LEASE)
    elapsed = time.perf_counter_ns() - started
    if len(claims) != limit:
        raise RuntimeError(f"claimed {len(claims)} tasks, not {limit}")
    store.unclaim(claims)
    return elapsed


# ----- report ------------------------------------------------------------------------------


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "what", "figure", "compared", "target"]
    rows = []
    for r in results:
        d = r.get("drain")
        if d:
            ind, wf = d["independent"], d["workflow"]
            rows.append([r["db"], f"{ind['tasks']:,} independent tasks, --concurrency 2",
                         f"{ind['per_s']:,}/s (net {ind['net_per_s']:,}/s)",
                         "walls " + ", ".join(f"{w:.2f}" for w in ind["wall_s"]), ""])
            rows.append([r["db"], f"fan-out/fan-in: 1 root, {d['tasks']:,} after it, 1 join "
                         "after all, --concurrency 2",
                         f"{wf['per_s']:,}/s (net {wf['net_per_s']:,}/s)",
                         f"{wf['vs_independent']:.0%} of independent (net "
                         f"{wf['net_vs_independent']:.0%}); walls "
                         + ", ".join(f"{w:.2f}" for w in wf["wall_s"]),
                         f">= {DRAIN_TARGET:.0%}"])
        c = r.get("claim")
        if c:
            for row in c["rows"]:
                rows.append([r["db"], f"task claim of {row['limit']}: "
                             f"{c['history_workflows']:,} finished workflows vs none",
                             f"{row['ratio']}x", f"median {row['history']['median']} µs vs "
                             f"{row['none']['median']} µs", f"<= {CLAIM_TARGET}x"])
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
