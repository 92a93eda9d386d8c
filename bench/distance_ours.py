"""Our systems for bench/distance.py, in the shape bench/peers/distance_driver.py drives.

``config["kind"]``:

- ``rows``: ``Feed.objects.bulk_create()`` of the jobs (as a user loads rows), drained by
  ``runworkers --concurrency 2 --worker feed --worker ping`` (``feed`` is declared with
  ``concurrency=2``); latency: ``Ping.objects.create()`` -> the ``ping`` handler's first
  line (it stores ``time.time()``);
- ``tasks``: ``noop.enqueue_many()`` of the jobs, drained by ``runworkers --concurrency 2
  --queue default``; latency: ``stamp.enqueue()`` -> the task's first line (its return
  value);
- ``raw``: bench/rawsql.py, two processes of one row per transaction (no idle loop: no
  latency).

Django reaches PostgreSQL through the caller's link (``PGPORT``, read when Django is set
up); the workers get the workers' link (``worker_env``). Progress is read straight from the
server by the probe user (``probe()``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
WORKER_COMMAND = [sys.executable, "-m", "django", "runworkers", "--concurrency=2",
                  "--verbosity=0"]


class Bench:
    def __init__(self, config: dict[str, Any]) -> None:
        self.kind = config["kind"]
        self.name = config["pg_name"]
        self.exits = self.kind == "raw"
        self.probe_db: Any = None
        self.last: int | str | None = None
        if self.kind != "raw":
            import django

            django.setup()

    def setup(self) -> None:
        """The database is a copy of a migrated template: nothing to do."""

    def probe(self, server: dict[str, Any]) -> None:
        import psycopg

        self.probe_db = psycopg.connect(f"{server['pg_dsn']} dbname={self.name}",
                                        autocommit=True)

    def fill(self, jobs: int) -> None:
        if self.kind == "rows":
            from benchapp.models import Feed

            Feed.objects.bulk_create([Feed(payload=f"payload {i}") for i in range(jobs)])
        elif self.kind == "tasks":
            from benchapp.tasks import noop

            noop.enqueue_many([((), {})] * jobs)
        else:
            import rawsql

            rawsql.load("postgres", self.name, jobs)
        if self.kind != "raw":
            from django.db import connections

            connections.close_all()  # as an application between requests: reconnects

    def workers(self) -> list[list[str]]:
        if self.kind == "rows":
            return [[*WORKER_COMMAND, "--worker=feed", "--worker=ping"]]
        if self.kind == "tasks":
            return [[*WORKER_COMMAND, "--queue=default"]]
        command = [sys.executable, str(BENCH / "rawsql.py"), "--db=postgres",
                   f"--name={self.name}", "--work"]
        return [command, command]

    def remaining(self) -> int:
        return self.probe_db.execute(self._left()).fetchone()[0]

    def pending(self) -> bool:
        return self.remaining() > 0

    def _left(self) -> str:
        if self.kind == "rows":
            return ("SELECT (SELECT count(*) FROM benchapp_feed) - (SELECT count(*) FROM "
                    "django_dbworker_execution WHERE worker = 'feed' "
                    "AND state = 'FINISHED')")
        if self.kind == "tasks":
            from django_dbworker.models import TaskRecord

            return (f"SELECT count(*) FROM {TaskRecord._meta.db_table} "
                    "WHERE status <> 'SUCCESSFUL'")
        return "SELECT count(*) FROM bench_raw_job WHERE state = 'ready'"

    def stamp(self, path: str) -> None:
        if self.kind == "rows":
            from benchapp.models import Ping

            self.last = Ping.objects.create().pk
        else:
            from benchapp.tasks import stamp

            self.last = str(stamp.enqueue().id)

    def started(self, path: str) -> float | None:
        if self.kind == "rows":
            row = self.probe_db.execute("SELECT started FROM benchapp_ping WHERE id = %s",
                                        [self.last]).fetchone()
        else:
            from django_dbworker.models import TaskRecord

            row = self.probe_db.execute(
                f"SELECT return_value FROM {TaskRecord._meta.db_table} WHERE id = %s "
                "AND status = 'SUCCESSFUL'", [self.last]).fetchone()
        return float(row[0]) if row and row[0] is not None else None

    def check(self, jobs: int) -> dict[str, Any]:
        return {"left": self.remaining()}

    def tuning(self) -> dict[str, Any]:
        return {}

    def versions(self) -> dict[str, Any]:
        return {}

    def teardown(self) -> None:
        if self.kind != "raw":
            from django.db import connections

            connections.close_all()
        if self.probe_db is not None:
            self.probe_db.close()

