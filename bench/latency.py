"""How long from a caller's enqueue (or its commit) to its handler's start, when the
supervisor idles?
And what does an idle supervisor cost?

    .venv/bin/python bench/latency.py [--db postgres|sqlite|mariadb|all] [--samples 100]
                                      [--sqlite-poll 1.0,0.1] [--gap 0.02-0.1]

For each database (its own, created and removed here) a real ``runworkers --concurrency 2
--worker ping --queue default`` runs (not --burst). Then, alternately, ``--samples`` times
each, one unit of work is committed while the supervisor idles (a random 20-100 ms after
the previous unit finished):

- ``tasks``: ``benchapp.tasks.stamp.enqueue()``; the task returns ``time.time()``;
- ``rows``: ``Ping.objects.create()`` (a source row saved through the ORM: its unit is
  made PENDING in the same transaction); the ``ping`` handler stores ``time.time()``.

Two figures per unit: from the caller's side (``caller``), handler start - just before the
``enqueue()``/``create()`` call, what its caller waits (the commit and NOTIFY included), as
``bench/peers.py`` times the peers; and, as before issue 24, handler start - the time the
call returned, the commit done by then (``from_commit``). ``--gap LO-HI``: the idle
seconds before each unit (default 0.02-0.1, as the peers'). ``bench/latency_trace.py``
shows where the milliseconds go.

PostgreSQL wakes the supervisor with LISTEN/NOTIFY; on SQLite it looks every 50 ms
whether another connection committed (``PRAGMA data_version``) and polls every
``POLL_INTERVAL`` as before (``--sqlite-poll``: the values to run with; default the
default, 1 s). MariaDB has no LISTEN/NOTIFY: the idle supervisor runs an indexed probe of
what a claim would find new every 50 ms (``db/mysql.py``, ``commit_counter``), with
``POLL_INTERVAL`` (the default, 1 s) polling behind. Then the supervisor and its children
idle for ``--idle`` seconds: their CPU use (% of one core) and memory (``bench/memory.py``):
RSS (shared pages counted in each process that maps them: a forked child's inherited heap
counts again in each child), PSS (shared pages divided among the processes: the sum is what
the tree holds) and USS (what only that process holds).

Writes bench/results/latency.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import benchlib
import memory

TARGETS = {"postgres_p50_ms": 3, "postgres_p99_ms": 20, "sqlite_p50_ms": 50,
           "mariadb_p50_ms": 50,
           "idle_cpu_percent": 1, "idle_rss_mb": 150,
           # issue 24, from the caller's side: against bench/peers.py's figures
           "postgres_caller": "p50 <= Celery + Redis's p50 (same run), p99 <= 3x p50"}
#: What the two figures measure (the ``caller`` and ``from_commit`` of each result).
FIGURES = {"caller": "handler's first line - just before enqueue()/create() (the caller's "
                     "wait: the commit, the NOTIFY, the wake-up, the claim, the hand-off)",
           "from_commit": "handler's first line - the return of enqueue()/create() (the "
                          "unit is committed by then)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--sqlite-poll", default="1.0",
                        help="POLL_INTERVAL values to run SQLite with (comma-separated)")
    parser.add_argument("--idle", type=float, default=10.0,
                        help="seconds to measure the idle supervisor's CPU use")
    parser.add_argument("--gap", default="0.02-0.1",
                        help="idle seconds before each unit, uniform between LO-HI")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--poll", type=float, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        args.gap = tuple(float(x) for x in args.gap.split("-"))
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    dbs = benchlib.chosen(args.db)
    results = []
    for db in dbs:
        polls = [float(p) for p in args.sqlite_poll.split(",")] if db == "sqlite" else [1.0]
        for poll in polls:
            passed = [f"--samples={args.samples}", f"--idle={args.idle}", f"--poll={poll}",
                      f"--gap={args.gap}"]
            results.append(benchlib.per_database(Path(__file__), [db], passed)[db])
    path = benchlib.write_results("latency.json", {
        "benchmark": "latency",
        "machine": benchlib.machine(),
        "config": {"samples": args.samples, "idle_s": args.idle, "targets": TARGETS,
                   "gap_s": args.gap, "figures": FIGURES,
                   "command": "runworkers --concurrency 2 --worker ping --queue default"},
        "results": results,
        "table": report(results),
        "memory_table": memory_report(results),
    })
    print(report(results))
    print(f"\n{memory_report(results)}")
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    with benchlib.scratch_database(db) as name:
        benchlib.setup_django(db, name)
        from django.db import connections

        benchlib.load_tasks("benchapp.tasks.stamp", 0)
        connections.close_all()
        env = {**benchlib.environment(db, name), "BENCH_POLL": str(args.poll)}
        command = [sys.executable, "-m", "django", "runworkers", "--concurrency=2",
                   "--worker=ping", "--queue=default", "--verbosity=0"]
        process = subprocess.Popen(command, env=env, cwd=benchlib.ROOT)
        try:
            one("tasks", timeout=60)  # started, connected, listening
            one("rows", timeout=60)
            samples: dict[str, dict[str, list[float]]] = {
                point: {"tasks": [], "rows": []} for point in POINTS}
            loads = [round(os.getloadavg()[0], 2)]
            for i in range(args.samples * 2):
                kind = ("tasks", "rows")[i % 2]
                time.sleep(random.uniform(*args.gap))  # idle, at a random phase
                for point, seconds in one(kind).items():
                    samples[point][kind].append(seconds)
            loads.append(round(os.getloadavg()[0], 2))
            idle = idle_cost(process.pid, args.idle)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    return {"db": db, "poll_interval": args.poll, "listen_notify": db == "postgres",
            "wake_up": WAKE_UP[db], "loadavg_1m": loads,
            **{POINTS[point]: {kind: figures(v) for kind, v in by_kind.items()}
               for point, by_kind in samples.items()}, **idle}


#: What each figure is timed from, by its key in the results: ``caller``, from just before
#: the ``enqueue()``/``create()`` call (what its caller waits); ``from_commit``, from the
#: call's return, when the unit is committed (this benchmark's only figure until issue 24).
POINTS = {"caller": "caller", "returned": "from_commit"}


#: How an idle supervisor learns of new work, by database.
WAKE_UP = {"postgres": "LISTEN/NOTIFY", "sqlite": "commit watching (PRAGMA data_version)",
           "mariadb": "probe every 50 ms"}


def wake_up(r: dict[str, Any]) -> str:
    """The wake-up of a result, with the polling behind it (older results lack
    ``wake_up``: they are PostgreSQL's or SQLite's)."""
    if r["listen_notify"]:
        return "LISTEN/NOTIFY"
    how = r.get("wake_up") or WAKE_UP["sqlite"]
    return f"{how.split(' (')[0]}, polling {r['poll_interval']:g}s"


#: Seconds before the first look for the unit's stamp. The stamp holds the handler's start
#: time, so when we look does not change the figure, but a query of ours every 2 ms while the
#: unit is on its way took CPU from it on 2 cores (the peers' driver looks for a file).
FIRST_LOOK_S = 0.02


def one(kind: str, timeout: float = 10.0) -> dict[str, float]:
    """Enqueue or save one unit; wait until its handler ran. Seconds to its handler's
    first line from just before the call (``caller``) and from the call's return
    (``returned``: the commit was done by then)."""
    t = one_sample(kind, timeout)
    return {"caller": t["handler"] - t["before"], "returned": t["handler"] - t["returned"]}


def one_sample(kind: str, timeout: float = 10.0,
               mark: Callable[[str], None] | None = None) -> dict[str, float]:
    """Enqueue or save one unit; wait until its handler ran. ``time.time()`` just before
    the call (``before``), at its return (``returned``) and at the handler's first line
    (``handler``); ``mark`` (``bench/latency_trace.py``) is told of the first two."""
    from benchapp.models import Ping
    from benchapp.tasks import stamp

    from django_dbworker.models import TaskRecord, TaskStatus

    if mark is not None:
        mark("before")
    if kind == "tasks":
        before = time.time()
        result = stamp.enqueue()
        returned = time.time()
        done = TaskRecord.objects.filter(pk=result.id, status=TaskStatus.SUCCESSFUL)
        field = "return_value"
    else:
        before = time.time()
        ping = Ping.objects.create()
        returned = time.time()
        done = Ping.objects.filter(pk=ping.pk, started__isnull=False)
        field = "started"
    if mark is not None:
        mark("returned")
    deadline = time.monotonic() + timeout
    time.sleep(FIRST_LOOK_S)
    while time.monotonic() < deadline:
        found = done.values_list(field, flat=True).first()
        if found is not None:
            return {"before": before, "returned": returned, "handler": float(found)}
        time.sleep(0.002)
    raise RuntimeError(f"a {kind} unit did not run within {timeout}s")


def idle_cost(pid: int, seconds: float) -> dict[str, Any]:
    """CPU (% of one core) of the supervisor and its children while idle, and their memory
    (``memory.tree_memory``: RSS, PSS and USS, each process and summed)."""
    time.sleep(1.0)  # let the last unit's bookkeeping settle
    pids = [pid, *memory.children(pid)]
    before = sum(cpu_seconds(p) for p in pids)
    time.sleep(seconds)
    used = sum(cpu_seconds(p) for p in pids) - before
    held = memory.tree_memory(pid)
    return {"idle_cpu_percent": round(100 * used / seconds, 2),
            "idle_rss_mb": held["rss_mb"], "idle_pss_mb": held["pss_mb"],
            "idle_uss_mb": held["uss_mb"], "processes": held["processes"],
            "idle_memory": held["each"]}


def cpu_seconds(pid: int) -> float:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def figures(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, round(p / 100 * (len(ms) - 1)))], 2)

    return {"n": len(ms), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "max_ms": round(ms[-1], 2), "mean_ms": round(statistics.fmean(ms), 2)}


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "wake-up", "kind", "n", "from the caller: p50 / p90 / p99 ms",
               "from the commit: p50 / p90 / p99 ms", "max ms (caller)",
               "idle CPU % (sup + 2 children)", "idle RSS MB"]
    rows = []
    for r in results:
        wake = wake_up(r)
        for kind in ("tasks", "rows"):
            c, f = r["caller"][kind], r["from_commit"][kind]
            rows.append([r["db"], wake, kind, c["n"],
                         f"{c['p50_ms']} / {c['p90_ms']} / {c['p99_ms']}",
                         f"{f['p50_ms']} / {f['p90_ms']} / {f['p99_ms']}", c["max_ms"],
                         r["idle_cpu_percent"], r["idle_rss_mb"]])
    return benchlib.markdown_table(headers, rows)


def memory_report(results: list[dict[str, Any]]) -> str:
    """The idle tree's memory by database: RSS, PSS and USS summed, and each process's."""
    headers = ["db", "wake-up", "idle RSS MB", "idle PSS MB", "idle USS MB",
               "each process RSS / PSS / USS MB"]
    rows = [[r["db"], wake_up(r), r["idle_rss_mb"], r.get("idle_pss_mb", "-"),
             r.get("idle_uss_mb", "-"),
             ", ".join(f"{e['role']} {e['rss_mb']} / {e['pss_mb']} / {e['uss_mb']}"
                       for e in r.get("idle_memory", []))]
            for r in results]
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
