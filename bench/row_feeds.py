"""Rows as users write them, drained by a worker declared as users declare it.

    .venv/bin/python bench/row_feeds.py [--db postgres|sqlite|mariadb|all] [--rows 5000] [--runs 3]
                                        [--feeds bulk,save,precreated] [--history 1000000]
                                        [--explain FOLDER]

The worker is ``benchapp.workers.feed`` (``@worker(source=Feed, concurrency=2)``, a no-op
handler); every drain is a real ``manage.py runworkers --burst --concurrency 2 --worker
feed``, timed from its start to its exit. Each drain gets a **fresh database** (PostgreSQL
and MariaDB: ``CREATE DATABASE``, migrated; SQLite: a new file): tables nobody has
analyzed, as on a new deployment (the test server runs with autovacuum off; on a real
one autovacuum analyzes a table only after enough changes, so a new table's first
thousands of rows are planned without statistics too). The feeds, alternated within each run:

- ``bulk``: ``Feed.objects.bulk_create()`` of ``--rows`` rows (batches of 1,000): no
  execution exists, the discovery sweep finds them. The headline.
- ``save``: ``Feed.objects.create()`` ``--rows`` times in one ``transaction.atomic()``:
  ``post_save`` makes each pending in the same transaction.
- ``precreated``: ``bulk_create()``, then the executions created by ``pending.add()``
  before runworkers starts. A shortcut no user takes, kept as the reference the other two
  are compared with (it is what ``throughput.py`` measures), never the headline.

Figures per feed: rows/s (``--rows`` / the median wall time, start-up included), our
processes' CPU (runworkers and its children) and the **server's CPU** per row, read from
``/proc`` during the drain (``benchlib.ServerCPU``; needs root or the server's user on the
server's machine): on PostgreSQL the backends serving the run's database; on MariaDB the
whole ``mariadbd`` process (one process serves every connection: the figure includes
everything the server did meanwhile, other databases' sessions and InnoDB's background
threads too).

**History burst** (``--history N``, default 1,000,000; 0 skips it): N source rows with a
FINISHED execution each (both loaded with ``bulk_create`` in batches of 10,000: a worker's
history), then one ``runworkers --burst`` over them (the workers' first pass, which walks
the history once and sets the watermark, as on a deployment that ran those units; timed
and printed when the cache is made), then 100 rows bulk-created, drained by ``runworkers
--burst --concurrency 1 --worker feed``; against the same 100 rows in an empty database.
Its target is a drain whose cost follows the new rows, not the history. The loaded
history is kept between runs (a database loads once per N and schema):

- PostgreSQL: a template database ``dbworker_bench_history_<N>_<schema>`` (``<schema>``: a
  hash of the migrations), never dropped here; each burst runs in a copy (``CREATE
  DATABASE ... TEMPLATE ... STRATEGY FILE_COPY``). ``DROP DATABASE`` it to reclaim space.
- SQLite: ``<tmp>/dbworker_bench_cache/history_<N>_<schema>.sqlite3``, copied per burst.
- ``--fresh-history`` loads them again.
- MariaDB: not run (there is no template database to copy a loaded history from, and
  loading a million rows per burst does not fit); ``claim_cost.py`` measures the claim
  against a million finished rows there.

``--explain FOLDER``: one more drain per feed (PostgreSQL) with ``auto_explain`` loaded in
every session of runworkers (``benchapp/explain.py``): the statements, their plans and
times, summarised into the JSON (slow: not counted in the figures).

Targets (issue 23, same run): bulk-created rows on PostgreSQL >= 2,000/s and >= 90% of the
precreated figure; the server's CPU per bulk-created row within 1.5x of a precreated one;
the history burst within 1.5x of the burst without history on both databases.

Writes bench/results/row_feeds.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import benchlib

WORKER = "feed"
FEEDS = ("bulk", "save", "precreated")
NEW_ROWS = 100  # the history burst's new rows
BATCH = 10_000  # bulk_create batches of the history
TARGETS = {"bulk_per_s": 2_000, "bulk_vs_precreated": 0.9, "server_cpu_ratio": 1.5,
           "history_ratio": 1.5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DB_CHOICES, default="all")
    parser.add_argument("--rows", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--feeds", default=",".join(FEEDS),
                        help="comma-separated: bulk, save, precreated (default: all three); "
                        "none: only the history burst")
    parser.add_argument("--history", type=int, default=1_000_000,
                        help="finished rows of the history burst (0: no history burst)")
    parser.add_argument("--fresh-history", action="store_true",
                        help="load the history again instead of using the cached copy")
    parser.add_argument("--explain", help="folder: also one auto_explain drain per feed")
    parser.add_argument("--child", choices=benchlib.DATABASES, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.feed_list = [f for f in args.feeds.split(",") if f and f != "none"]
    if set(args.feed_list) - set(FEEDS):
        parser.error(f"--feeds: choose among {', '.join(FEEDS)}")
    if args.child:
        Path(args.out).write_text(json.dumps(measure_database(args.child, args)))
        return
    dbs = benchlib.chosen(args.db)
    passed = [f"--rows={args.rows}", f"--runs={args.runs}", f"--feeds={args.feeds}",
              f"--history={args.history}", *(["--fresh-history"] if args.fresh_history else []),
              *([f"--explain={args.explain}"] if args.explain else [])]
    found = benchlib.per_database(Path(__file__), dbs, passed)
    results = [found[db] for db in dbs]
    table = report(results)
    path = benchlib.write_results("row_feeds.json", {
        "benchmark": "row_feeds",
        "machine": benchlib.machine(),
        "config": {"rows": args.rows, "runs": args.runs, "feeds": args.feed_list,
                   "history": args.history, "history_new_rows": NEW_ROWS,
                   "worker": f"{WORKER} (@worker(source=Feed, concurrency=2), no-op)",
                   "command": " ".join(command(2)[3:]), "targets": TARGETS},
        "results": results,
        "table": table,
    })
    print(table)
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def command(concurrency: int) -> list[str]:
    return [sys.executable, "-m", "django", "runworkers", "--burst",
            f"--concurrency={concurrency}", f"--worker={WORKER}", "--verbosity=0"]


# ----- in the child: one database kind ------------------------------------------------------


def measure_database(db: str, args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {"db": db, "rows": args.rows, "loadavg_1m": [],
                              "cpu_steal_percent": []}
    figures: dict[str, dict[str, list[Any]]] = {
        f: {"wall_s": [], "cpu_s": [], "server_cpu_s": []} for f in args.feed_list}
    empty: list[float] = []
    for run in range(args.runs if args.feed_list else 0):
        order = args.feed_list[run % len(args.feed_list):] + args.feed_list[
            :run % len(args.feed_list)]
        for feed in ["empty", *order]:
            result["loadavg_1m"].append(round(os.getloadavg()[0], 2))
            ticks = benchlib.cpu_ticks()
            drained = drain_fresh(db, feed, 0 if feed == "empty" else args.rows)
            result["cpu_steal_percent"].append(
                benchlib.steal_percent(ticks, benchlib.cpu_ticks()))
            if feed == "empty":
                empty.append(drained["wall_s"])
                continue
            for key in figures[feed]:
                figures[feed][key].append(drained[key])
            server = drained["server_cpu_s"]
            print(f"{db}: run {run + 1}: {feed}: {args.rows} in {drained['wall_s']:.2f}s "
                  f"({args.rows / drained['wall_s']:.0f}/s"
                  + (f", server CPU {1000 * server / args.rows:.3f} ms/row" if server else "")
                  + f", load {result['loadavg_1m'][-1]})", file=sys.stderr, flush=True)
    idle = statistics.median(empty) if empty else 0.0
    result["empty_burst_wall_s"] = [round(w, 3) for w in empty]
    for feed, f in figures.items():
        wall = statistics.median(f["wall_s"])
        servers = [s for s in f["server_cpu_s"] if s is not None]
        result[feed] = {
            "wall_s": [round(w, 3) for w in f["wall_s"]],
            "per_s": round(args.rows / wall),
            "net_per_s": round(args.rows / (wall - idle)) if wall > idle else None,
            "cpu_ms_per_row": round(1000 * statistics.median(f["cpu_s"]) / args.rows, 3),
            "server_cpu_s": [round(s, 2) for s in servers],
            "server_cpu_ms_per_row": (round(1000 * statistics.median(servers) / args.rows, 3)
                                      if servers else None),
        }
    if args.history and db != "mariadb":  # no template databases there: see the docstring
        result["history"] = history_burst(db, args)
    if args.explain and db == "postgres":
        result["explain"] = {feed: explained(db, feed, args) for feed in args.feed_list}
    return result


def drain_fresh(db: str, feed: str, rows: int, explain: str = "") -> dict[str, Any]:
    """A fresh database, ``rows`` rows fed the ``feed`` way, one timed drain."""
    with benchlib.scratch_database(db, feed) as name:
        open_database(db, name)
        fill(feed, rows)
        return drain(db, name, rows, explain=explain)


def open_database(db: str, name: str) -> None:
    """Point this process's default database at ``name`` (the first time: set Django up)
    and migrate it."""
    if "django" not in sys.modules or not _set_up:
        benchlib.setup_django(db, name)
        _set_up.append(name)
        return
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connections

    connections.close_all()
    os.environ.update(benchlib.environment(db, name))
    settings.DATABASES["default"]["NAME"] = name
    connections["default"].settings_dict["NAME"] = name
    call_command("migrate", verbosity=0)


_set_up: list[str] = []


def fill(feed: str, rows: int) -> None:
    from benchapp.models import Feed
    from django.db import connections, transaction

    from django_dbworker.rows import pending
    from django_dbworker.rows.registry import workers

    if feed == "save":
        with transaction.atomic():
            for i in range(rows):
                Feed.objects.create(payload=f"payload {i}")
    elif rows:
        Feed.objects.bulk_create([Feed(payload=f"payload {i}") for i in range(rows)],
                                 batch_size=1_000)
        if feed == "precreated":
            pks = list(Feed.objects.order_by("pk").values_list("pk", flat=True))
            pending.add(workers[WORKER], pks, "default")
    connections.close_all()  # nothing of ours holds the database while runworkers runs


def drain(db: str, name: str, rows: int, *, concurrency: int = 2,
          explain: str = "") -> dict[str, Any]:
    """Run runworkers until it exits: its wall time, our processes' CPU, the server's."""
    env = benchlib.environment(db, name)
    if explain:
        env["BENCH_AUTO_EXPLAIN"] = explain
    before = children_cpu()
    with server_cpu(db, name) as server:
        started = time.perf_counter()
        done = subprocess.run(command(concurrency), env=env, cwd=benchlib.ROOT,
                              capture_output=True, text=True)
        wall = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"runworkers exited with {done.returncode}:\n"
                           f"{done.stdout}\n{done.stderr}")
    check_drained(rows)
    return {"wall_s": wall, "cpu_s": children_cpu() - before,
            "server_cpu_s": server.seconds() if server is not None else None}


@contextmanager
def server_cpu(db: str, name: str) -> Iterator[benchlib.ServerCPU | None]:
    if db not in ("postgres", "mariadb"):
        yield None
        return
    with benchlib.ServerCPU(name, db=db) as cpu:
        yield cpu


def children_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check_drained(rows: int, finished_before: int = 0) -> None:
    from django.db import connections

    from django_dbworker.models import Execution, State

    done = Execution.objects.filter(worker=WORKER, state=State.FINISHED).count()
    connections.close_all()
    if done - finished_before != rows:
        raise RuntimeError(f"runworkers exited with {done - finished_before} of {rows} "
                           "rows done")


def explained(db: str, feed: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    from benchapp import explain

    folder = Path(args.explain) / feed
    shutil.rmtree(folder, ignore_errors=True)
    drain_fresh(db, feed, args.rows, explain=str(folder))
    return explain.summarise(folder, top=15)


# ----- the history burst ---------------------------------------------------------------------


def history_burst(db: str, args: argparse.Namespace) -> dict[str, Any]:
    """``NEW_ROWS`` bulk-created rows drained with ``--concurrency 1``, with and without a
    history of ``args.history`` finished rows, alternating; in copies of a cached database."""
    cache = history_cache(db, args.history, fresh=args.fresh_history)
    walls: dict[str, list[float]] = {"history": [], "none": []}
    for run in range(args.runs):
        for kind in (("history", "none") if run % 2 == 0 else ("none", "history")):
            with copy_of(db, cache if kind == "history" else None) as name:
                open_database(db, name)
                before = finished_count()
                fill("bulk", NEW_ROWS) if kind == "none" else add_rows(NEW_ROWS)
                env = benchlib.environment(db, name)
                started = time.perf_counter()
                done = subprocess.run(command(1), env=env, cwd=benchlib.ROOT,
                                      capture_output=True, text=True)
                walls[kind].append(time.perf_counter() - started)
                if done.returncode:
                    raise RuntimeError(f"runworkers exited with {done.returncode}:\n"
                                       f"{done.stderr}")
                check_drained(NEW_ROWS, before)
            print(f"{db}: history burst, run {run + 1}: {kind}: {walls[kind][-1]:.2f}s",
                  file=sys.stderr, flush=True)
    with_history, without = (statistics.median(walls[k]) for k in ("history", "none"))
    return {"history_rows": args.history, "new_rows": NEW_ROWS,
            "wall_s": {k: [round(w, 3) for w in v] for k, v in walls.items()},
            "ratio": round(with_history / without, 2), "cache": cache}


def finished_count() -> int:
    from django_dbworker.models import Execution, State

    return Execution.objects.filter(worker=WORKER, state=State.FINISHED).count()


def add_rows(rows: int) -> None:
    from benchapp.models import Feed
    from django.db import connections

    Feed.objects.bulk_create([Feed(payload="new") for _ in range(rows)])
    connections.close_all()


def schema_hash() -> str:
    """Changes when a migration of ours or of the bench app does."""
    digest = hashlib.sha256()
    for folder in (benchlib.ROOT / "django_dbworker" / "migrations",
                   benchlib.BENCH / "benchapp" / "migrations"):
        for path in sorted(folder.glob("*.py")):
            digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:10]


def sqlite_cache_folder() -> Path:
    return Path(tempfile.gettempdir()) / "dbworker_bench_cache"


def history_cache(db: str, size: int, *, fresh: bool) -> str:
    """The cached history database (loaded now if missing): its name or file. It is
    loaded under another name and renamed when complete, so an interrupted load is never
    taken for a cache."""
    key = f"history_{size}_{schema_hash()}"
    if db == "postgres":
        import psycopg

        name, loading = f"dbworker_bench_{key}", f"dbworker_bench_{key}_loading"
        with psycopg.connect(dbname="postgres", autocommit=True,
                             **benchlib.pg_connect_kwargs()) as c:
            exists = c.execute("SELECT 1 FROM pg_database WHERE datname = %s",
                               [name]).fetchone()
            if exists and not fresh:
                return name
            for old in (name, loading):
                c.execute(f'DROP DATABASE IF EXISTS "{old}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{loading}"')
    else:
        folder = sqlite_cache_folder()
        folder.mkdir(exist_ok=True)
        name, loading = str(folder / f"{key}.sqlite3"), str(folder / f"{key}.loading.sqlite3")
        if Path(name).exists() and not fresh:
            return name
        for old in folder.glob(f"{key}*"):
            old.unlink()
    started = time.perf_counter()
    open_database(db, loading)
    load_history(size)
    from django.db import connections

    connections.close_all()
    # The workers have seen their history: one burst over it, as the deployment that ran
    # those units left it (the first pass of a worker walks every row once and sets its
    # watermark; docs/workers.md). Timed and printed, not counted in the figures.
    first = time.perf_counter()
    done = subprocess.run(command(1), env=benchlib.environment(db, loading),
                          cwd=benchlib.ROOT, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"runworkers exited with {done.returncode}:\n{done.stderr}")
    print(f"{db}: the first pass over the history took {time.perf_counter() - first:.1f}s",
          file=sys.stderr, flush=True)
    if db == "postgres":
        with psycopg.connect(dbname="postgres", autocommit=True,
                             **benchlib.pg_connect_kwargs()) as c:
            c.execute(f'ALTER DATABASE "{loading}" RENAME TO "{name}"')
    else:
        with sqlite3.connect(loading) as c:  # the WAL into the file, so one file is the copy
            c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        Path(loading).rename(name)
    print(f"{db}: history of {size:,} rows loaded in {time.perf_counter() - started:.0f}s "
          f"(kept: {name})", file=sys.stderr, flush=True)
    return name


def load_history(size: int) -> None:
    """``size`` Feed rows, each with a FINISHED execution of the worker: ``bulk_create``
    in batches of ``BATCH``, one transaction per batch, as an application's import would."""
    from benchapp.models import Feed
    from django.db import transaction
    from django.utils import timezone

    from django_dbworker.models import Execution, State

    now = timezone.now()
    for start in range(0, size, BATCH):
        count = min(BATCH, size - start)
        with transaction.atomic():
            rows = Feed.objects.bulk_create([Feed(payload="history") for _ in range(count)])
            Execution.objects.bulk_create([
                Execution(worker=WORKER, source_id=str(row.pk), sort_key=row.pk,
                          state=State.FINISHED, attempts=1, available_at=now,
                          created_at=now, started_at=now, finished_at=now)
                for row in rows])


@contextmanager
def copy_of(db: str, cache: str | None) -> Iterator[str]:
    """A fresh database: a copy of ``cache``, or an empty one (migrated by the caller)."""
    if cache is None:
        with benchlib.scratch_database(db, "burst") as name:
            yield name
        return
    if db == "postgres":
        import psycopg

        name = f"dbworker_bench_{os.getpid()}_history"
        with psycopg.connect(dbname="postgres", autocommit=True,
                             **benchlib.pg_connect_kwargs()) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{cache}" STRATEGY FILE_COPY')
        try:
            yield name
        finally:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(dbname="postgres", autocommit=True,
                                 **benchlib.pg_connect_kwargs()) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        return
    folder = tempfile.mkdtemp(prefix="dbworker_bench_")
    try:
        path = Path(folder) / "history.sqlite3"
        shutil.copyfile(cache, path)
        yield str(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


# ----- the report ----------------------------------------------------------------------------


def report(results: list[dict[str, Any]]) -> str:
    headers = ["db", "feed", "rows", "runs: wall s", "rows/s (median)", "net rows/s",
               "vs precreated", "CPU ms/row (ours)", "server CPU ms/row", "vs precreated"]
    lines = []
    for r in results:
        base = r.get("precreated")
        for feed in FEEDS:
            if feed not in r:
                continue
            f = r[feed]
            server = f["server_cpu_ms_per_row"]
            label = feed + (" (shortcut, reference)" if feed == "precreated" else "")
            lines.append([
                r["db"], label, r["rows"], ", ".join(f"{w:.2f}" for w in f["wall_s"]),
                f["per_s"], f["net_per_s"] or "",
                f"{f['per_s'] / base['per_s']:.0%}" if base else "",
                f["cpu_ms_per_row"], server if server is not None else "",
                (f"{server / base['server_cpu_ms_per_row']:.2f}x"
                 if base and server and base["server_cpu_ms_per_row"] else ""),
            ])
    table = benchlib.markdown_table(headers, lines)
    bursts = [r for r in results if "history" in r]
    if bursts:
        rows = [[r["db"], f"{r['history']['history_rows']:,}", r["history"]["new_rows"],
                 ", ".join(f"{w:.2f}" for w in r["history"]["wall_s"]["history"]),
                 ", ".join(f"{w:.2f}" for w in r["history"]["wall_s"]["none"]),
                 f"{r['history']['ratio']}x", f"<= {TARGETS['history_ratio']}x"]
                for r in bursts]
        table += "\n\n" + benchlib.markdown_table(
            ["db", "history rows", "new rows", "with history: wall s",
             "without: wall s", "ratio (medians)", "target"], rows)
    return table


if __name__ == "__main__":
    main()
