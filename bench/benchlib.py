"""What the benchmarks share: throwaway databases, Django set-up, bulk loading, reporting.

Each benchmark runs every database in a child process of its own (Django's settings are
per process): ``per_database()`` starts ``<script> --child <db> --out <file>`` and gathers
what the children wrote.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS = BENCH / "results"
DATABASES = ("postgres", "sqlite", "mariadb")
#: ``--db`` of the scripts: one database, ``all`` (the default) or ``both`` (PostgreSQL and
#: SQLite, what ``both`` meant before MariaDB came: kept for old command lines).
DB_CHOICES = (*DATABASES, "all", "both")
ROW_TABLE = "benchapp_row"  # benchapp.Row: the claim_cost workers' source, with "priority"
JOB_TABLE = "benchapp_job"  # benchapp.Job: the throughput worker's source
EXECUTION_TABLE = "django_dbworker_execution"


def chosen(db: str) -> tuple[str, ...]:
    """The databases a script's ``--db`` names."""
    if db == "all":
        return DATABASES
    if db == "both":
        return ("postgres", "sqlite")
    return (db,)


def pg_connect_kwargs() -> dict[str, Any]:
    return {
        "host": os.environ.get("PGHOST", "127.0.0.1"),
        "port": os.environ.get("PGPORT", "5432"),
        "user": os.environ.get("PGUSER", "postgres"),
    }


def mysql_connect_kwargs() -> dict[str, Any]:
    """MariaDB as the test suite reaches it: 127.0.0.1:3306, root, empty password."""
    return {
        "host": os.environ.get("MYSQL_HOST", "127.0.0.1"),
        "port": int(os.environ.get("MYSQL_PORT", "3306")),
        "user": os.environ.get("MYSQL_USER", "root"),
        "password": os.environ.get("MYSQL_PASSWORD", ""),
        "charset": "utf8mb4",
    }


def mysql_server(sql: str) -> Any:
    """Run one statement on the MariaDB server (no database selected); its first row."""
    import MySQLdb

    c = MySQLdb.connect(**mysql_connect_kwargs())
    try:
        cursor = c.cursor()
        cursor.execute(sql)
        return cursor.fetchone()
    finally:
        c.close()


@contextmanager
def scratch_database(db: str, tag: str = "") -> Iterator[str]:
    """A fresh, empty database for this process; yields its NAME; removes it afterwards.

    PostgreSQL and MariaDB: ``dbworker_bench_<pid>[_<tag>]``, created and dropped here
    (MariaDB: ``CHARACTER SET utf8mb4``). SQLite: a file in a temporary folder.
    """
    suffix = f"_{tag}" if tag else ""
    if db == "postgres":
        import psycopg

        name = f"dbworker_bench_{os.getpid()}{suffix}"
        with psycopg.connect(dbname="postgres", autocommit=True, **pg_connect_kwargs()) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}"')
            c.execute(f'CREATE DATABASE "{name}"')
        try:
            yield name
        finally:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(dbname="postgres", autocommit=True,
                                 **pg_connect_kwargs()) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    elif db == "mariadb":
        name = f"dbworker_bench_{os.getpid()}{suffix}"
        mysql_server(f"DROP DATABASE IF EXISTS `{name}`")
        mysql_server(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 "
                     "COLLATE utf8mb4_unicode_ci")
        try:
            yield name
        finally:
            if "django" in sys.modules:
                from django.db import connections

                connections.close_all()
            mysql_server(f"DROP DATABASE IF EXISTS `{name}`")
    else:
        folder = tempfile.mkdtemp(prefix="dbworker_bench_")
        try:
            yield str(Path(folder) / f"bench{suffix}.sqlite3")
        finally:
            shutil.rmtree(folder, ignore_errors=True)


def environment(db: str, name: str, large: str = "") -> dict[str, str]:
    """Environment for a process (ours or a ``runworkers``) using the bench settings.

    ``large``: a second database of the same kind, the alias ``large``.
    """
    path = [str(BENCH), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {
        **without_bytecode_ban(os.environ),
        "BENCH_DB": db,
        "BENCH_DB_NAME": name,
        "BENCH_DB_NAME_LARGE": large,
        "DJANGO_SETTINGS_MODULE": "bench_settings",
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }


def without_bytecode_ban(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` without PYTHONDONTWRITEBYTECODE (set on some machines, this one among them):
    with it, every process we start compiles django_dbworker from its source, 0.1-0.2 s of
    each start-up, where an installed package, as the peers' are, comes compiled. The
    processes then write ``__pycache__`` folders (ignored by git) and use them."""
    return {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}


def setup_django(db: str, name: str, large: str = "") -> None:
    """Point this process at the database(s), set Django up and migrate."""
    os.environ.update(environment(db, name, large))
    for folder in (str(ROOT), str(BENCH)):
        if folder not in sys.path:
            sys.path.insert(0, folder)
    import django
    from django.core.management import call_command

    django.setup()
    from django.conf import settings
    from django.db import connections

    for alias in settings.DATABASES:
        # Connect each database while it is django_dbworker's, so that it gets the same
        # connection set-up (SQLite: WAL, synchronous=NORMAL, busy timeout).
        use_database(alias)
        connections[alias].close()
        connections[alias].ensure_connection()
        call_command("migrate", database=alias, verbosity=0)
    use_database("default")


def use_database(alias: str) -> None:
    """Make ``alias`` django_dbworker's database (``DBWORKER["DATABASE"]``) from now on."""
    from django.conf import settings
    from django.core.signals import setting_changed

    if settings.DBWORKER.get("DATABASE") != alias:
        settings.DBWORKER["DATABASE"] = alias
        # What override_settings would announce: django_dbworker re-reads its settings.
        setting_changed.send(sender=type(settings), setting="DBWORKER",
                             value=settings.DBWORKER, enter=True)


def load_rows(size: int, using: str = "default", table: str = ROW_TABLE) -> None:
    """Empty our tables, then insert ``size`` source rows (ids 1..size) into ``table``, fast.

    PostgreSQL: one INSERT ... SELECT over generate_series. MariaDB: one INSERT ... SELECT
    from the sequence engine's ``seq_1_to_<size>``. SQLite: executemany in one
    transaction. Rows get a payload and (``benchapp_row``) a scattered ``priority``.
    """
    from django.db import connections, transaction

    connection = connections[using]
    priority = table == ROW_TABLE
    columns = "id, priority, payload" if priority else "id, payload"
    everything = ("django_dbworker_failure", EXECUTION_TABLE, ROW_TABLE, JOB_TABLE)
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {', '.join(everything)} RESTART IDENTITY CASCADE")
            values = "i, (i::bigint * 7919) %% 1000003" if priority else "i"
            cursor.execute(
                f"INSERT INTO {table} ({columns}) SELECT {values}, 'payload ' || i "
                "FROM generate_series(1, %s) i",
                [size],
            )
            return
        if connection.vendor == "mysql":
            cursor.execute("SET FOREIGN_KEY_CHECKS = 0")
            for name in everything:
                cursor.execute(f"TRUNCATE TABLE {name}")
            cursor.execute("SET FOREIGN_KEY_CHECKS = 1")
            values = "seq, MOD(seq * 7919, 1000003)" if priority else "seq"
            if size:
                cursor.execute(f"INSERT INTO {table} ({columns}) SELECT {values}, "
                               f"CONCAT('payload ', seq) FROM seq_1_to_{int(size)}")
            return
        with transaction.atomic(using=using):
            for name in everything:
                cursor.execute(f"DELETE FROM {name}")
            connection.connection.executemany(
                f"INSERT INTO {table} ({columns}) VALUES ({'?, ?, ?' if priority else '?, ?'})",
                (((i, (i * 7919) % 1000003, f"payload {i}") if priority else (i, f"payload {i}"))
                 for i in range(1, size + 1)),
            )


def load_tasks(task_path: str, size: int, using: str = "default") -> None:
    """Empty the task table, then enqueue ``size`` calls of ``task_path`` (no arguments)
    with ``enqueue_many``, as an application would."""
    from django.db import connections
    from django.utils.module_loading import import_string

    from django_dbworker.models import TaskRecord

    connection = connections[using]
    with connection.cursor() as cursor:
        table = TaskRecord._meta.db_table
        if connection.vendor == "postgresql":
            cursor.execute(f"TRUNCATE {table}")
        elif connection.vendor == "mysql":
            cursor.execute(f"TRUNCATE TABLE {table}")
        else:
            cursor.execute(f"DELETE FROM {table}")
    if size:
        import_string(task_path).enqueue_many([((), {})] * size)


def load_executions(worker: str, size: int, pending: int, using: str = "default",
                    table: str = ROW_TABLE) -> None:
    """Give every row of ``table`` an execution of ``worker``: the newest ``pending``
    PENDING, the rest FINISHED (the history), as the pending set and the runner would have
    left them.

    Columns not named here get their model default, so new fields do not break loading.
    """
    from django.db import connections
    from django.utils import timezone

    connection = connections[using]
    now = timezone.now()
    finished = {"state": "FINISHED", "attempts": 1, "started_at": now, "finished_at": now}
    waiting = {"state": "PENDING", "attempts": 0}
    for values, where in ((finished, "id <= %s"), (waiting, "id > %s")):
        values = {"available_at": now, "created_at": now, "worker": worker, **values}
        columns, expressions, params = execution_select(connection, values)
        with connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {EXECUTION_TABLE} ({', '.join(columns)}) "
                f"SELECT {', '.join(expressions)} FROM {table} WHERE {where}",
                [*params, size - pending],
            )


def execution_select(connection: Any,
                     values: dict[str, Any]) -> tuple[list[str], list[str], list[Any]]:
    """The columns, SELECT expressions and parameters of an ``INSERT INTO <executions> (...)
    SELECT ... FROM <source table>`` that gives each source row an execution: its key from
    the row's ``id``, the columns in ``values`` as given, every other its model default."""
    from django_dbworker.models import Execution

    columns, expressions, params = [], [], []
    for field in Execution._meta.concrete_fields:
        if field.primary_key:
            continue
        columns.append(connection.ops.quote_name(field.column))
        if field.name == "source_id":
            expressions.append("CAST(id AS CHAR)" if connection.vendor == "mysql"
                               else "CAST(id AS varchar(255))")
        elif field.name == "sort_key":
            expressions.append("id")
        else:
            expressions.append("%s")
            params.append(field.get_db_prep_save(values.get(field.name, field.get_default()),
                                                 connection))
    return columns, expressions, params


def analyze(using: str = "default", source: str = ROW_TABLE) -> None:
    """Fresh planner statistics (PostgreSQL: VACUUM ANALYZE, as autovacuum would; MariaDB:
    ANALYZE TABLE, as InnoDB's persistent statistics would after enough changes)."""
    from django.db import connections

    connection = connections[using]
    with connection.cursor() as cursor:
        for table in (source, EXECUTION_TABLE):
            if connection.vendor == "postgresql":
                cursor.execute(f"VACUUM (ANALYZE) {table}")
            elif connection.vendor == "mysql":
                cursor.execute(f"ANALYZE TABLE {table}")
                cursor.fetchall()
            else:
                cursor.execute(f"ANALYZE {table}")


def cpu_ticks() -> tuple[int, int] | None:
    """(all CPU time, stolen CPU time) of the machine so far, in ticks (``/proc/stat``);
    None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    steal = fields[7] if len(fields) > 7 else 0
    return sum(fields[:8]), steal


def steal_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the CPU time between two ``cpu_ticks()`` that the hypervisor gave to
    other machines ("steal"): on a virtual machine it slows every figure down, and more
    than a few percent makes a run's figures unreliable."""
    if before is None or after is None or after[0] <= before[0]:
        return None
    return round(100 * (after[1] - before[1]) / (after[0] - before[0]), 1)


class ServerCPU:
    """CPU seconds the database server spent for one database, from ``/proc``.

    PostgreSQL (``db="postgres"``, the default): the backends serving ``database``, below.
    MariaDB (``db="mariadb"``): the ``mariadbd`` process's CPU time (all its threads). One
    process serves every connection, so the figure includes everything the server did
    meanwhile: other databases' sessions (other work on the same server), InnoDB's
    background threads (purge, page flushing, the log writer). It is an upper bound of
    what the run cost the server, not the run's own share.

    PostgreSQL:

    A thread looks at the machine's processes every ``interval`` seconds and notes the CPU
    time (user + system) of each backend serving ``database`` (its process title names the
    database: ``postgres: 15/main: postgres <database> 127.0.0.1(...) ...``). A backend's
    last few milliseconds before it exits are missed (at most ``interval`` each, when they
    are idle anyway); the server's shared processes (WAL writer, checkpointer) are not
    counted. Needs to read the server's processes: run as root or as the server's user, on
    the server's machine; ``seconds()`` is None otherwise. Other databases' backends (other
    work on the same server) are not counted.

    Use as ``with ServerCPU(name) as cpu: ...`` then ``cpu.seconds()``.
    """

    def __init__(self, database: str, interval: float = 0.01, db: str = "postgres") -> None:
        self.marker = f" {database} ".encode()
        self.db = db
        self.interval = interval
        self.ticks: dict[int, int] = {}
        self.before: dict[int, int] = {}
        self.readable = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> ServerCPU:
        self.before = dict(self._sample())
        self.ticks = dict(self.before)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.ticks.update(self._sample())

    def seconds(self) -> float | None:
        if not self.readable or (self.db == "mariadb" and not self.ticks):
            return None
        used = sum(t - self.before.get(pid, 0) for pid, t in self.ticks.items())
        return used / os.sysconf("SC_CLK_TCK")

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            self.ticks.update(self._sample())

    def _sample(self) -> Iterator[tuple[int, int]]:
        try:
            entries = os.listdir("/proc")
        except OSError:
            self.readable = False
            return
        for entry in entries:
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    title = f.read()
                if self.db == "mariadb":
                    program = title.split(b"\0", 1)[0].rsplit(b"/", 1)[-1]
                    if program not in (b"mariadbd", b"mysqld"):
                        continue
                elif not title.startswith(b"postgres: ") or self.marker not in title:
                    continue
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            yield int(entry), int(fields[11]) + int(fields[12])  # utime, stime


def machine() -> dict[str, Any]:
    import django
    import psycopg

    info: dict[str, Any] = {
        "cpu_count": os.cpu_count(),
        "cpu_model": _cpu_model(),
        "memory_gb": _memory_gb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "django": django.get_version(),
        "psycopg": psycopg.__version__,
        "sqlite": sqlite3.sqlite_version,
        "postgres": None,
        "mysqlclient": None,
        "mariadb": None,
    }
    try:
        with psycopg.connect(dbname="postgres", connect_timeout=5, **pg_connect_kwargs()) as c:
            info["postgres"] = c.execute("SHOW server_version").fetchone()[0]
    except psycopg.OperationalError:
        pass
    try:
        import MySQLdb

        info["mysqlclient"] = ".".join(str(v) for v in MySQLdb.version_info[:3])
        info["mariadb"] = mysql_server("SELECT VERSION()")[0]
    except Exception:  # no driver or no server: the figures say which
        pass
    return info


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _memory_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def summary(samples_ns: Sequence[int]) -> dict[str, float]:
    """Median, 10th and 90th percentile of a sample, in microseconds."""
    deciles = statistics.quantiles(samples_ns, n=10)
    return {
        "median": round(statistics.median(samples_ns) / 1000, 1),
        "p10": round(deciles[0] / 1000, 1),
        "p90": round(deciles[-1] / 1000, 1),
        "n": len(samples_ns),
    }


def per_database(script: Path, dbs: Sequence[str], args: Sequence[str]) -> dict[str, Any]:
    """Run ``script --child <db>`` for each database; return {db: what the child wrote}."""
    found: dict[str, Any] = {}
    for db in dbs:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, str(script), "--child", db, "--out", out.name, *args]
            print(f"--- {db}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True, cwd=ROOT)
            found[db] = json.loads(Path(out.name).read_text())
    return found


def per_size(script: Path | str, sizes: Sequence[int], args: Sequence[str]) -> list[Any]:
    """Run ``script --child-size <size> --out <file> *args`` for each size, each in a fresh
    process (and so a fresh database); return what each child wrote, in order."""
    found: list[Any] = []
    for size in sizes:
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            command = [sys.executable, str(script), "--child-size", str(size),
                       "--out", out.name, *args]
            subprocess.run(command, check=True, cwd=ROOT)
            found.append(json.loads(Path(out.name).read_text()))
    return found


def write_results(name: str, data: dict[str, Any]) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / name
    data = {"created_at": datetime.now(UTC).isoformat(timespec="seconds"), **data}
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)
