"""What a process tree holds in memory: RSS, PSS and USS of each process and in total.

- RSS (resident set size, ``VmRSS``) counts every resident page the process maps, also the
  pages it shares with others: a forked child's copy of its parent's heap, until either
  writes it, and the shared libraries. Summed over processes, shared pages count once per
  process.
- PSS (proportional set size) divides each shared page by the number of processes that map
  it: summed over processes, it is what the tree holds.
- USS (unique set size: private clean + private dirty) is what only this process holds: the
  memory its exit would give back.

PSS and USS come from ``/proc/<pid>/smaps_rollup`` (Linux 4.14+), readable for our own
processes. ``bench/latency.py`` reports them for its idle supervisor. Run alone, this
compares the idle tree of two checkouts of the code, interleaved in one run (A/B):

    .venv/bin/python bench/memory.py [--db postgres|sqlite|mariadb|all] [--rounds 2]
                                     [--code /work/main --code .] [--units 20]

For each database (one, fresh), round and checkout: a real ``runworkers
--concurrency=2 --worker=ping --queue=default`` importing django_dbworker from that
checkout (the bench settings and ``benchapp`` are this one's), ``--units`` tasks and rows
run through it, ``--settle`` seconds idle, then its memory. ``--floor`` adds two trees of
the same shape without our code: Django with no app and the driver, connected; and the
interpreter alone. Writes
bench/results/memory.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

MB = 1024  # /proc reports kB


def children(pid: int) -> list[int]:
    """The process's direct children (empty once it exited)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_memory(pid: int) -> dict[str, float]:
    """RSS, PSS and USS of one process, in MB (zeros once it exited)."""
    kb: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            key, value = line.split(":", 1)
            kb[key] = int(value.split()[0])
    except OSError:
        pass
    uss = kb.get("Private_Clean", 0) + kb.get("Private_Dirty", 0)
    return {"rss_mb": round(kb.get("Rss", 0) / MB, 1), "pss_mb": round(kb.get("Pss", 0) / MB, 1),
            "uss_mb": round(uss / MB, 1)}


def tree_memory(pid: int) -> dict[str, Any]:
    """RSS, PSS and USS of ``pid`` and its children: each process and the sums (MB)."""
    pids = [pid, *children(pid)]
    each = [{"pid": p, "role": "supervisor" if p == pid else "child", **process_memory(p)}
            for p in pids]
    total = {key: round(sum(e[key] for e in each), 1) for key in ("rss_mb", "pss_mb", "uss_mb")}
    return {"processes": len(pids), **total, "each": each}


def main() -> None:
    import benchlib

    parser = argparse.ArgumentParser(description="Idle memory of runworkers, A/B.")
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--code", action="append",
                        help="a checkout whose django_dbworker to run (repeatable; default .)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--units", type=int, default=20)
    parser.add_argument("--settle", type=float, default=5.0)
    parser.add_argument("--floor", action="store_true",
                        help="also measure the floor: Django with no app and the driver, "
                             "connected, in a process and two forked children; and "
                             "the interpreter alone in the same shape")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--floor-of", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor_of:
        print(json.dumps(floor(args.settle)))
        return
    codes = [str(Path(c).resolve()) for c in (args.code or ["."])]
    if args.child:
        Path(args.out).write_text(json.dumps(measure(args.child, codes, args)))
        return
    passed = [f"--rounds={args.rounds}", f"--units={args.units}", f"--settle={args.settle}",
              *(f"--code={c}" for c in codes), *(["--floor"] if args.floor else [])]
    found = benchlib.per_database(Path(__file__), benchlib.chosen(args.db), passed)
    results = [r for db in found for r in found[db]]
    table = report(results)
    path = benchlib.write_results("memory.json", {
        "benchmark": "memory", "machine": benchlib.machine(),
        "config": {"rounds": args.rounds, "units": args.units, "settle_s": args.settle,
                   "codes": codes,
                   "command": "runworkers --concurrency=2 --worker=ping --queue=default"},
        "results": results, "table": table})
    print(table)
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def measure(db: str, codes: list[str], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each checkout's idle tree, ``--rounds`` times, alternating, on one database."""
    import benchlib

    results = []
    with benchlib.scratch_database(db, "memory") as name:
        benchlib.setup_django(db, name)
        from django.db import connections

        for round_ in range(args.rounds):
            for code in codes:
                connections.close_all()
                env = {**benchlib.environment(db, name),
                       "PYTHONPATH": os.pathsep.join([str(benchlib.BENCH), code])}
                command = [sys.executable, "-m", "django", "runworkers", "--concurrency=2",
                           "--worker=ping", "--queue=default", "--verbosity=0"]
                process = subprocess.Popen(command, env=env, cwd=code)
                try:
                    run_units(args.units)
                    time.sleep(args.settle)
                    held = tree_memory(process.pid)
                finally:
                    process.send_signal(signal.SIGTERM)
                    process.wait(60)
                results.append({"db": db, "code": code, "round": round_,
                                "loadavg_1m": round(os.getloadavg()[0], 2), **held})
            if args.floor:
                found = subprocess.run(
                    [sys.executable, __file__, f"--floor-of={db}", f"--settle={args.settle}"],
                    env=benchlib.environment(db, name), check=True, capture_output=True,
                    text=True).stdout
                results.append({"db": db, "code": "floor: Django, no app, the driver",
                                "round": round_, "loadavg_1m": round(os.getloadavg()[0], 2),
                                **json.loads(found)})
                results.append({"db": db, "code": "floor: Python alone",
                                "round": round_, "loadavg_1m": round(os.getloadavg()[0], 2),
                                **bare_python(args.settle)})
    return results


def floor(settle: float) -> dict[str, Any]:
    """What any Django process tree of the same shape holds: Django with no installed app and
    the database driver, connected, heap frozen, then two forked children, each connected
    (the bench settings' database, ``BENCH_DB``)."""
    import gc

    import bench_settings
    from django.conf import settings

    settings.configure(INSTALLED_APPS=[], DATABASES=bench_settings.DATABASES, USE_TZ=True)
    import django
    import django.tasks  # the Tasks framework, as our backend needs it
    from django.db import connection

    django.setup()
    connection.ensure_connection()
    connection.close()
    gc.freeze()
    children = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            connection.ensure_connection()
            connection.cursor().execute("SELECT 1")
            time.sleep(settle + 5)
            os._exit(0)
        children.append(pid)
    connection.ensure_connection()
    connection.cursor().execute("SELECT 1")
    time.sleep(settle)
    held = tree_memory(os.getpid())
    for pid in children:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return held


#: A process of this Python with nothing imported beyond start-up, forked twice (the
#: children each sleep): the interpreter's share of any tree of the same shape.
BARE = """
import os, sys, time
for _ in range(2):
    if os.fork() == 0:
        time.sleep(float(sys.argv[1]) + 5)
        os._exit(0)
print(flush=True)
time.sleep(float(sys.argv[1]) + 5)
"""


def bare_python(settle: float) -> dict[str, Any]:
    """What the interpreter alone holds in the same shape: a process and two forked
    children, no Django, no driver (``site`` and the virtualenv's ``.pth`` files as ever)."""
    process = subprocess.Popen([sys.executable, "-c", BARE, str(settle)],
                               stdout=subprocess.PIPE)
    try:
        assert process.stdout is not None
        process.stdout.readline()  # both children forked
        time.sleep(settle)
        return tree_memory(process.pid)
    finally:
        for pid in [*children(process.pid), process.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait()


def run_units(count: int, timeout: float = 60.0) -> None:
    """``count`` tasks and ``count`` rows through the supervisor; return once all ran."""
    from benchapp.models import Ping
    from benchapp.tasks import stamp

    from django_dbworker.models import TaskRecord, TaskStatus

    tasks = [stamp.enqueue().id for _ in range(count)]
    rows = [Ping.objects.create().pk for _ in range(count)]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done = (TaskRecord.objects.filter(pk__in=tasks, status=TaskStatus.SUCCESSFUL).count()
                + Ping.objects.filter(pk__in=rows, started__isnull=False).count())
        if done == 2 * count:
            return
        time.sleep(0.05)
    raise RuntimeError(f"{count} tasks and {count} rows did not all run within {timeout}s")


def report(results: list[dict[str, Any]]) -> str:
    import benchlib

    headers = ["db", "code", "round", "RSS MB", "PSS MB", "USS MB",
               "each process RSS / PSS / USS MB", "load 1m"]
    rows = [[r["db"], r["code"], r["round"], r["rss_mb"], r["pss_mb"], r["uss_mb"],
             ", ".join(f"{e['role']} {e['rss_mb']} / {e['pss_mb']} / {e['uss_mb']}"
                       for e in r["each"]), r["loadavg_1m"]]
            for r in results]
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
