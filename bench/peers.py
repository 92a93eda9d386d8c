"""The tools users would pick instead, measured the same way in the same run.

    .venv/bin/python bench/peers.py [--peers celery,procrastinate,tasksdb,djangoq2,huey]
                                    [--jobs 5000] [--runs 2] [--budget S] [--samples 50]
                                    [--quick]

For each peer, in a virtualenv of its own (``bench/.peers/<peer>``, made with this
interpreter's base Python and the pinned ``REQUIREMENTS`` of ``bench/peers/peer_<peer>.py``,
installed from PyPI; made again only when missing or when the pins or the Python change):
``bench/peers/driver.py`` runs with that virtualenv's Python, enqueues ``--jobs`` no-op jobs,
starts the peer's own workers (two processes, or one with concurrency 2), times the drain
(``per_s``; ``net_per_s`` without the workers' start-up), ``--runs`` times (median; with
``--budget``, no more once another drain would take its drains past that many seconds),
and, with the workers idle after the first drain, ``--samples`` times the latency to a
job's handler start from just before its enqueue call (``caller``: what its caller waits,
as ``bench/latency.py`` times ours) and from the enqueue's commit (``from_commit``).
PostgreSQL peers get a database ``dbworker_bench_<pid>_<peer>``, dropped at the end; Celery
gets a Redis database number of its own (``--redis-db``), emptied with FLUSHDB; Huey a
SQLite file in a temporary folder. A peer that cannot be installed or run is recorded with
the reason; the others still run.

Writes bench/results/peers.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import benchlib

PEERS = ("celery", "procrastinate", "tasksdb", "djangoq2", "huey")
CODE = benchlib.BENCH / "peers"
VENVS = benchlib.BENCH / ".peers"
REFERENCE = "celery"  # the ratio column of the table: per_s / Celery's per_s
PIP_TIMEOUT_S = 900
RUN_TIMEOUT_S = 900


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"comma-separated, among: {', '.join(PEERS)}")
    parser.add_argument("--jobs", type=int, default=5_000)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=50)
    parser.add_argument("--budget", type=float, default=None,
                        help="seconds of drains per peer after which it is drained no "
                             "more (at least once): the quick ones get all --runs")
    parser.add_argument("--redis-db", type=int, default=13,
                        help="the Redis database number Celery may empty (FLUSHDB)")
    parser.add_argument("--quick", action="store_true",
                        help="1 run of 1,000 jobs, 10 samples: a smoke test, not figures")
    args = parser.parse_args()
    names = [n for n in args.peers.split(",") if n]
    if set(names) - set(PEERS):
        parser.error(f"--peers: choose among {', '.join(PEERS)}")
    if args.quick:
        args.jobs, args.runs, args.samples = min(args.jobs, 1_000), 1, min(args.samples, 10)
    loads = {"start": [round(x, 2) for x in os.getloadavg()]}
    started = time.monotonic()
    results = []
    for name in names:
        print(f"--- {name}", file=sys.stderr, flush=True)
        results.append(run_peer(name, args))
    loads["end"] = [round(x, 2) for x in os.getloadavg()]
    path = benchlib.write_results("peers.json", {
        "benchmark": "peers",
        "machine": benchlib.machine(),
        "loadavg_1m_5m_15m": loads,
        "seconds": round(time.monotonic() - started, 1),
        "config": {"jobs": args.jobs, "runs": args.runs, "budget_s": args.budget,
                   "samples": args.samples,
                   "quick": args.quick, "redis_db": args.redis_db,
                   "job": "a no-op (returns None); stamp: writes time.time() to a file",
                   "per_s": "jobs / (workers launched -> nothing left), median of runs",
                   "net_per_s": "jobs left at the first sign of progress / (last done - "
                                "that moment): without the workers' start-up",
                   "cpu_ms_per_job": "CPU of the worker processes and their children, "
                                     "launch to drained, per job (start-up included; not "
                                     "the database's or Redis's)",
                   "latency": "caller: handler start - just before the enqueue call; "
                              "from_commit: handler start - enqueue returned (committed; "
                              "Celery: published); workers idle, a random 20-100 ms (+ a "
                              "random part of the peer's idle polling period) after the "
                              "previous job"},
        "results": results,
        "table": report(results),
    })
    print(report(results))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


def run_peer(name: str, args: argparse.Namespace) -> dict[str, Any]:
    meta = peer_meta(name)
    result: dict[str, Any] = {"peer": name, "label": meta["LABEL"], "shape": meta["SHAPE"],
                              "needs": meta["NEEDS"], "requirements": meta["REQUIREMENTS"]}
    try:
        result["venv"] = ensure_venv(name, meta["REQUIREMENTS"])
        with resources(name, meta["NEEDS"], args.redis_db) as env:
            result.update(run_driver(name, args, env))
        result["status"] = "ok"
    except PeerUnavailable as e:
        result.update(status="failed", error=str(e))
        print(f"{name}: failed: {e}", file=sys.stderr, flush=True)
    return result


class PeerUnavailable(Exception):
    """This peer could not be installed or run here; the reason is the message."""

    def __str__(self) -> str:
        return " / ".join(line.strip() for line in super().__str__().splitlines()
                          if line.strip())[:1000]


def peer_meta(name: str) -> dict[str, Any]:
    """LABEL, SHAPE, NEEDS and REQUIREMENTS of peer_<name>.py, read without importing it
    (it imports the peer's packages, which live in the peer's virtualenv only)."""
    tree = ast.parse((CODE / f"peer_{name}.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id in ("LABEL", "SHAPE", "NEEDS",
                                                              "REQUIREMENTS"):
                found[target.id] = ast.literal_eval(node.value)
    return found


# ----- virtualenvs -----------------------------------------------------------------------------


def ensure_venv(name: str, requirements: list[str]) -> dict[str, Any]:
    """bench/.peers/<name> with ``requirements``; made (again) only when missing, or when the
    pins or this Python changed (a hash of both is kept in the virtualenv)."""
    folder = VENVS / name
    python = folder / "bin" / "python"
    stamp = folder / ".bench-installed"
    wanted = hashlib.sha256("\n".join([*requirements, sys.version, base_python()])
                            .encode()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
        return {"path": shown(folder), "installed_now": False}
    print(f"{name}: installing {' '.join(requirements)} into "
          f"{shown(folder)} ...", file=sys.stderr, flush=True)
    begun = time.monotonic()
    shutil.rmtree(folder, ignore_errors=True)
    VENVS.mkdir(exist_ok=True)
    made = subprocess.run([sys.executable, "-m", "venv", str(folder)], capture_output=True,
                          text=True)
    if made.returncode:
        raise PeerUnavailable(f"python -m venv failed: {made.stderr.strip()[-500:]}")
    (folder / "requirements.txt").write_text("\n".join(requirements) + "\n")
    log = folder / "pip-install.log"
    try:
        with open(log, "w") as out:
            pip = subprocess.run([str(python), "-m", "pip", "install",
                                  "--disable-pip-version-check", "-r",
                                  str(folder / "requirements.txt")],
                                 stdout=out, stderr=subprocess.STDOUT,
                                 timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise PeerUnavailable(f"pip install took over {PIP_TIMEOUT_S}s (log: {log})") from e
    if pip.returncode:
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        raise PeerUnavailable(f"pip install failed: {' / '.join(tail)} (log: {log})")
    stamp.write_text(wanted + "\n")
    seconds = round(time.monotonic() - begun, 1)
    print(f"{name}: installed in {seconds}s", file=sys.stderr, flush=True)
    return {"path": shown(folder), "installed_now": True,
            "install_s": seconds}


def shown(path: Path) -> str:
    return str(path.relative_to(benchlib.ROOT) if path.is_relative_to(benchlib.ROOT) else path)


def base_python() -> str:
    """The interpreter our virtualenv was made from: the peers' virtualenvs get it too."""
    return str(getattr(sys, "_base_executable", sys.executable))


# ----- what a peer needs: a database, a Redis database number, a SQLite file -------------------


@contextmanager
def resources(name: str, needs: str, redis_db: int) -> Iterator[dict[str, str]]:
    """Environment variables for the driver and the peer's workers, pointing at what they
    need; removed afterwards (the Redis database is emptied by the peer itself)."""
    pg = benchlib.pg_connect_kwargs()
    env = {"PEER_PG_HOST": pg["host"], "PEER_PG_PORT": str(pg["port"]),
           "PEER_PG_USER": pg["user"]}
    if needs == "redis":
        yield {**env, "PEER_REDIS_URL": f"redis://127.0.0.1:6379/{redis_db}"}
    elif needs == "sqlite":
        folder = tempfile.mkdtemp(prefix="dbworker_bench_peer_")
        try:
            yield {**env, "PEER_SQLITE": str(Path(folder) / f"{name}.sqlite3")}
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    else:
        import psycopg

        database = f"dbworker_bench_{os.getpid()}_{name}"
        try:
            with psycopg.connect(dbname="postgres", autocommit=True, connect_timeout=5,
                                 **pg) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{database}"')
                c.execute(f'CREATE DATABASE "{database}"')
        except psycopg.Error as e:
            raise PeerUnavailable(f"PostgreSQL: {e}") from e
        try:
            yield {**env, "PEER_PG_NAME": database}
        finally:
            with psycopg.connect(dbname="postgres", autocommit=True, **pg) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')


def run_driver(name: str, args: argparse.Namespace, extra: dict[str, str]) -> dict[str, Any]:
    """driver.py in the peer's virtualenv; what it wrote (or PeerUnavailable)."""
    python = VENVS / name / "bin" / "python"
    env = {k: v for k, v in benchlib.without_bytecode_ban(os.environ).items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE", "PYTHONHOME")}
    env.update(extra, PYTHONPATH=str(CODE), VIRTUAL_ENV=str(VENVS / name),
               PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
    config = {"jobs": args.jobs, "runs": args.runs, "samples": args.samples,
              "budget_s": args.budget}
    with tempfile.TemporaryDirectory(prefix="dbworker_bench_peer_") as folder:
        config_file, out = Path(folder) / "config.json", Path(folder) / "out.json"
        config_file.write_text(json.dumps(config))
        command = [str(python), str(CODE / "driver.py"), "--peer", name,
                   "--config", str(config_file), "--out", str(out)]
        try:
            done = subprocess.run(command, env=env, cwd=CODE, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True,
                                  timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise PeerUnavailable(f"did not finish within {RUN_TIMEOUT_S}s") from e
        sys.stderr.write(done.stdout)
        found = json.loads(out.read_text()) if out.exists() else {}
        if done.returncode or "error" in found or not found:
            lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
            reason = found.get("error") or " / ".join(lines[-3:]) or f"exit {done.returncode}"
            raise PeerUnavailable(reason)
        return found


# ----- report ----------------------------------------------------------------------------------


def report(results: list[dict[str, Any]]) -> str:
    reference = next((r for r in results if r["peer"] == REFERENCE and r["status"] == "ok"),
                     None)
    headers = ["peer", "versions", "workers", "runs: wall s", "jobs/s (median)",
               "net jobs/s", f"vs {reference['label'] if reference else REFERENCE}",
               "CPU ms/job (workers)", "idle latency from the caller p50 / p99 ms",
               "from the commit p50 / p99 ms"]
    rows = []
    for r in results:
        if r["status"] != "ok":
            rows.append([r["label"], " ".join(r["requirements"]), "", "", "failed", "", "",
                         "", r["error"][:200].replace("|", "/"), ""])
            continue
        d, lat = r["drain"], r["latency"]
        versions = ", ".join(f"{k} {v}" for k, v in r["versions"].items())
        ratio = f"{d['per_s'] / reference['drain']['per_s']:.2f}x" if reference else ""
        rows.append([r["label"], versions, "<br>".join(r["commands"]),
                     ", ".join(f"{w:.2f}" for w in d["wall_s"]), f"{d['per_s']:,}",
                     f"{d['net_per_s']:,}" if d["net_per_s"] else "", ratio,
                     d["cpu_ms_per_job"], *latency_cells(lat)])
    return benchlib.markdown_table(headers, rows)


def latency_cells(lat: dict[str, Any] | None) -> list[str]:
    """p50 / p99 from the caller's side and from the commit (results before issue 24 have
    only the latter, at the top level)."""
    if not lat:
        return ["", ""]
    caller, commit = lat.get("caller"), lat.get("from_commit", lat)
    return [f"{caller['p50_ms']} / {caller['p99_ms']}" if caller else "",
            f"{commit['p50_ms']} / {commit['p99_ms']}"]


if __name__ == "__main__":
    main()
