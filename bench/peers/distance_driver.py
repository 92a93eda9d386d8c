"""The inner driver of bench/distance.py: one system at one round-trip time, counted.

    <venv>/bin/python bench/peers/distance_driver.py --module peer_celery --config C.json \\
        --out OUT.json

bench/distance.py starts it inside its network namespace, with the system's own Python (a
peer's virtualenv, or ours), ``PYTHONPATH`` holding bench/peers (and bench/ for ours). It
needs the standard library, ``driver.py`` (start/stop of worker processes) and the system's
module, whose ``Bench(config)`` is the one ``driver.py`` describes (``setup``, ``fill``,
``workers``, ``remaining``, ``pending``, ``stamp``, ``teardown``), plus, optionally:

- ``started(path)``: the handler's start (``time.time()``) of the stamp job just enqueued,
  or None while it has not started (default: the file ``path`` the stamp job writes);
- ``exits``: True when the workers exit by themselves once the queue is empty (raw SQL).

The system's module reads the caller's address (its enqueue goes through the caller's
forwarder) when it is imported; the worker processes get ``config["worker_env"]`` (the
workers' forwarder) on top of the environment. What polls for progress is the system's
``remaining()``/``pending()``; ``probe(bench)`` points it straight at the server (no
forwarder), so that polling neither adds delay nor counts.

Phases, each between two snapshots of every forwarder (``netdelay.snapshot``: the turns,
i.e. the round trips a client waited for) and of the server's statement counts
(PostgreSQL: ``pg_stat_statements`` of every user but the probe's; Redis: ``INFO
commandstats`` but the probe's commands):

1. ``fill``: ``jobs`` jobs enqueued as an application would, through the caller's link;
2. ``drain``: the workers started, until nothing is left (``per_s``); ``net``: from the
   first job done to the end (``net_per_s``, without start-up);
3. ``idle``: the workers idle for ``idle_s`` seconds (what they send when nothing happens);
4. ``latency``: ``samples`` times, after an idle gap, one stamp job; latency = the
   handler's first line - the moment just before the enqueue call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import os
import random
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import driver

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("netdelay", HERE.parent / "netdelay.py")
assert _spec is not None and _spec.loader is not None
netdelay = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netdelay)

DRAIN_TIMEOUT_S = 240.0
POLL_S = 0.01
#: Seconds before the first look for a stamp, then between looks. The stamp holds the
#: handler's start, so when we look does not change the figure; looking every millisecond
#: took CPU from the job on its way (2 CPUs), as latency.py found.
FIRST_LOOK_S, LOOK_S = 0.005, 0.002


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--config", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = json.loads(Path(args.config).read_text())
    try:
        module = importlib.import_module(args.module)
        bench = module.Bench(config)
        try:
            result = measure(bench, config)
        finally:
            bench.teardown()
    except Exception as e:
        traceback.print_exc()
        Path(args.out).write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
    Path(args.out).write_text(json.dumps(result))


class Counter:
    """Snapshots of the forwarders' turns and of the server's statement counts."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.links = config["links"]  # {name: {"pid": ..., "stats": path}}
        self.pg = self.redis = None
        server = config.get("server", {})
        if "pg_dsn" in server:
            import psycopg

            self.pg = psycopg.connect(server["pg_dsn"], autocommit=True)
        if "redis_port" in server:
            import redis

            self.redis = redis.Redis(host="127.0.0.1", port=server["redis_port"])

    def snapshot(self) -> dict[str, Any]:
        found: dict[str, Any] = {"t": time.perf_counter()}
        for name, link in self.links.items():
            found[name] = netdelay.snapshot(link["pid"], link["stats"])["total"]
        if self.pg is not None:
            found["statements"] = self.pg.execute(
                "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements "
                "WHERE userid <> (SELECT oid FROM pg_roles WHERE rolname = current_user)"
            ).fetchone()[0]
        if self.redis is not None:
            stats = self.redis.info("commandstats")
            probe = ("cmdstat_llen", "cmdstat_hlen", "cmdstat_info")
            found["statements"] = sum(v["calls"] for k, v in stats.items() if k not in probe)
        return found

    def queries(self) -> dict[str, int]:
        """PostgreSQL only: the calls of each statement so far, the probe's excluded."""
        if self.pg is None:
            return {}
        return dict(self.pg.execute(
            "SELECT left(regexp_replace(query, '\\s+', ' ', 'g'), 160), sum(calls)::bigint "
            "FROM pg_stat_statements WHERE userid <> (SELECT oid FROM pg_roles "
            "WHERE rolname = current_user) GROUP BY 1").fetchall())

    def between(self, before: dict[str, Any], after: dict[str, Any], units: int
                ) -> dict[str, Any]:
        """Per unit between two snapshots: turns of each link, statements."""
        result: dict[str, Any] = {"seconds": round(after["t"] - before["t"], 3),
                                  "units": units}
        for name in self.links:
            turns = after[name]["turns"] - before[name]["turns"]
            result[f"{name}_turns"] = turns
            result[f"{name}_turns_per_unit"] = round(turns / units, 2) if units else None
            result[f"{name}_bytes_per_unit"] = (round(
                (after[name]["bytes_up"] + after[name]["bytes_down"]
                 - before[name]["bytes_up"] - before[name]["bytes_down"]) / units)
                if units else None)
        if "statements" in after:
            count = after["statements"] - before["statements"]
            result["statements"] = count
            result["statements_per_unit"] = round(count / units, 2) if units else None
        return result

    def close(self) -> None:
        if self.pg is not None:
            self.pg.close()
        if self.redis is not None:
            self.redis.close()


def measure(bench: Any, config: dict[str, Any]) -> dict[str, Any]:
    jobs, samples = config["jobs"], config["samples"]
    counter = Counter(config)
    logs = Path(config["logs"])
    try:
        bench.setup()
        s_fill = counter.snapshot()
        bench.fill(jobs)
        s_filled = counter.snapshot()
        probe(bench, config)
        os.environ.update(config.get("worker_env", {}))
        s_launch = counter.snapshot()
        launched = time.perf_counter()
        processes = driver.start(bench.workers(), logs)
        try:
            first, first_left, s_first = drain(bench, jobs, processes, logs, counter, launched)
            s_drained = counter.snapshot()
            wall = s_drained["t"] - launched
            result: dict[str, Any] = {
                "jobs": jobs,
                "wall_s": round(wall, 3),
                "per_s": round(jobs / wall),
                "first_done_s": round(first - launched, 3),
                "net_per_s": round(first_left / (s_drained["t"] - first))
                if first_left and s_drained["t"] > first else None,
                "check": bench.check(jobs),
                "loadavg_1m": round(os.getloadavg()[0], 2),
                "fill": counter.between(s_fill, s_filled, jobs),
                "drain": counter.between(s_launch, s_drained, jobs),
                "net": counter.between(s_first, s_drained, first_left),
            }
            if samples and not getattr(bench, "exits", False):
                result.update(idle_and_latency(bench, config, processes, logs, counter))
        finally:
            driver.stop(processes)
    finally:
        counter.close()
    return result


def probe(bench: Any, config: dict[str, Any]) -> None:
    """Point the system's progress polling straight at the server (not through a link)."""
    server = config.get("server", {})
    if hasattr(bench, "probe"):
        bench.probe(server)
    elif "redis_port" in server and hasattr(bench, "redis"):
        import redis

        bench.redis.close()
        bench.redis = redis.Redis(host="127.0.0.1", port=server["redis_port"],
                                  db=config.get("redis_db", 0))
    elif "pg_dsn" in server and hasattr(bench, "db"):
        import psycopg

        bench.db.close()
        bench.db = psycopg.connect(server["pg_dsn"] + f" dbname={config['pg_name']}",
                                   autocommit=True)


def drain(bench: Any, jobs: int, processes: list[Any], logs: Path, counter: Counter,
          launched: float) -> tuple[float, int, dict[str, Any]]:
    """Poll until nothing is left (or, for workers that exit, until they exited); the
    moment of the first progress, the jobs left then, and a snapshot taken then."""
    exits = getattr(bench, "exits", False)
    first, first_left, s_first = None, jobs, None
    while True:
        if first is None:
            left = bench.remaining()
            if left < jobs:
                s_first = counter.snapshot()
                first, first_left = s_first["t"], left
        if exits:
            if all(p.poll() is not None for p in processes):
                break
        elif first is not None and not bench.pending():
            break
        if time.perf_counter() - launched > DRAIN_TIMEOUT_S:
            tails = "\n".join(p.read_text(errors="replace")[-2000:]
                              for p in sorted(logs.glob("*.log")))
            raise RuntimeError(f"not drained within {DRAIN_TIMEOUT_S:g}s: "
                               f"{bench.remaining()} of {jobs} left; the workers' logs:\n"
                               f"{tails}")
        if not exits:
            driver.alive(processes, logs)
        time.sleep(POLL_S)
    if s_first is None:  # drained before the first look
        s_first = counter.snapshot()
        first, first_left = s_first["t"], 0
    return first, first_left, s_first


def idle_and_latency(bench: Any, config: dict[str, Any], processes: list[Any], logs: Path,
                     counter: Counter) -> dict[str, Any]:
    folder = logs / "stamps"
    shutil.rmtree(folder, ignore_errors=True)  # an earlier run's stamps (distance.py --runs)
    folder.mkdir(parents=True)
    one(bench, str(folder / "warm-up"), processes, logs)
    time.sleep(0.5)
    q_idle, s_idle = counter.queries(), counter.snapshot()
    time.sleep(config["idle_s"])
    s_idled, q_idled = counter.snapshot(), counter.queries()
    idle = counter.between(s_idle, s_idled, 1)
    idle["statements_by_query"] = calls_between(q_idle, q_idled, 1)
    idle["turns_per_s"] = {name: round(idle[f"{name}_turns"] / idle["seconds"], 2)
                           for name in counter.links}
    seconds, per_sample = [], []
    q_first = counter.queries()
    low, high = config["gap_s"]
    for i in range(config["samples"]):
        time.sleep(random.uniform(low, high))
        before = counter.snapshot()
        seconds.append(one(bench, str(folder / str(i)), processes, logs))
        time.sleep(config.get("settle_s", 0.05))  # the completion's own round trips
        per_sample.append(counter.between(before, counter.snapshot(), 1))
    by_query = calls_between(q_first, counter.queries(), len(seconds))
    ms = sorted(s * 1000 for s in seconds)

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, round(p / 100 * (len(ms) - 1)))], 2)

    turns = {name: statistics.median(s[f"{name}_turns"] for s in per_sample)
             for name in counter.links}
    statements = ([s["statements"] for s in per_sample] if "statements" in per_sample[0]
                  else None)
    return {
        "idle": idle,
        "latency": {"n": len(ms), "p50_ms": pct(50), "p90_ms": pct(90), "max_ms": pct(100),
                    "mean_ms": round(statistics.fmean(ms), 2),
                    "turns_per_job_median": turns,
                    "statements_per_job_median": statistics.median(statements)
                    if statements else None,
                    "statements_by_query_per_job": by_query,
                    "window": "from before the enqueue call to the handler's start, then "
                              f"{config.get('settle_s', 0.05)} s more"},
    }


def calls_between(before: dict[str, int], after: dict[str, int], units: int
                  ) -> dict[str, float]:
    """The statements run between two ``Counter.queries()``, per unit, most called first
    (the whole latency phase: its idle gaps too)."""
    calls = {q: n - before.get(q, 0) for q, n in after.items() if n > before.get(q, 0)}
    return {q: round(n / units, 2) for q, n in sorted(calls.items(), key=lambda x: -x[1])}


def one(bench: Any, path: str, processes: list[Any], logs: Path, timeout: float = 30.0
        ) -> float:
    """One stamp job: seconds from just before the enqueue call to the handler's start."""
    before = time.time()
    bench.stamp(path)
    deadline = time.monotonic() + timeout
    time.sleep(FIRST_LOOK_S)
    while True:
        started = started_at(bench, path)
        if started is not None:
            return started - before
        if time.monotonic() > deadline:
            driver.alive(processes, logs)
            raise RuntimeError(f"a stamp job did not start within {timeout:g}s")
        time.sleep(LOOK_S)


def started_at(bench: Any, path: str) -> float | None:
    if hasattr(bench, "started"):
        return bench.started(path)
    with contextlib.suppress(OSError, ValueError):
        return float(Path(path).read_text())
    return None


if __name__ == "__main__":
    main()
