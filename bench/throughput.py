"""How fast does a real ``runworkers`` drain no-op work, next to raw SQL on the same table?

    .venv/bin/python bench/throughput.py [--db postgres|sqlite|mariadb|all] [--rows 5000] [--runs 3]
                                         [--concurrency 2] [--kind rows,tasks,raw] [--profile]

For each database (its own, created and removed here, as in claim_cost.py), ``--runs``
times, alternating the kinds within each run so a load spike hits them alike:

- ``rows``: ``--rows`` source rows (``benchapp.Job``, which no other worker reads) get a
  PENDING execution of the ``noop`` worker (its handler returns ``Finished()`` at once),
  then ``runworkers --burst --concurrency 2 --worker noop`` is timed until it exits;
- ``tasks``: ``--rows`` calls of the no-op task ``benchapp.tasks.noop`` are enqueued
  (``enqueue_many``), then ``runworkers --burst --concurrency 2 --queue default`` is timed;
- ``raw``: the reference, ``rawsql.py``: two processes drain a plain table with one row and
  one commit per job (PostgreSQL: ``FOR UPDATE SKIP LOCKED``), no Django.

Figures: ``per_s`` = rows / median wall time of the whole process (start-up included);
``net_per_s`` = rows / (wall time - the median wall time of a burst run with nothing to
do), i.e. without Python/Django start-up and forking the children; ``vs_raw`` = per_s of
runworkers / per_s of raw SQL measured in the same run; ``cpu_ms_per_job`` = CPU time of
our processes (runworkers and its children, start-up included; or the raw SQL workers) per
job, which depends much less than wall time on what else runs on the machine. The load
average is recorded.

``--profile`` runs one more drain of rows and of tasks under ``py-spy record
--subprocesses --idle``: the summary (per process role, the functions holding most of the
wall time) goes into the JSON, the sampled stacks (collapsed format, for flame graph
tools) into a temporary file whose name is printed.

Writes bench/results/throughput.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import benchlib
import rawsql

WORKER = "noop"
TASK = "benchapp.tasks.noop"
KINDS = ("rows", "tasks", "raw")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--kind", default=",".join(KINDS),
                        help="comma-separated: rows, tasks, raw (default: all three)")
    parser.add_argument("--profile", action="store_true",
                        help="also profile one drain with py-spy (pip install py-spy)")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.kinds = [k for k in args.kind.split(",") if k]
    if set(args.kinds) - set(KINDS):
        parser.error(f"--kind: choose among {', '.join(KINDS)}")
    if args.profile and not shutil.which("py-spy", path=str(Path(sys.executable).parent)):
        parser.error("--profile needs py-spy next to this Python: pip install py-spy")
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    dbs = benchlib.chosen(args.db)
    passed = [f"--rows={args.rows}", f"--runs={args.runs}", f"--kind={args.kind}",
              f"--concurrency={args.concurrency}", *(["--profile"] if args.profile else [])]
    found = benchlib.per_database(Path(__file__), dbs, passed)
    results = [found[db] for db in dbs]
    path = benchlib.write_results("throughput.json", {
        "benchmark": "throughput",
        "machine": benchlib.machine(),
        "config": config(args),
        "results": results,
        "table": report(results),
    })
    print(report(results))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "rows": args.rows, "runs": args.runs, "concurrency": args.concurrency,
        "kinds": args.kinds, "prefetch": os.environ.get("BENCH_PREFETCH") or "default",
        "rows_command": " ".join(command("rows", args.concurrency)[3:]),
        "tasks_command": " ".join(command("tasks", args.concurrency)[3:]),
        "raw": "rawsql.py: 2 processes, 1 row and 1 commit per job",
        "worker": f"{WORKER} (handler returns Finished() at once)",
        "task": f"{TASK} (returns None)",
    }


def command(kind: str, concurrency: int) -> list[str]:
    what = [f"--worker={WORKER}"] if kind == "rows" else ["--queue=default"]
    return [sys.executable, "-m", "django", "runworkers", "--burst",
            f"--concurrency={concurrency}", *what, "--verbosity=0"]


# ----- in the child: one database ------------------------------------------------------------


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        env = benchlib.environment(db, name)
        kinds = args.kinds
        empty: dict[str, list[float]] = {k: [] for k in kinds if k != "raw"}
        walls: dict[str, list[float]] = {k: [] for k in kinds}
        cpus: dict[str, list[float]] = {k: [] for k in kinds}
        loads, steals = [], []
        for kind in empty:
            for _ in range(args.runs):
                fill(kind, 0)
                empty[kind].append(drain(command(kind, args.concurrency), env))
        for run in range(args.runs):
            for kind in kinds[run % len(kinds):] + kinds[:run % len(kinds)]:
                loads.append(round(os.getloadavg()[0], 2))
                ticks = benchlib.cpu_ticks()
                wall, cpu = measure(kind, db, name, args, env)
                steals.append(benchlib.steal_percent(ticks, benchlib.cpu_ticks()))
                walls[kind].append(wall)
                cpus[kind].append(cpu)
                print(f"{db}: run {run + 1}: {kind}: {args.rows} in {walls[kind][-1]:.2f}s "
                      f"({args.rows / walls[kind][-1]:.0f}/s, load {loads[-1]}, "
                      f"CPU steal {steals[-1]}%)", file=sys.stderr, flush=True)
        result: dict[str, Any] = {"db": db, "jobs": args.rows, "loadavg_1m": loads,
                                  "cpu_steal_percent": steals}
        for kind in kinds:
            wall = statistics.median(walls[kind])
            figures: dict[str, Any] = {
                "wall_s": [round(w, 3) for w in walls[kind]],
                "per_s": round(args.rows / wall),
                "cpu_s": [round(c, 2) for c in cpus[kind]],
                "cpu_ms_per_job": round(1000 * statistics.median(cpus[kind]) / args.rows, 3),
            }
            if kind in empty:
                idle = statistics.median(empty[kind])
                figures["empty_burst_wall_s"] = [round(w, 3) for w in empty[kind]]
                figures["net_per_s"] = round(args.rows / (wall - idle)) if wall > idle else None
            result[kind] = figures
        if "raw" in kinds:
            for kind in ("rows", "tasks"):
                if kind in kinds:
                    result[kind]["vs_raw"] = round(result[kind]["per_s"]
                                                   / result["raw"]["per_s"], 3)
        if args.profile:
            result["profile"] = {}
            for kind in (k for k in kinds if k != "raw"):
                fill(kind, args.rows)
                result["profile"][kind] = profile(f"{db}_{kind}",
                                                  command(kind, args.concurrency), env)
                check_drained(kind, args.rows)
    return result


def measure(kind: str, db: str, name: str, args: argparse.Namespace,
            env: dict[str, str]) -> tuple[float, float]:
    """Wall seconds of one drain, and CPU seconds of its processes (ours, not the
    database server's: the supervisor and its children, or the raw SQL workers)."""
    if kind == "raw":
        rawsql.load(db, name, args.rows)
        before = children_cpu()
        wall = rawsql.drain(db, name, args.rows, fill=False)["wall_s"]
        return wall, children_cpu() - before
    fill(kind, args.rows)
    before = children_cpu()
    wall = drain(command(kind, args.concurrency), env)
    cpu = children_cpu() - before
    check_drained(kind, args.rows)
    return wall, cpu


def children_cpu() -> float:
    """CPU seconds of our finished child processes and their own (waited-for) children."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def fill(kind: str, rows: int) -> None:
    """A fresh table: ``rows`` source rows each with a PENDING unit, or ``rows`` tasks."""
    from django.db import connections

    if kind == "rows":
        benchlib.load_rows(rows, table=benchlib.JOB_TABLE)
        benchlib.load_executions(WORKER, rows, rows, table=benchlib.JOB_TABLE)
    else:
        benchlib.load_tasks(TASK, rows)
    connections.close_all()  # nothing of ours holds the database while runworkers runs


def drain(command: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    finished = subprocess.run(command, env=env, cwd=benchlib.ROOT, capture_output=True,
                              text=True)
    wall = time.perf_counter() - started
    if finished.returncode:
        raise RuntimeError(f"runworkers exited with {finished.returncode}:\n"
                           f"{finished.stdout}\n{finished.stderr}")
    return wall


def check_drained(kind: str, rows: int) -> None:
    from django.db import connections

    from django_dbworker.models import Execution, State, TaskRecord, TaskStatus

    if kind == "rows":
        done = Execution.objects.filter(worker=WORKER, state=State.FINISHED).count()
    else:
        done = TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count()
    connections.close_all()
    if done != rows:
        raise RuntimeError(f"runworkers exited with {done} of {rows} {kind} done")


# ----- profiling -------------------------------------------------------------------------------


def profile(db: str, command: list[str], env: dict[str, str]) -> dict[str, Any]:
    """One drain under py-spy (all processes, idle time included); a summary of the stacks."""
    stacks = Path(tempfile.gettempdir()) / f"dbworker_throughput_profile_{db}.txt"
    py_spy = str(Path(sys.executable).parent / "py-spy")
    spy = [py_spy, "record", "--subprocesses", "--idle", "--nolineno", "--rate", "250",
           "--format", "raw", "--output", str(stacks), "--"]
    started = time.perf_counter()
    done = subprocess.run(spy + command, env=env, cwd=benchlib.ROOT, capture_output=True,
                          text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"py-spy/runworkers failed:\n{done.stdout}\n{done.stderr}")
    print(f"{db}: py-spy stacks in {stacks}", file=sys.stderr, flush=True)
    return {"stacks_file": str(stacks), "wall_s": round(wall, 3), **summarise(stacks)}


def summarise(stacks: Path) -> dict[str, Any]:
    """Per process role (supervisor, child): where the wall time went.

    ``share``: the samples spent idle (waiting on a pipe or in select), inside the database
    driver (running a statement, commit: the database's time plus the round trip), or in
    Python. ``dbworker``: the django_dbworker functions on the stack (inclusive share).
    ``self``: the functions on top of the stack.
    """
    totals: Counter[str] = Counter()
    share: dict[str, Counter[str]] = {"supervisor": Counter(), "child": Counter()}
    own: dict[str, Counter[str]] = {"supervisor": Counter(), "child": Counter()}
    top: dict[str, Counter[str]] = {"supervisor": Counter(), "child": Counter()}
    for line in stacks.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        role = "child" if any(f.startswith("main (") and "supervisor/child.py" in f
                              for f in frames) else "supervisor"
        samples = int(count)
        totals[role] += samples
        share[role][_kind(frames)] += samples
        top[role][_short(frames[-1])] += samples
        for frame in dict.fromkeys(f for f in frames if "django_dbworker/" in f):
            own[role][_short(frame)] += samples
    return {
        "samples": dict(totals),
        "share": {role: _percent(share[role], totals[role], 5) for role in totals},
        "dbworker": {role: _percent(own[role], totals[role], 20) for role in totals},
        "self": {role: _percent(top[role], totals[role], 12) for role in totals},
    }


def _kind(frames: list[str]) -> str:
    text = ";".join(frames)
    if "multiprocessing/connection.py" in frames[-1] or "selectors.py" in frames[-1]:
        return "idle: waiting on a pipe / select"
    if ("psycopg/" in text or "MySQLdb/" in text or "SQLiteCursorWrapper.execute" in text
            or "._commit (" in text):
        return "in the database driver (statement, commit, round trip)"
    if "fork" in text and "child.py" not in text:
        return "starting children"
    return "python (ORM, dispatch, bookkeeping)"


def _short(frame: str) -> str:
    """``function (/path/to/package/file.py)`` -> ``function (package/file.py)``."""
    name, _, where = frame.partition(" (")
    parts = Path(where.rstrip(")").rsplit(":", 1)[0]).parts
    return f"{name} ({'/'.join(parts[-2:])})" if parts else name


def _percent(counter: Counter[str], total: int, n: int) -> list[list[Any]]:
    return [[what, round(100 * samples / total, 1)] for what, samples in counter.most_common(n)]


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "kind", "jobs", "runs: wall s", "empty burst s", "jobs/s (median)",
               "net jobs/s", "vs raw SQL", "CPU ms/job (ours)"]
    rows = []
    for r in results:
        for kind in KINDS:
            if kind not in r:
                continue
            f = r[kind]
            empty = f.get("empty_burst_wall_s")
            rows.append([r["db"], kind, r["jobs"], ", ".join(f"{w:.2f}" for w in f["wall_s"]),
                         f"{statistics.median(empty):.2f}" if empty else "",
                         f["per_s"], f.get("net_per_s", ""),
                         f"{f['vs_raw']:.0%}" if "vs_raw" in f else "",
                         f.get("cpu_ms_per_job", "")])
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
