"""Run every benchmark, then write one summary table (about 6-8 minutes on 2 CPUs).

    .venv/bin/python bench/run_all.py [--quick]

Runs, one after the other, each on PostgreSQL and SQLite: ``throughput.py`` (rows, tasks
and the raw SQL reference, alternating, 3 runs of 5,000), ``enqueue.py`` (enqueue_many of
10,000 and a loop of enqueue()), ``latency.py`` (idle latency and idle cost) and
``claim_cost.py`` (claim cost at 1,000 and 1,000,000 finished rows). Each writes its own
``bench/results/<name>.json``; this script then writes ``bench/results/summary.json`` and
``bench/results/summary.md``: the figures next to the targets of issue 6, with the machine
and its load average. ``--quick`` runs fewer repetitions (for a smoke test, not figures).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

SCRIPTS = {
    "throughput": ["--runs=3", "--rows=5000"],
    "enqueue": ["--runs=5"],
    "latency": ["--samples=100"],
    "claim_cost": ["--iterations=100", "--warmup=10"],
}
QUICK = {
    "throughput": ["--runs=1", "--rows=1000"],
    "enqueue": ["--runs=1", "--tasks=2000", "--loop=200"],
    "latency": ["--samples=10", "--idle=2"],
    "claim_cost": ["--iterations=10", "--warmup=2", "--large=20000"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    started = time.monotonic()
    loads = {"start": [round(x, 2) for x in os.getloadavg()]}
    seconds = {}
    for name, passed in (QUICK if args.quick else SCRIPTS).items():
        print(f"=== {name}", file=sys.stderr, flush=True)
        begun = time.monotonic()
        subprocess.run([sys.executable, str(benchlib.BENCH / f"{name}.py"), *passed],
                       check=True, cwd=benchlib.ROOT)
        seconds[name] = round(time.monotonic() - begun, 1)
    loads["end"] = [round(x, 2) for x in os.getloadavg()]
    found = {name: json.loads((benchlib.RESULTS / f"{name}.json").read_text())
             for name in SCRIPTS}
    table = summary(found)
    benchlib.write_results("summary.json", {
        "benchmark": "summary",
        "machine": benchlib.machine(),
        "loadavg_1m_5m_15m": loads,
        "seconds": {**seconds, "total": round(time.monotonic() - started, 1)},
        "quick": args.quick,
        "table": table,
    })
    header = (f"Machine: {found['throughput']['machine']['cpu_count']} CPUs "
              f"({found['throughput']['machine']['cpu_model']}), PostgreSQL "
              f"{found['throughput']['machine']['postgres']}, SQLite "
              f"{found['throughput']['machine']['sqlite']}; load average "
              f"{loads['start'][0]} at the start, {loads['end'][0]} at the end; "
              f"{round(time.monotonic() - started)} s in all.\n\n")
    (benchlib.RESULTS / "summary.md").write_text(header + table + "\n")
    print(header + table)
    print(f"\nwritten: {Path('bench/results/summary.md')}, bench/results/summary.json")


def summary(found: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    throughput = {r["db"]: r for r in found["throughput"]["results"]}
    for db, r in throughput.items():
        raw = r["raw"]["per_s"]
        rows.append([db, "raw SQL, 1 row per transaction, 2 processes (reference)",
                     f"{raw:,} jobs/s", f"{r['raw']['cpu_ms_per_job']} ms CPU/job", ""])
        for kind, label, target in (
            ("rows", "rows (transactional worker, no-op), --concurrency 2",
             ">= 2,000 rows/s" if db == "postgres" else ""),
            ("tasks", "tasks (no-op), --concurrency 2",
             ">= 3,000 jobs/s and >= 50% of raw SQL" if db == "postgres" else ""),
        ):
            f = r[kind]
            rows.append([db, label, f"{f['per_s']:,}/s (net {f['net_per_s']:,}/s)",
                         f"{f['vs_raw']:.0%} of raw SQL; {f['cpu_ms_per_job']} ms CPU/job",
                         target])
    for r in found["enqueue"]["results"]:
        rows.append([r["db"], f"enqueue_many of {r['tasks']:,} tasks",
                     f"{r['many_per_s']:,} tasks/s ({r['many_args_per_s']:,}/s with arguments)",
                     f"{r['ratio']}x per task vs enqueue() ({r['loop_per_s']:,}/s)",
                     ">= 50,000/s, >= 20x" if r["db"] == "postgres" else ""])
    for r in found["latency"]["results"]:
        wake = "LISTEN/NOTIFY" if r["listen_notify"] else (
            f"commit watching, polling {r['poll_interval']:g}s")
        for kind in ("tasks", "rows"):
            f = r[kind]
            rows.append([r["db"], f"idle latency, {kind} ({wake})",
                         f"p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms", "",
                         "p50 <= 3 ms, p99 <= 20 ms" if r["db"] == "postgres"
                         else "p50 <= 50 ms"])
        rows.append([r["db"], "idle supervisor + 2 children",
                     f"{r['idle_cpu_percent']}% CPU, {r['idle_rss_mb']} MB RSS", "",
                     "< 1% CPU, < 150 MB"])
    for ratio in found["claim_cost"].get("ratios", []):
        rows.append([ratio["db"], f"claim cost, {ratio['worker']}, {ratio['limit']} unit(s): "
                     "1M vs 1k finished rows", f"{ratio['claim_ratio']}x (claim), "
                     f"{ratio['statement_ratio']}x (statement)", "", "<= 1.5x"])
    return benchlib.markdown_table(["db", "what", "figure", "compared", "target"], rows)


if __name__ == "__main__":
    main()
