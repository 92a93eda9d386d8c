"""procrastinate on PostgreSQL: ``procrastinate worker`` (LISTEN/NOTIFY on).

Runs in bench/.peers/procrastinate (driver.py imports it; so does the worker, as its app).
The database is ``PEER_PG_NAME`` (created and dropped by bench/peers.py); the schema is
applied here. procrastinate is asyncio-first: the jobs are ``async def`` (a sync job would
run in a thread). Left: jobs in ``todo`` or ``doing``.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

import driver
import psycopg
from procrastinate import App, PsycopgConnector

LABEL = "procrastinate"
SHAPE = "2 worker processes"
NEEDS = "postgres"
REQUIREMENTS = ["procrastinate==3.10.0", "psycopg[binary,pool]==3.3.9"]
# Two worker processes with one job at a time each, or one process with --concurrency 2:
# on 2 CPUs the two processes drain faster (one asyncio loop is one CPU at most).
PROCESSES = int(os.environ.get("PEER_PROCRASTINATE_PROCESSES", "2"))
LEFT = "FROM procrastinate_jobs WHERE status IN ('todo', 'doing')"


def conninfo() -> str:
    return (f"host={os.environ.get('PEER_PG_HOST', '127.0.0.1')} "
            f"port={os.environ.get('PEER_PG_PORT', '5432')} "
            f"user={os.environ.get('PEER_PG_USER', 'postgres')} "
            f"dbname={os.environ.get('PEER_PG_NAME', 'postgres')}")


app = App(connector=PsycopgConnector(conninfo=conninfo()))


@app.task(name="noop")
async def noop() -> None:
    pass


@app.task(name="stamp")
async def stamp(path: str) -> None:
    driver.write_stamp(path)


class Bench:
    def __init__(self, config: dict[str, Any]) -> None:
        self.db = psycopg.connect(conninfo(), autocommit=True)

    def setup(self) -> None:
        app.open()
        app.schema_manager.apply_schema()

    def tuning(self) -> dict[str, Any]:
        concurrency = 2 // PROCESSES
        return {"processes": PROCESSES, "concurrency": concurrency,
                "jobs": "async def (procrastinate runs sync jobs in threads)",
                "listen_notify": True, "enqueue": "task.batch_defer() (one statement)"}

    def versions(self) -> dict[str, Any]:
        return {p: metadata.version(p) for p in ("procrastinate", "psycopg")}

    def fill(self, jobs: int) -> None:
        self.db.execute("TRUNCATE procrastinate_jobs CASCADE")
        noop.batch_defer(*([{}] * jobs))

    def workers(self) -> list[list[str]]:
        command = [str(driver.BIN / "procrastinate"), "--app=peer_procrastinate.app",
                   "--log-level=warning", "worker", f"--concurrency={2 // PROCESSES}"]
        return [command] * PROCESSES

    def remaining(self) -> int:
        return self.db.execute(f"SELECT count(*) {LEFT}").fetchone()[0]

    def pending(self) -> bool:
        return self.db.execute(f"SELECT EXISTS (SELECT 1 {LEFT})").fetchone()[0]

    def stamp(self, path: str) -> None:
        stamp.defer(path=path)

    def check(self, jobs: int) -> dict[str, Any]:
        found = self.db.execute("SELECT status::text, count(*) FROM procrastinate_jobs "
                                "WHERE task_name = 'noop' GROUP BY 1").fetchall()
        return dict(found)

    def teardown(self) -> None:
        app.close()
        self.db.close()
