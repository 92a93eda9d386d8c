"""What ``manage.py dbworker purge`` costs at size, and what it costs everyone else while
it runs (issue 39): ``size`` waiting tasks enqueued as an application does
(``enqueue_many``), then ``dbworker purge --yes`` from the command, timed from the caller's
side, while a second thread enqueues one task every 50 ms on its own connection, as a web
request would, and records how long each enqueue waited. ``--code DIR`` measures the
django_dbworker found in DIR (a checkout of an earlier commit: the "before").

    PYTHONPATH=. .venv/bin/python bench/bulk_ops.py --db postgres --sizes 100000 1000000
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from io import StringIO
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import benchlib

#: Seconds between two enqueues of the probing thread.
PROBE_EVERY = 0.05


def probe(stop: threading.Event, waits: list[float]) -> None:
    """Enqueue one task every PROBE_EVERY seconds until ``stop``; each enqueue's seconds."""
    from django.db import connection
    from django.utils.module_loading import import_string

    noop = import_string("benchapp.tasks.noop")
    try:
        while not stop.is_set():
            started = time.perf_counter()
            noop.enqueue()
            waits.append(time.perf_counter() - started)
            stop.wait(PROBE_EVERY)
    finally:
        connection.close()


def child(db: str, size: int, out: str, code: str | None) -> None:
    if code:
        sys.path.insert(0, code)
    with benchlib.scratch_database(db, tag=f"bulk{size}") as name:
        benchlib.setup_django(db, name)
        from django.core.management import call_command

        import django_dbworker

        print(f"  code: {Path(django_dbworker.__file__).parent}", file=sys.stderr)
        started = time.perf_counter()
        benchlib.load_tasks("benchapp.tasks.noop", size)
        loaded = time.perf_counter() - started
        print(f"  {size}: enqueued in {loaded:.1f} s", file=sys.stderr, flush=True)
        stop, waits = threading.Event(), []
        prober = threading.Thread(target=probe, args=(stop, waits))
        prober.start()
        time.sleep(1.0)  # the probe's own baseline first
        baseline = len(waits)
        started = time.perf_counter()
        call_command("dbworker", "purge", "--yes", stdout=StringIO(), stderr=StringIO())
        purged = time.perf_counter() - started
        stop.set()
        prober.join()
        during = waits[baseline:]
        result = {"size": size, "code": str(Path(django_dbworker.__file__).parent),
                  "enqueue_many_s": round(loaded, 1), "purge_s": round(purged, 2),
                  "probe_enqueues": len(during),
                  "probe_median_ms": round(statistics.median(during) * 1000, 1) if during
                  else None,
                  "probe_max_ms": round(max(during) * 1000, 1) if during else None}
        print(f"  purge: {purged:.2f} s; an enqueue meanwhile waited at most "
              f"{result['probe_max_ms']} ms ({len(during)} enqueues)", file=sys.stderr)
        Path(out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--db", default="postgres", choices=["postgres", "mariadb", "sqlite"])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--label", default="after", help="before or after (the results' name)")
    parser.add_argument("--code", help="a folder holding the django_dbworker to measure")
    parser.add_argument("--child-size", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child_size:
        child(args.db, args.child_size, args.out, args.code)
        return
    code = ["--code", args.code] if args.code else []
    results = benchlib.per_size(__file__, args.sizes, ["--db", args.db, *code])
    rows = [(r["size"], f"{r['purge_s']:.2f} s", f"{r['probe_median_ms']} ms",
             f"{r['probe_max_ms']} ms") for r in results]
    print(benchlib.markdown_table(["waiting tasks", "purge", "enqueue meanwhile (median)",
                                   "enqueue meanwhile (max)"], rows))
    benchlib.write_results(f"bulk-ops-{args.db}-{args.label}.json", {
        "benchmark": "bulk_ops", "db": args.db, "label": args.label,
        "machine": benchlib.machine(), "results": results})


if __name__ == "__main__":
    main()
