"""How fast does a real ``runworkers`` drain no-op work?

    .venv/bin/python bench/throughput.py [--db postgres|sqlite|both] [--rows 5000] [--runs 3]
                                         [--concurrency 2] [--profile]

For each database (its own, created and removed here, as in claim_cost.py): ``--rows``
source rows (``benchapp.Job``, which no other worker reads) get a PENDING execution of the
``noop`` worker (its handler returns ``Finished()`` at once), then
``runworkers --burst --concurrency 2 --worker noop`` is started as a subprocess and timed
until it exits, ``--runs`` times on a fresh table.

Figures: ``rows_per_s`` = rows / wall time of the whole process (start-up included), median
of the runs; ``net_rows_per_s`` = rows / (wall time - the median wall time of a burst run
with nothing to do), i.e. without Python/Django start-up and forking the children.

``--profile`` runs one more drain under ``py-spy record --subprocesses --idle`` (``pip
install py-spy``): the summary (per process role, the functions holding most of the wall
time) goes into the JSON, the sampled stacks (collapsed format, for flame graph tools) into
a temporary file whose name is printed.

Writes bench/results/throughput.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
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

WORKER = "noop"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=[*benchlib.DATABASES, "both"], default="both")
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--profile", action="store_true",
                        help="also profile one drain with py-spy (pip install py-spy)")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.profile and not shutil.which("py-spy", path=str(Path(sys.executable).parent)):
        parser.error("--profile needs py-spy next to this Python: pip install py-spy")
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    dbs = benchlib.DATABASES if args.db == "both" else (args.db,)
    passed = [f"--rows={args.rows}", f"--runs={args.runs}",
              f"--concurrency={args.concurrency}", *(["--profile"] if args.profile else [])]
    found = benchlib.per_database(Path(__file__), dbs, passed)
    path = benchlib.write_results("throughput.json", {
        "benchmark": "throughput",
        "machine": benchlib.machine(),
        "config": {"rows": args.rows, "runs": args.runs, "concurrency": args.concurrency,
                   "worker": f"{WORKER} (handler returns Finished() at once)",
                   "command": f"runworkers --burst --concurrency {args.concurrency} "
                              f"--worker {WORKER}"},
        "results": [found[db] for db in dbs],
    })
    print(report([found[db] for db in dbs]))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


# ----- in the child: one database ------------------------------------------------------------


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        env = benchlib.environment(db, name)
        command = [sys.executable, "-m", "django", "runworkers", "--burst",
                   f"--concurrency={args.concurrency}", f"--worker={WORKER}", "--verbosity=0"]
        empty = []
        for _ in range(args.runs):
            fill(0)
            empty.append(drain(command, env))
        walls = []
        for run in range(args.runs):
            fill(args.rows)
            walls.append(drain(command, env))
            check_drained(args.rows)
            print(f"{db}: run {run + 1}: {args.rows} rows in {walls[-1]:.2f}s "
                  f"({args.rows / walls[-1]:.0f} rows/s)", file=sys.stderr, flush=True)
        wall, idle = statistics.median(walls), statistics.median(empty)
        result: dict[str, Any] = {
            "db": db,
            "rows": args.rows,
            "wall_s": [round(w, 3) for w in walls],
            "empty_burst_wall_s": [round(w, 3) for w in empty],
            "rows_per_s": round(args.rows / wall),
            "net_rows_per_s": round(args.rows / (wall - idle)) if wall > idle else None,
        }
        if args.profile:
            fill(args.rows)
            result["profile"] = profile(db, command, env)
            check_drained(args.rows)
    return result


def fill(rows: int) -> None:
    """A fresh table of ``rows`` source rows, each with a PENDING unit of the worker."""
    from django.db import connections

    benchlib.load_rows(rows, table=benchlib.JOB_TABLE)
    benchlib.load_executions(WORKER, rows, rows, table=benchlib.JOB_TABLE)
    benchlib.analyze(source=benchlib.JOB_TABLE)
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


def check_drained(rows: int) -> None:
    from django.db import connections

    from django_dbworker.models import Execution, State

    done = Execution.objects.filter(worker=WORKER, state=State.FINISHED).count()
    connections.close_all()
    if done != rows:
        raise RuntimeError(f"runworkers exited with {done} of {rows} units FINISHED")


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
    if "psycopg/" in text or "SQLiteCursorWrapper.execute" in text or "._commit (" in text:
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
    headers = ["db", "rows", "runs: wall s", "empty burst s", "rows/s (median)",
               "net rows/s"]
    rows = [[r["db"], r["rows"], ", ".join(f"{w:.2f}" for w in r["wall_s"]),
             f"{statistics.median(r['empty_burst_wall_s']):.2f}", r["rows_per_s"],
             r["net_rows_per_s"]] for r in results]
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
