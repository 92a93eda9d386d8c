"""Huey on SQLite: ``huey_consumer -w 2 -k process``.

Runs in bench/.peers/huey (driver.py imports it; so does the consumer, as its app). The
database is the file ``PEER_SQLITE`` (a temporary folder of bench/peers.py). Left: the
tasks in Huey's queue table (a task leaves it when a worker takes it).
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

import driver
from huey import SqliteHuey

LABEL = "Huey/SQLite"
SHAPE = "consumer, 2 worker processes"
NEEDS = "sqlite"
REQUIREMENTS = ["huey==3.5.4"]
# Process workers: two CPUs, and Python code per task (the GIL would serialize threads).
# An idle worker polls with a growing delay: from 0.1 s (-d, the default) up to -m; the
# default -m, 10 s, makes idle latency seconds long: 1 s here, like our SQLite polling.
KIND = os.environ.get("PEER_HUEY_KIND", "process")
MAX_DELAY = "1.0"

huey = SqliteHuey("bench", filename=os.environ.get("PEER_SQLITE", "/tmp/huey.sqlite3"))


@huey.task()
def noop() -> None:
    pass


@huey.task()
def stamp(path: str) -> None:
    driver.write_stamp(path)


class Bench:
    poll_s = float(MAX_DELAY)  # idle polling: up to --max-delay

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def setup(self) -> None:
        huey.flush()

    def tuning(self) -> dict[str, Any]:
        return {"workers": 2, "worker_type": KIND, "max_delay_s": float(MAX_DELAY),
                "storage": "SqliteHuey defaults (WAL)"}

    def versions(self) -> dict[str, Any]:
        import sqlite3

        return {"huey": metadata.version("huey"), "sqlite": sqlite3.sqlite_version}

    def fill(self, jobs: int) -> None:
        huey.flush()
        for _ in range(jobs):
            noop()

    def workers(self) -> list[list[str]]:
        return [[str(driver.BIN / "huey_consumer"), "peer_huey.huey", "--workers=2",
                 f"--worker-type={KIND}", f"--max-delay={MAX_DELAY}", "--quiet"]]

    def remaining(self) -> int:
        return huey.pending_count()

    def pending(self) -> bool:
        return huey.pending_count() > 0

    def stamp(self, path: str) -> None:
        stamp(path)

    def check(self, jobs: int) -> dict[str, Any]:
        return {"left": huey.pending_count()}

    def teardown(self) -> None:
        huey.storage.close()
