"""How long throughput takes to come back after a PostgreSQL restart and after a
``runworkers`` host is killed (issue 36).

    .venv/bin/python bench/recovery.py [--scenario restart|kill|both] [--down 30] [--rate 170]
        [--seconds 40] [--warmup 15] [--repeat 1] [--out FILE]

Needs PostgreSQL's server programs (``initdb``, ``pg_ctl``); as root it runs them as the
``postgres`` user (``runuser``). The shared server is never used: the script starts a
private cluster (``initdb`` into a temporary folder, a free port on 127.0.0.1, the server's
default settings: autovacuum on, fsync on, as a user's server would be), migrates a template
database once and gives every run a fresh copy of it.

One run, as a user's deployment would see it:

- two supervisors, ``python -m django runworkers --concurrency 4`` each (every worker and
  queue, as the README runs it; ``--log-format json`` only so that their logs can be read
  back), with DBWORKER's default ``LEASE_SECONDS`` (30; the bench settings' 60 is dropped);
- a producer process (the caller) offering ``--rate`` plain tasks a second through the public
  API, ``enqueue_many()`` in batches of ``--batch`` (``enqueue()`` for a batch of one),
  each task (``recovery.work``) sleeping ``--work-ms`` ms. A call the database refuses is
  kept and tried again every 0.2 s, the tasks owed meanwhile with it (up to 100 a call
  while it catches up): the caller's backlog of the outage reaches the database once it
  answers, as a retrying caller's would;
- ``--warmup`` seconds of steady load, then the fault:

  - ``restart``: ``pg_ctl -m fast stop``, ``--down`` seconds with the server down, ``pg_ctl
    start`` (``-w``: it returns once the server accepts connections: the reference time);
  - ``kill``: at a moment one supervisor holds at least one claimed task (polled every
    20 ms, the supervisor holding the most; its id read from the Supervisor table by its
    pid), SIGKILL to its whole process group (the supervisor and its children: the host
    is gone). The reference time is the kill. The tasks it still held (RUNNING with its
    ``supervisor_id``, read 0.3 s after the kill, once nothing of it can commit any more)
    are watched;

- the load goes on for ``--seconds`` after the reference time, and longer (60 s at most)
  until the backlog is drained and the watched tasks are done; then the producer stops,
  the supervisors still alive are counted, whatever is left is drained (30 s at most) and
  the supervisors are stopped (SIGTERM).

Everything is measured from the outside, from the task table after the run (one clock:
every process runs on this machine): completions are SUCCESSFUL tasks by ``finished_at``,
in 0.5 s bins. Figures per run:

- ``pre_rate``: completions/s from 5 s after the producer started to the fault;
- ``throughput_back_s``: seconds from the reference time to the end of the first 0.5 s bin
  (bins counted from the reference time) that holds, with the bin after it, at least 80% of
  ``pre_rate``'s completions (0.5 = within the first half second);
- ``first_success_s``: to the first task SUCCESSFUL after the reference time;
  ``lowest_bin_share_10s``: the fewest completions of a 0.5 s bin in the 10 s after it, as a
  share of ``pre_rate``'s;
- ``backlog_drained_s`` (restart): seconds from the reference time until the backlog (tasks
  offered by the caller's clock, ``rate`` x elapsed, minus tasks SUCCESSFUL) is back to at
  most its largest value of the steady pre-fault window (looked at every 0.1 s);
- ``units_back_s`` (kill): seconds from the kill to the last watched task's ``finished_at``;
  ``taken_back_s``: to the first look (every 0.5 s, live) at which the dead supervisor held
  no task any more;
- ``supervisors_back_s`` (restart): when each supervisor's main loop logged
  ``reconnected`` (its claims go on from there), from the reference time;
- ``failed`` (tasks FAILED: must be 0), ``run_twice`` (tasks with ``attempts`` > 1),
  ``crashed`` (``crashes`` > 0), ``supervisors_alive`` (of those not killed, the processes
  still running when the load stopped);
- the per-0.5 s timeline (bin start relative to the reference time, completed, enqueued,
  backlog at the bin's end), the live looks (outstanding, SUCCESSFUL, FAILED, held by the
  dead supervisor; null while the server is down), and the supervisors' log lines of level
  warning and above (counted by event, the first ones kept).

The code measured is the django_dbworker that ``PYTHONPATH`` resolves (its folder's
``bench/`` gives the settings and ``benchapp``): copy this script to a folder of its own and
run it with ``PYTHONPATH=<a worktree>`` to measure another commit. The JSON names the
folder, its commit and whether its ``django_dbworker/`` differs from that commit.

Writes ``bench/results/recovery-<date>.json`` (``--out``) and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.apps import AppConfig

HERE = Path(__file__).resolve().parent
TASK = "recovery.work"
TEMPLATE = "recovery_template"
BIN = 0.5
#: Tasks per enqueue_many() at most while the caller catches up after an outage.
CATCH_UP_BATCH = 100
#: Seconds between the caller's attempts while the database refuses its calls.
RETRY_PAUSE = 0.2
#: Seconds of each run's start ignored for the pre-fault rate (the supervisors warming up).
SETTLE = 5.0
#: Seconds the load may go on after --seconds, for the backlog and the watched tasks.
EXTRA = 60.0
RECOVERED_SHARE = 0.8
TABLE = "django_dbworker_taskrecord"
SUPERVISORS = "django_dbworker_supervisor"

SETTINGS = '''"""recovery.py's settings: bench_settings, the task's app, the default lease."""
from bench_settings import *  # noqa: F403

INSTALLED_APPS = [*INSTALLED_APPS, "recovery.RecoveryConfig"]  # noqa: F405
DBWORKER = {k: v for k, v in DBWORKER.items() if k != "LEASE_SECONDS"}  # noqa: F405
'''


def work(ms: float = 3.0) -> None:
    """The task: ``ms`` milliseconds of work (a sleep: the CPUs are the workers')."""
    time.sleep(ms / 1000)


class RecoveryConfig(AppConfig):
    """This file as an app of the settings below (``recovery.RecoveryConfig``): its
    ``ready()`` declares the task, ``recovery.work``, as a user's app does (a task row
    never imports a module: the registry knows the tasks the apps declared)."""

    name = "recovery"
    label = "recovery_bench"

    def ready(self) -> None:
        global work
        from django.tasks import Task, task

        if not isinstance(work, Task):
            work = task(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", choices=("restart", "kill", "both"), default="both")
    parser.add_argument("--down", type=float, default=30.0,
                        help="restart: seconds the server stays down (default 30)")
    parser.add_argument("--rate", type=float, default=170.0, help="tasks offered per second")
    parser.add_argument("--batch", type=int, default=5, help="tasks per enqueue_many() call")
    parser.add_argument("--work-ms", type=float, default=3.0, help="each task's work, in ms")
    parser.add_argument("--concurrency", type=int, default=4,
                        help="runworkers --concurrency of each of the two supervisors")
    parser.add_argument("--warmup", type=float, default=15.0,
                        help="seconds of steady load before the fault")
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="seconds of load after the fault, at least (default 40)")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--out", help="the JSON file (default "
                                      "bench/results/recovery-<date>.json)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary folder (server and supervisor logs)")
    parser.add_argument("--produce", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.produce:
        produce(args)
        return
    spec = importlib.util.find_spec("django_dbworker")
    if spec is None or spec.origin is None:
        parser.error("django_dbworker is not importable: set PYTHONPATH")
    root = Path(spec.origin).resolve().parent.parent
    if not (root / "bench" / "bench_settings.py").exists():
        parser.error(f"{root} has no bench/bench_settings.py")
    sys.path.insert(0, str(root / "bench"))
    programs = server_programs()
    if programs is None:
        parser.error("PostgreSQL's server programs (initdb, pg_ctl) are not installed")
    scenarios = ["restart", "kill"] if args.scenario == "both" else [args.scenario]
    out = Path(args.out) if args.out else (
        HERE / "results" / f"recovery-{datetime.now(UTC).strftime('%Y-%m-%d')}.json")

    def interrupted(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    import benchlib

    started = time.time()
    with Cluster(programs, keep=args.keep) as cluster:
        os.environ.update(cluster.env())  # benchlib.machine() reads this server's version
        cluster.prepare(root)
        code = code_info(root)
        print(f"django_dbworker from {code['django_dbworker']} (commit {code['commit'][:7]}"
              f"{', modified' if code['modified'] else ''}); PostgreSQL on port "
              f"{cluster.port}; folder {cluster.folder}", file=sys.stderr, flush=True)
        info = benchlib.machine()
        runs = []
        for repeat in range(1, args.repeat + 1):
            for scenario in scenarios:
                run = Run(cluster, root, scenario, repeat, args).measure()
                runs.append(run)
                print(line(run), file=sys.stderr, flush=True)
    data = {
        "benchmark": "recovery",
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - started, 1),
        "machine": info,
        "code": code,
        "settings": settings_of(args),
        "table": report(runs),
        "runs": runs,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1) + "\n")
    print(report(runs))
    print(f"\nwritten: {out}")


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "scenarios": args.scenario, "down_s": args.down, "rate": args.rate,
        "batch": args.batch, "work_ms": args.work_ms, "supervisors": 2,
        "concurrency": args.concurrency, "warmup_s": args.warmup, "seconds": args.seconds,
        "repeat": args.repeat, "lease_seconds": "DBWORKER default (30)",
        "runworkers": " ".join(runworkers_command(args.concurrency)[1:]),
        "task": f"{TASK}: time.sleep(work_ms / 1000)",
        "producer": f"enqueue_many() of {args.batch} (enqueue() for 1), paced by the clock; "
                    f"a refused call is retried every {RETRY_PAUSE} s with what is owed "
                    f"(up to {CATCH_UP_BATCH} a call)",
        "postgresql": "private cluster: initdb defaults (autovacuum on, fsync on), "
                      "listen 127.0.0.1, a free port",
        "bin_s": BIN, "recovered_share": RECOVERED_SHARE, "settle_s": SETTLE,
    }


def code_info(root: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              check=False)
        return done.stdout.strip()

    return {"root": str(root), "django_dbworker": str(root / "django_dbworker"),
            "commit": git("rev-parse", "HEAD"), "subject": git("log", "-1", "--format=%s"),
            "modified": git("status", "--porcelain", "--", "django_dbworker").splitlines()}


def runworkers_command(concurrency: int) -> list[str]:
    return [sys.executable, "-m", "django", "runworkers", f"--concurrency={concurrency}",
            "--log-format=json"]


# ----- the private server -----------------------------------------------------------------


def server_programs() -> Path | None:
    """The folder of ``initdb`` and ``pg_ctl``, the newest version installed."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Cluster:
    """A throw-away PostgreSQL cluster (as ``postgres`` when we are root); its folder also
    holds the settings module and the processes' logs. Stopped and removed on exit."""

    def __init__(self, programs: Path, keep: bool = False) -> None:
        self.programs = programs
        self.keep = keep
        self.folder = Path(tempfile.mkdtemp(prefix="dbworker_recovery_"))
        self.pg = self.folder / "pg"
        self.data = self.pg / "data"
        self.sockets = self.pg / "sockets"
        self.log = self.pg / "server.log"
        self.port = free_port()
        self.as_user: list[str] = []
        self.version = ""

    def __enter__(self) -> Cluster:
        try:
            os.chmod(self.folder, 0o755)  # the postgres user reaches its folder through it
            self.pg.mkdir()
            self.sockets.mkdir()
            if os.geteuid() == 0:  # initdb refuses to run as root
                user = pwd.getpwnam("postgres")
                for path in (self.pg, self.sockets):
                    os.chown(path, user.pw_uid, user.pw_gid)
                self.as_user = ["runuser", "-u", "postgres", "--"]
            self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust",
                      "--no-instructions", "-E", "UTF8", "--locale=C")
            self.start()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                self.stop("immediate")
        if self.keep:
            print(f"kept: {self.folder}", file=sys.stderr)
        else:
            shutil.rmtree(self.folder, ignore_errors=True)

    def _run(self, program: str, *args: str) -> None:
        done = subprocess.run([*self.as_user, str(self.programs / program), *args],
                              capture_output=True, text=True, timeout=120,
                              start_new_session=True)  # Ctrl-C reaches us, not the server
        if done.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} failed:\n{done.stdout}"
                               f"{done.stderr}\n{self.log.read_text(errors='replace')[-3000:]}"
                               if self.log.exists() else done.stderr)

    def start(self) -> None:
        options = f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                  "-w", "-t", "120", "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "120", "stop")

    def env(self) -> dict[str, str]:
        return {"PGHOST": "127.0.0.1", "PGPORT": str(self.port), "PGUSER": "postgres"}

    def connect(self, dbname: str, timeout: int = 10) -> Any:
        import psycopg

        return psycopg.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname=dbname, autocommit=True, connect_timeout=timeout)

    def prepare(self, root: Path) -> None:
        """The settings module, and the template database, migrated."""
        (self.folder / "recovery_settings.py").write_text(SETTINGS)
        with self.connect("postgres") as c:
            self.version = c.execute("SHOW server_version").fetchone()[0]
            c.execute(f'CREATE DATABASE "{TEMPLATE}"')
        done = subprocess.run([sys.executable, "-m", "django", "migrate", "--verbosity=0"],
                              env=self.environment(root, TEMPLATE), cwd=root,
                              capture_output=True, text=True, check=False)
        if done.returncode:
            raise RuntimeError(f"migrate failed:\n{done.stdout}\n{done.stderr}")

    def environment(self, root: Path, dbname: str) -> dict[str, str]:
        import benchlib

        path = [str(self.folder), str(HERE), str(root / "bench"), str(root),
                os.environ.get("PYTHONPATH", "")]
        return {**benchlib.without_bytecode_ban(os.environ), **self.env(),
                "BENCH_DB": "postgres", "BENCH_DB_NAME": dbname, "BENCH_DB_NAME_LARGE": "",
                "DJANGO_SETTINGS_MODULE": "recovery_settings", "PYTHONUNBUFFERED": "1",
                "PYTHONPATH": os.pathsep.join(p for p in path if p)}

    def database(self, name: str) -> None:
        with self.connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            c.execute(f'CREATE DATABASE "{name}" TEMPLATE "{TEMPLATE}"')

    def drop(self, name: str) -> None:
        with self.connect("postgres") as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


# ----- the caller ---------------------------------------------------------------------------


def produce(args: argparse.Namespace) -> None:
    """The producer process: ``--rate`` tasks a second through the public API until SIGTERM;
    what it did goes to ``--stats`` (JSON) at the end."""
    import django

    django.setup()
    import recovery  # this file as a module: its task is recovery.work
    from django.db import connections

    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    task = recovery.work
    connections["default"].ensure_connection()
    start = time.time()
    print(f"started {start!r}", flush=True)
    enqueued = calls = refused = max_owed = 0
    errors: Counter[str] = Counter()
    progress: list[tuple[float, int]] = []
    mark = start
    first_refused = last_refused = None
    while not stopping:
        now = time.time()
        owed = int(args.rate * (now - start)) - enqueued
        max_owed = max(max_owed, owed)
        if owed < args.batch:
            due = start + (enqueued + args.batch) / args.rate
            time.sleep(max(0.0, min(due - now, 0.1)))
            continue
        n = min(owed, CATCH_UP_BATCH)
        try:
            if n == 1:
                task.enqueue(args.work_ms)
            else:
                task.enqueue_many([((args.work_ms,), {})] * n)
        except Exception as exc:  # the database is down: keep what is owed, try again
            refused += 1
            first_refused = first_refused or now
            last_refused = now
            text = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ""
            if len(errors) < 20:
                errors[f"{type(exc).__module__}.{type(exc).__name__}: {text}"] += 1
            connections.close_all()
            time.sleep(RETRY_PAUSE)
            continue
        enqueued += n
        calls += 1
        if now >= mark:
            progress.append((round(time.time(), 3), enqueued))
            mark = now + BIN
    Path(args.stats).write_text(json.dumps({
        "start": start, "end": time.time(), "enqueued": enqueued, "calls": calls,
        "refused_calls": refused, "first_refused": first_refused,
        "last_refused": last_refused, "max_owed": max_owed, "errors": dict(errors),
        "progress": progress,
        "django_dbworker": str(Path(sys.modules["django_dbworker"].__file__ or "").parent),
    }))


# ----- one run ------------------------------------------------------------------------------


class Run:
    def __init__(self, cluster: Cluster, root: Path, scenario: str, repeat: int,
                 args: argparse.Namespace) -> None:
        self.cluster = cluster
        self.root = root
        self.scenario = scenario
        self.repeat = repeat
        self.args = args
        self.dbname = f"recovery_{scenario}_{repeat}"
        self.env = cluster.environment(root, self.dbname)
        self.supervisors: list[subprocess.Popen[bytes]] = []
        self.logs: list[Path] = []
        self.producer: subprocess.Popen[str] | None = None
        self.stats_file = cluster.folder / f"{self.dbname}-producer.json"
        self.live: list[list[Any]] = []
        self.conn: Any = None
        self.dead_id: str | None = None
        self.watched: list[str] = []
        self.times: dict[str, float] = {}
        self.killed_pid: int | None = None

    # -- the live look, tolerant of the server being down ------------------------------
    def query(self, sql: str, params: Any = None) -> list[Any] | None:
        import psycopg

        try:
            if self.conn is None or self.conn.closed:
                self.conn = self.cluster.connect(self.dbname, timeout=2)
            return list(self.conn.execute(sql, params).fetchall())
        except psycopg.Error:
            with contextlib.suppress(Exception):
                if self.conn is not None:
                    self.conn.close()
            self.conn = None
            return None

    def look(self) -> list[Any]:
        rows = self.query(
            f"SELECT count(*) FILTER (WHERE status IN ('READY', 'RUNNING', 'RETRYING')), "
            f"count(*) FILTER (WHERE status = 'SUCCESSFUL'), "
            f"count(*) FILTER (WHERE status = 'FAILED'), "
            f"count(*) FILTER (WHERE status = 'RUNNING' AND supervisor_id = %s::uuid), "
            f"count(*) FILTER (WHERE id = ANY(%s::uuid[]) AND status = 'SUCCESSFUL') "
            f"FROM {TABLE}", (self.dead_id, self.watched))
        sample = [round(time.time(), 3), *(rows[0] if rows else [None] * 5)]
        self.live.append(sample)
        return sample

    def watch_until(self, deadline: float) -> None:
        while (now := time.time()) < deadline:
            self.look()
            time.sleep(max(0.0, min(BIN - (time.time() - now), deadline - time.time())))

    # -- the processes ----------------------------------------------------------------------
    def start_supervisors(self) -> None:
        for i in range(2):
            log = self.cluster.folder / f"{self.dbname}-supervisor{i}.log"
            with open(log, "wb") as f:
                self.supervisors.append(subprocess.Popen(
                    runworkers_command(self.args.concurrency), env=self.env, cwd=self.root,
                    stdout=f, stderr=subprocess.STDOUT, start_new_session=True))
            self.logs.append(log)
        pids = [p.pid for p in self.supervisors]
        deadline = time.time() + 90
        while time.time() < deadline:
            rows = self.query(f"SELECT count(*) FROM {SUPERVISORS} WHERE pid = ANY(%s) "
                              "AND stopped_at IS NULL", (pids,))
            if rows and rows[0][0] == len(pids):
                return
            if any(p.poll() is not None for p in self.supervisors):
                break
            time.sleep(0.2)
        raise RuntimeError("the supervisors did not start:\n" + "\n".join(
            log.read_text(errors="replace")[-2000:] for log in self.logs))

    def start_producer(self) -> float:
        command = [sys.executable, str(Path(__file__).resolve()), "--produce",
                   f"--rate={self.args.rate}", f"--batch={self.args.batch}",
                   f"--work-ms={self.args.work_ms}", f"--stats={self.stats_file}"]
        self.producer = subprocess.Popen(command, env=self.env, cwd=self.root,
                                         stdout=subprocess.PIPE, text=True,
                                         start_new_session=True)
        assert self.producer.stdout is not None
        first = self.producer.stdout.readline().split()
        if len(first) != 2 or first[0] != "started":
            raise RuntimeError(f"the producer did not start ({first})")
        return float(first[1])

    def stop_producer(self) -> dict[str, Any]:
        assert self.producer is not None
        self.producer.send_signal(signal.SIGTERM)
        self.producer.wait(timeout=30)
        return dict(json.loads(self.stats_file.read_text()))

    def end_processes(self) -> None:
        """SIGTERM to the supervisors still running (30 s for a graceful stop), then
        SIGKILL to every process group this run started."""
        for process in self.supervisors:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.time() + 30
        for process in [*self.supervisors, *([self.producer] if self.producer else [])]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.1, deadline - time.time()))
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
        if self.conn is not None:
            with contextlib.suppress(Exception):
                self.conn.close()

    # -- the faults -------------------------------------------------------------------------
    def restart(self) -> float:
        self.times["stop_begin"] = time.time()
        self.cluster.stop("fast")
        self.times["stop_end"] = time.time()
        self.watch_until(self.times["stop_end"] + self.args.down)
        self.times["start_begin"] = time.time()
        self.cluster.start()
        self.times["start_end"] = time.time()
        return self.times["start_end"]

    def kill(self) -> float:
        ids: dict[str, subprocess.Popen[bytes]] = {}
        for process in self.supervisors:
            rows = self.query(f"SELECT id::text FROM {SUPERVISORS} WHERE pid = %s AND "
                              "stopped_at IS NULL ORDER BY started_at DESC LIMIT 1",
                              (process.pid,))
            if rows:
                ids[rows[0][0]] = process
        victim, held = next(iter(ids)), 0
        deadline = time.time() + 10
        while time.time() < deadline:
            rows = self.query(f"SELECT supervisor_id::text, count(*) FROM {TABLE} WHERE "
                              "status = 'RUNNING' GROUP BY 1 ORDER BY 2 DESC")
            holding = [(s, n) for s, n in rows or [] if s in ids]
            if holding:
                victim, held = holding[0]
                break
            time.sleep(0.02)
        process = ids[victim]
        self.times["kill"] = time.time()
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        self.killed_pid = process.pid
        self.dead_id = victim
        time.sleep(0.3)
        rows = self.query(f"SELECT id::text FROM {TABLE} WHERE status = 'RUNNING' AND "
                          "supervisor_id = %s::uuid", (victim,))
        self.watched = [r[0] for r in rows or []]
        self.times["held_seen_before_kill"] = held
        return self.times["kill"]

    # -- the whole run ----------------------------------------------------------------------
    def measure(self) -> dict[str, Any]:
        self.cluster.database(self.dbname)
        load = [round(os.getloadavg()[0], 2)]
        ticks = cpu_ticks()
        try:
            self.start_supervisors()
            start = self.start_producer()
            self.times["producer_start"] = start
            self.watch_until(start + self.args.warmup)
            pre_open = [s[1] for s in self.live
                        if s[0] >= start + SETTLE and s[1] is not None]
            ref = self.restart() if self.scenario == "restart" else self.kill()
            self.times["reference"] = ref
            self.watch_until(ref + self.args.seconds)
            limit = ref + self.args.seconds + EXTRA
            settled, calm = max(pre_open, default=0) + self.args.batch, 0
            while time.time() < limit and calm < 2:  # two looks in a row as before the fault
                sample = self.look()
                calm = calm + 1 if (
                    sample[1] is not None and sample[1] <= settled
                    and (not self.watched or sample[5] == len(self.watched))) else 0
                time.sleep(BIN)
            self.times["producer_stop"] = time.time()
            producer = self.stop_producer()
            alive = [p.poll() is None for p in self.supervisors if p.pid != self.killed_pid]
            beating = self.query(f"SELECT count(*) FROM {SUPERVISORS} WHERE stopped_at IS "
                                 "NULL AND last_heartbeat > now() - interval '10 seconds'")
            deadline = time.time() + 30
            while time.time() < deadline:
                sample = self.look()
                if sample and sample[1] == 0:
                    break
                time.sleep(BIN)
        finally:
            self.end_processes()
        load.append(round(os.getloadavg()[0], 2))
        result = self.results(producer, alive, beating[0][0] if beating else None)
        result["loadavg_1m"] = load
        result["cpu_steal_percent"] = steal_percent(ticks, cpu_ticks())
        self.cluster.drop(self.dbname)
        return result

    # -- the figures ------------------------------------------------------------------------
    def results(self, producer: dict[str, Any], alive: list[bool],
                beating: int | None) -> dict[str, Any]:
        t = self.times
        ref, start = t["reference"], t["producer_start"]
        fault = t.get("stop_begin", t.get("kill", ref))
        with self.cluster.connect(self.dbname) as c:
            done = sorted(r[0] for r in c.execute(
                f"SELECT extract(epoch FROM finished_at)::float8 FROM {TABLE} "
                "WHERE status = 'SUCCESSFUL'"))
            queued = sorted(r[0] for r in c.execute(
                f"SELECT extract(epoch FROM enqueued_at)::float8 FROM {TABLE}"))
            statuses = dict(c.execute(f"SELECT status, count(*) FROM {TABLE} GROUP BY 1"))
            twice, crashed, max_attempts = c.execute(
                f"SELECT count(*) FILTER (WHERE attempts > 1), "
                f"count(*) FILTER (WHERE crashes > 0), max(attempts) FROM {TABLE}").fetchone()
            failed_errors = [r[0] for r in c.execute(
                f"SELECT errors::text FROM {TABLE} WHERE status = 'FAILED' LIMIT 5")]
            watched = [
                {"status": s, "attempts": a, "crashes": cr,
                 "finished_s": round(f - ref, 3) if f is not None else None}
                for s, a, cr, f in c.execute(
                    f"SELECT status, attempts, crashes, extract(epoch FROM finished_at)::float8 "
                    f"FROM {TABLE} WHERE id = ANY(%s::uuid[]) ORDER BY finished_at",
                    (self.watched,))]
        # Until the last completion: after the producer stopped (at t["producer_stop"]),
        # what it offered is what it enqueued, and the run drained it.
        end = max(t["producer_stop"], done[-1] if done else 0.0)
        total = producer["enqueued"]

        def offered(at: float) -> int:
            return min(int(self.args.rate * max(0.0, at - start)), total)

        def backlog(at: float) -> int:
            return offered(at) - bisect_right(done, at)

        pre_span = fault - (start + SETTLE)
        pre_count = bisect_left(done, fault) - bisect_left(done, start + SETTLE)
        pre_rate = pre_count / pre_span if pre_span > 0 else None
        steps = [start + SETTLE + i / 10 for i in range(int(pre_span * 10) + 1)]
        threshold = max((backlog(s) for s in steps), default=0)

        back = None
        if pre_rate:
            need = RECOVERED_SHARE * pre_rate * BIN
            k = 0
            while ref + (k + 1) * BIN <= end:
                a = bisect_left(done, ref + (k + 1) * BIN) - bisect_left(done, ref + k * BIN)
                b = bisect_left(done, ref + (k + 2) * BIN) - bisect_left(done, ref + (k + 1) * BIN)
                if a >= need and b >= need:
                    back = round((k + 1) * BIN, 1)
                    break
                k += 1
        drained = None
        at = ref if self.scenario == "restart" else end + 1  # no backlog of its own to drain
        while at <= end:
            if backlog(at) <= threshold:
                drained = round(at - ref, 1)
                break
            at += 0.1
        first_after = next((d for d in done if d >= ref), None)
        lowest = None
        if pre_rate:  # the lowest 0.5 s bin of the 10 s after the reference, share of pre_rate
            lowest = min(bisect_left(done, ref + (k + 1) * BIN) - bisect_left(done, ref + k * BIN)
                         for k in range(int(10 / BIN))) / (pre_rate * BIN)
        timeline = []
        edge = ref - math.ceil((ref - start) / BIN) * BIN  # bins aligned on the reference
        while edge < end + 30:
            timeline.append([
                round(edge - ref, 2),
                bisect_left(done, edge + BIN) - bisect_left(done, edge),
                bisect_left(queued, edge + BIN) - bisect_left(queued, edge),
                backlog(edge + BIN),
            ])
            edge += BIN
        while timeline and timeline[-1][1] == 0 and timeline[-1][2] == 0:
            timeline.pop()
        live = [[round(s[0] - ref, 2), *s[1:6]] for s in self.live]
        taken_back = None
        if self.dead_id:
            taken_back = next((s[0] for s in live if s[0] >= 0 and s[4] == 0), None)
        units_back = None
        if watched and all(w["status"] == "SUCCESSFUL" for w in watched):
            units_back = max(w["finished_s"] for w in watched)
        outcome: dict[str, Any] = {
            "scenario": self.scenario, "repeat": self.repeat,
            "times": {k: (round(v - ref, 3) if isinstance(v, float) and v > 1e9 else v)
                      for k, v in t.items()},
            "reference": "server accepting again (pg_ctl start -w returned)"
                         if self.scenario == "restart" else "SIGKILL sent",
            "pre_rate": round(pre_rate, 1) if pre_rate else None,
            "pre_backlog_max": threshold,
            "throughput_back_s": back,
            "first_success_s": round(first_after - ref, 3) if first_after else None,
            "lowest_bin_share_10s": round(lowest, 2) if lowest is not None else None,
            "backlog_drained_s": drained,
            "failed": statuses.get("FAILED", 0),
            "run_twice": twice, "crashed": crashed, "max_attempts": max_attempts,
            "statuses": statuses,
            "failed_errors": failed_errors,
            "supervisors_alive": sum(alive), "supervisors_expected": len(alive),
            "supervisors_beating": beating,
            "producer": {k: v for k, v in producer.items() if k != "progress"},
        }
        if self.scenario == "restart":
            outcome["down_s"] = round(t["start_begin"] - t["stop_end"], 2)
            outcome["outage_s"] = round(t["start_end"] - t["stop_begin"], 2)
        else:
            outcome["killed_supervisor"] = self.dead_id
            outcome["units_watched"] = len(self.watched)
            outcome["units_back_s"] = units_back
            outcome["taken_back_s"] = taken_back
            outcome["watched"] = watched
        outcome["logs"] = [read_log(log, ref) for log in self.logs]
        if self.scenario == "restart":  # when each supervisor's main loop answered again
            outcome["supervisors_back_s"] = [
                next((w for w in log["reconnected_s"] if isinstance(w, float) and w > -5), None)
                for log in outcome["logs"]]
        outcome["timeline_columns"] = ["t_s", "completed", "enqueued", "backlog_at_end"]
        outcome["timeline"] = timeline
        outcome["live_columns"] = ["t_s", "open", "successful", "failed",
                                   "held_by_killed", "watched_done"]
        outcome["live"] = live
        return outcome


def read_log(path: Path, ref: float) -> dict[str, Any]:
    """A supervisor's log: events of level warning and above counted, the first 40 kept
    (with the time relative to the reference), and any line that is not JSON."""
    events: Counter[str] = Counter()
    kept: list[Any] = []
    other: list[str] = []
    back: list[float] = []  # the main loop's "reconnected" lines (not the renewer's)
    for raw in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            if raw.strip() and len(other) < 20:
                other.append(raw[:300])
            continue
        if not isinstance(record, dict) or record.get("level") not in (
                "warning", "error", "critical"):
            continue
        events[f"{record['level']} {record.get('event')}"] += 1
        when = record.get("time")
        with contextlib.suppress(TypeError, ValueError):
            when = round(datetime.fromisoformat(when).timestamp() - ref, 2)
        if record.get("event") == "reconnected" and "part" not in record:
            back.append(when)
        if len(kept) < 40:
            fields = {k: v for k, v in record.items()
                      if k not in ("time", "level", "logger", "event")}
            kept.append([when, record["level"], record.get("event"),
                         json.dumps(fields)[:400]])
    return {"file": path.name, "events": dict(events), "reconnected_s": back, "lines": kept,
            "other": other}


def cpu_ticks() -> tuple[int, int] | None:
    import benchlib

    return benchlib.cpu_ticks()


def steal_percent(before: tuple[int, int] | None, after: tuple[int, int] | None) -> Any:
    import benchlib

    return benchlib.steal_percent(before, after)


# ----- reporting ----------------------------------------------------------------------------


def line(run: dict[str, Any]) -> str:
    extra = (f", units held {run['units_watched']} back in {run['units_back_s']} s"
             if run["scenario"] == "kill" else
             f", backlog drained {run['backlog_drained_s']} s, supervisors reconnected "
             f"{run['supervisors_back_s']} s")
    return (f"{run['scenario']} #{run['repeat']}: pre {run['pre_rate']}/s, throughput back "
            f"{run['throughput_back_s']} s{extra}, FAILED {run['failed']}, run twice "
            f"{run['run_twice']}, supervisors alive "
            f"{run['supervisors_alive']}/{run['supervisors_expected']}")


def report(runs: list[dict[str, Any]]) -> str:
    import benchlib

    rows = []
    for r in runs:
        rows.append([
            r["scenario"], r["repeat"], r["pre_rate"],
            r.get("down_s", ""),
            " / ".join(str(b) for b in r.get("supervisors_back_s", [])),
            r["throughput_back_s"], r["backlog_drained_s"] if r["scenario"] == "restart" else "",
            r.get("units_watched", ""), r.get("taken_back_s", ""), r.get("units_back_s", ""),
            r["failed"], r["run_twice"],
            f"{r['supervisors_alive']}/{r['supervisors_expected']}",
        ])
    table = benchlib.markdown_table(
        ["scenario", "run", "pre-fault tasks/s", "down s", "supervisors reconnected s",
         "throughput back s (>= 80%)",
         "backlog drained s", "units held by the killed", "taken back s", "units done s",
         "FAILED", "run twice", "supervisors alive"], rows)
    for scenario in ("restart", "kill"):
        mine = [r for r in runs if r["scenario"] == scenario]
        if len(mine) > 1:
            backs = [r["throughput_back_s"] for r in mine if r["throughput_back_s"] is not None]
            if backs:
                table += (f"\n\n{scenario}: median throughput back "
                          f"{statistics.median(backs)} s over {len(mine)} runs")
    return table


if __name__ == "__main__":
    main()
