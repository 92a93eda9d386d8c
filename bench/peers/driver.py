"""The shared driver of the peer benchmarks: it runs inside a peer's own virtualenv.

    bench/.peers/<peer>/bin/python bench/peers/driver.py --peer <peer> --config CONFIG.json \
        --out OUT.json

``bench/peers.py`` (in the project's virtualenv) starts it; nothing here is imported by our
virtualenv, and it needs only the standard library and the peer's module
(``peer_<peer>.py`` beside it), which owns what differs between peers: its app, its no-op
and stamp jobs, how to enqueue, the worker command(s), how to count what is left.

A peer module defines ``Bench(config)`` with:

- ``setup()``: schema or migrations, an empty queue;
- ``tuning()`` / ``versions()``: what the JSON records (settings changed from the
  defaults, and why; package versions);
- ``fill(jobs)``: enqueue ``jobs`` no-op jobs, the way an application would;
- ``workers()``: the worker command(s), each started as a process group of its own;
- ``remaining()``: how many jobs are not done yet (a count, polled while workers start);
- ``pending()``: whether any is left (cheap, polled while the queue drains);
- ``stamp(path)``: enqueue one job that writes ``time.time()`` at its start into ``path``
  (its enqueue call first: the caller's side is timed from just before ``stamp()``); it
  may return the moment of the commit/publish, if it comes well before its return;
- ``check(jobs)``: after a drain, what the peer recorded (done, failed);
- ``teardown()``: close connections;
- ``poll_s`` (optional): how often its idle workers poll (latency samples are spread over
  that period, so that they come at a random phase of it).

Per run: ``fill(jobs)``, start the workers, poll until nothing is left, stop them.

- ``per_s`` = jobs / (worker start -> nothing left), start-up included;
- ``net_per_s`` = jobs left at the first sign of progress / (last job done - that moment):
  the same drain without the workers' start-up (imports, connections, forking);
- ``cpu_ms_per_job`` = CPU time of the worker processes (and their children) from their
  launch to the end of the drain, per job: what wall time hides on a busy machine;
- latency (last run, workers still idle): ``--samples`` times, a random 20-100 ms (plus a
  random part of ``poll_s``) after the previous one, ``stamp(path)``; two latencies, to the
  stamp (handler start): ``caller``, from just before ``stamp()`` (the enqueue call: what
  its caller waits, as ``bench/latency.py`` times ours), and ``from_commit``, from the
  moment the enqueue call returned (committed), or the moment ``stamp()`` returns, if it
  knows better (Celery: the publish).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # the peer's virtualenv (not resolved: it is a symlink)
STARTUP_POLL_S = 0.01  # remaining() while the workers start: finds the first progress
DRAIN_POLL_S = 0.025  # pending() while the queue drains: <0.5% of a 5 s drain, light
DRAIN_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 20.0


def write_stamp(path: str) -> None:
    """What a stamp job does first: note when it started, atomically."""
    now = time.time()
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        f.write(repr(now))
    os.replace(partial, path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peer", required=True)
    parser.add_argument("--config", required=True, help="a JSON file (bench/peers.py)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    config = json.loads(Path(args.config).read_text())
    module = importlib.import_module(f"peer_{args.peer}")
    try:
        bench = module.Bench(config)
        try:
            result = measure(bench, config)
        finally:
            bench.teardown()
    except Exception as e:  # recorded as the reason this peer could not run
        traceback.print_exc()
        Path(args.out).write_text(json.dumps({"error": f"{type(e).__name__}: {e}"}))
        sys.exit(1)
    Path(args.out).write_text(json.dumps(result))


def measure(bench: Any, config: dict[str, Any]) -> dict[str, Any]:
    jobs, runs, samples = config["jobs"], config["runs"], config["samples"]
    budget = config.get("budget_s")  # seconds of drains after which no more run
    logs = Path(tempfile.mkdtemp(prefix="dbworker_bench_peer_"))
    bench.setup()
    drains, latency = [], None
    try:
        for run in range(runs):
            spent = sum(d["wall_s"] for d in drains)
            if drains and budget is not None and spent + drains[-1]["wall_s"] > budget:
                break  # another drain would go past the budget
            started = time.perf_counter()
            bench.fill(jobs)
            enqueue_s = time.perf_counter() - started
            launched = time.perf_counter()
            processes = start(bench.workers(), logs / f"run{run}")
            try:
                drain = drained(bench, jobs, processes, logs, launched)
                drain["enqueue_s"] = round(enqueue_s, 3)
                drain["loadavg_1m"] = round(os.getloadavg()[0], 2)
                drain["check"] = bench.check(jobs)
                if run == 0 and samples:  # idle after a drain; whatever runs follow
                    latency = latencies(bench, samples, processes, logs)
            finally:
                stop(processes)
            drains.append(drain)
            print(f"  run {run + 1}: {jobs} in {drain['wall_s']:.2f}s "
                  f"({jobs / drain['wall_s']:.0f}/s, net {drain['net_per_s']}/s, "
                  f"load {drain['loadavg_1m']})", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(logs, ignore_errors=True)
    return {
        "versions": {"python": sys.version.split()[0], **bench.versions()},
        "tuning": bench.tuning(),
        "commands": [" ".join(Path(c).name if i == 0 else c for i, c in enumerate(command))
                     for command in bench.workers()],
        "runs": drains,
        "drain": figures(jobs, drains),
        "latency": latency,
    }


def start(commands: list[list[str]], logs: Path) -> list[subprocess.Popen[bytes]]:
    """Each worker command in a process group (session) of its own, output to a log file."""
    logs.mkdir(parents=True, exist_ok=True)
    processes = []
    for i, command in enumerate(commands):
        with open(logs / f"worker{i}.log", "wb") as log:
            processes.append(subprocess.Popen(command, cwd=HERE, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))
    return processes


def stop(processes: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM to each worker's process group; SIGKILL what is left after the grace."""
    for process in processes:
        _signal_group(process, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for process in processes:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(max(0.1, deadline - time.monotonic()))
        _signal_group(process, signal.SIGKILL)  # its children too, if any outlived it
        process.wait()


def _signal_group(process: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signum)  # the group of the process we started, nothing else


def alive(processes: list[subprocess.Popen[bytes]], logs: Path) -> None:
    for process in processes:
        if process.poll() is not None:
            tails = "\n".join(p.read_text(errors="replace")[-3000:]
                              for p in sorted(logs.glob("**/*.log")))
            raise RuntimeError(f"a worker exited with {process.returncode}:\n{tails}")


def drained(bench: Any, jobs: int, processes: list[subprocess.Popen[bytes]],
            logs: Path, started: float) -> dict[str, Any]:
    """Poll until nothing is left: the wall time from ``started`` (the workers' launch),
    and when the first job was done."""
    deadline = started + DRAIN_TIMEOUT_S
    first_s, first_left = None, jobs
    while True:
        now = time.perf_counter() - started
        if first_s is None:
            left = bench.remaining()
            if left < jobs:
                first_s, first_left = now, left
            if left == 0:
                break
            time.sleep(STARTUP_POLL_S)
        else:
            if not bench.pending():
                break
            time.sleep(DRAIN_POLL_S)
        if time.perf_counter() > deadline:
            raise RuntimeError(f"not drained within {DRAIN_TIMEOUT_S:g}s: "
                               f"{bench.remaining()} of {jobs} left")
        alive(processes, logs)
    wall = time.perf_counter() - started
    cpu = sessions_cpu({p.pid for p in processes})
    net_wall = wall - (first_s or 0.0)
    return {"wall_s": round(wall, 3), "cpu_s": round(cpu, 2),
            "first_done_s": round(first_s or wall, 3),
            "left_at_first_done": first_left,
            "net_per_s": round(first_left / net_wall) if first_left and net_wall > 0 else None}


def sessions_cpu(sessions: set[int]) -> float:
    """CPU seconds (user + system) so far of every process in these sessions (the workers
    and their children), with their finished children; start-up included. The database or
    Redis server's CPU is not in it."""
    ticks = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if int(fields[3]) in sessions:
            ticks += sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def figures(jobs: int, drains: list[dict[str, Any]]) -> dict[str, Any]:
    wall = statistics.median(d["wall_s"] for d in drains)
    nets = [d["net_per_s"] for d in drains if d["net_per_s"]]
    return {"jobs": jobs, "wall_s": [d["wall_s"] for d in drains],
            "per_s": round(jobs / wall),
            "net_per_s": round(statistics.median(nets)) if nets else None,
            "startup_s": round(statistics.median(d["first_done_s"] for d in drains), 3),
            "cpu_ms_per_job": round(1000 * statistics.median(d["cpu_s"] for d in drains)
                                    / jobs, 3),
            "enqueue_per_s": round(jobs / statistics.median(d["enqueue_s"] for d in drains))}


def latencies(bench: Any, samples: int, processes: list[subprocess.Popen[bytes]],
              logs: Path) -> dict[str, Any]:
    folder = logs / "stamps"
    folder.mkdir()
    one(bench, str(folder / "warm-up"), processes, logs, READY_TIMEOUT_S)
    found: dict[str, list[float]] = {"caller": [], "from_commit": []}
    poll = getattr(bench, "poll_s", 0.0)
    for i in range(samples):
        # Idle for a while, and at a random phase of the peer's polling, if it polls: a
        # job that comes at a random moment.
        time.sleep(random.uniform(0.02, 0.1) + random.uniform(0.0, poll))
        for point, seconds in one(bench, str(folder / str(i)), processes, logs, 30.0).items():
            found[point].append(seconds)
    return {**{point: figures_ms(seconds) for point, seconds in found.items()},
            "idle_poll_s": poll, "loadavg_1m": round(os.getloadavg()[0], 2)}


def figures_ms(seconds: list[float]) -> dict[str, Any]:
    ms = sorted(s * 1000 for s in seconds)

    def pct(p: float) -> float:
        return round(ms[min(len(ms) - 1, round(p / 100 * (len(ms) - 1)))], 2)

    return {"n": len(ms), "p50_ms": pct(50), "p90_ms": pct(90), "p99_ms": pct(99),
            "max_ms": round(ms[-1], 2), "mean_ms": round(statistics.fmean(ms), 2)}


def one(bench: Any, path: str, processes: list[subprocess.Popen[bytes]], logs: Path,
        timeout: float) -> dict[str, float]:
    """Enqueue one stamp job; seconds to the handler's start from just before the enqueue
    call (``caller``) and from its commit (``from_commit``: the enqueue call's return, or
    the moment ``stamp()`` returns, if it knows better)."""
    before = time.time()
    committed = bench.stamp(path) or time.time()  # a peer may know the commit better
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            alive(processes, logs)
            raise RuntimeError(f"a stamp job did not run within {timeout:g}s")
        time.sleep(0.0005)
    started = float(Path(path).read_text())
    return {"caller": started - before, "from_commit": started - committed}


if __name__ == "__main__":
    main()
