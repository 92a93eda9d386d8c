"""What one hop costs on this machine when the processes on both ends were idle: the
calibration behind the idle latencies of ``latency.py`` and ``peers.py`` (issue 24).

    .venv/bin/python bench/idle_hop.py [--samples 100] [--gap 0.02-0.1] [--redis-port N]

An idle job's latency is mostly process wake-ups: each hand-over (a query to the database
server, its answer, a NOTIFY to a listening backend and on to the supervisor, a claim, a
pipe to a child) wakes a process that slept, and on a virtual machine a sleeping vCPU takes
far longer to wake than a busy one. Three round trips are timed, each ``--samples`` times
back to back ("hot") and ``--samples`` times after an idle gap of ``--gap`` seconds (the
gap ``latency.py`` and the peers' latency runs leave between jobs):

- ``postgres``: ``SELECT 1`` on a psycopg connection (autocommit) to the shared server;
- ``redis``: ``PING`` on a plain socket (RESP), to the Redis at 127.0.0.1:``--redis-port``
  (skipped when none answers);
- ``pipe``: a byte to a child process over a ``multiprocessing`` pipe and back (what the
  supervisor's hand-off to a child, and Celery's to its pool process, cost).

Writes bench/results/idle_hop.json and prints a Markdown table (median and p90, ms).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import benchlib


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=100)
    parser.add_argument("--gap", default="0.02-0.1", help="idle seconds before each: LO-HI")
    parser.add_argument("--redis-port", type=int, default=6379)
    args = parser.parse_args()
    low, high = (float(x) for x in args.gap.split("-"))
    results: dict[str, Any] = {}
    for name, opened in (("postgres", postgres), ("redis", lambda: redis(args.redis_port)),
                         ("pipe", pipe)):
        try:
            trip, close = opened()
        except OSError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        try:
            for _ in range(20):  # warm-up
                trip()
            hot = [timed(trip) for _ in range(args.samples)]
            idle = []
            for _ in range(args.samples):
                time.sleep(random.uniform(low, high))
                idle.append(timed(trip))
        finally:
            close()
        results[name] = {"hot": summary(hot), "after_idle_gap": summary(idle)}
    data = {"benchmark": "idle_hop", "machine": benchlib.machine(),
            "config": {"samples": args.samples, "gap_s": [low, high]},
            "loadavg_1m": round(os.getloadavg()[0], 2), "results": results}
    path = benchlib.write_results("idle_hop.json", data)
    print("| round trip | hot p50 / p90 ms | after an idle gap p50 / p90 ms |")
    print("| --- | --- | --- |")
    for name, r in results.items():
        print(f"| {name} | {r['hot']['p50_ms']} / {r['hot']['p90_ms']} | "
              f"{r['after_idle_gap']['p50_ms']} / {r['after_idle_gap']['p90_ms']} |")
    print(f"\nwritten to {path}")


def timed(trip: Callable[[], object]) -> float:
    started = time.perf_counter()
    trip()
    return (time.perf_counter() - started) * 1000


def summary(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)
    return {"p50_ms": round(statistics.median(ordered), 3),
            "p90_ms": round(ordered[int(0.9 * (len(ordered) - 1))], 3)}


def postgres() -> tuple[Callable[[], object], Callable[[], None]]:
    import psycopg

    conn = psycopg.connect(dbname="postgres", autocommit=True, **benchlib.pg_connect_kwargs())
    return (lambda: conn.execute("SELECT 1").fetchone()), conn.close


def redis(port: int) -> tuple[Callable[[], object], Callable[[], None]]:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def ping() -> bytes:
        sock.sendall(b"PING\r\n")
        answer = sock.recv(64)
        if not answer.startswith(b"+PONG"):
            raise OSError(f"Redis answered {answer!r}")
        return answer

    ping()
    return ping, sock.close


def _echo(conn: Any) -> None:
    while True:
        message = conn.recv_bytes()
        if not message:
            return
        conn.send_bytes(message)


def pipe() -> tuple[Callable[[], object], Callable[[], None]]:
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.get_context("fork").Process(target=_echo, args=(theirs,),
                                                        daemon=True)
    child.start()

    def trip() -> bytes:
        ours.send_bytes(b"x")
        return ours.recv_bytes()

    def close() -> None:
        ours.send_bytes(b"")
        child.join(5)

    return trip, close


if __name__ == "__main__":
    main()
