"""The database across a network: throughput, latency and round trips per job at 0, 1 and 5 ms.

    sudo .venv/bin/python bench/distance.py [--rtts 0,1,5] [--jobs 2000] [--samples 15]
        [--runs 3] [--systems rows,tasks,raw,celery[,procrastinate]] [--quick]

Needs root (``ip netns``, ``runuser``), PostgreSQL's ``initdb``/``pg_ctl`` and
``redis-server``. Everything runs in a network namespace of its own,
``dbw-bench-<pid>`` (its own loopback: the machine's loopback and its shared servers are
never touched):

- a private PostgreSQL (``initdb`` as the ``postgres`` user in a temporary folder, its
  socket there too, ``pg_stat_statements`` preloaded, the server's default settings) and a
  private ``redis-server`` (no persistence);
- per round-trip time, ``bench/netdelay.py`` forwarders in front of each server (this
  kernel has no ``netem``: the delay is put in user space, RTT/2 each way per chunk): one
  link for the workers and one for the caller (the process that enqueues), so that the
  round trips of each are counted apart. The RTT actually got is measured through the
  caller's link with ``SELECT 1`` and Redis ``PING``. Every system goes through the same
  forwarders, at 0 ms too;
- per system, ``bench/peers/distance_driver.py`` (with the system's own Python) enqueues
  ``--jobs`` no-op jobs, starts the system's workers (two processes, or one with
  ``--concurrency 2``), times the drain, lets them idle, then takes ``--samples`` latencies
  (from just before the enqueue call to the handler's first line). Progress is polled
  straight from the server, not through a forwarder.

Round trips are counted, not estimated: the forwarders' **turns** (client bursts that follow
server data the client had received: the round trips it waited for, connections opened
included) per job, and the statements the server ran (PostgreSQL: ``pg_stat_statements``,
BEGIN/COMMIT included; Redis: ``INFO commandstats``).

Systems: ``rows`` (ours: rows loaded with ``bulk_create()``, ``runworkers --concurrency 2
--worker feed --worker ping``; ``feed`` is declared with ``concurrency=2``), ``tasks`` (ours:
``enqueue_many()``, ``runworkers --concurrency 2 --queue default``), ``raw`` (bench/rawsql.py:
1 row per transaction, 2 processes; no latency: it has no idle loop), ``celery`` (Celery 5 +
Redis, prefork, 2 processes; bench/peers/peer_celery.py), ``procrastinate`` (2 worker
processes; bench/peers/peer_procrastinate.py). The peers' virtualenvs are bench/peers.py's
(made if missing). Everything (namespace, servers, forwarders, workers, folders) is removed
on exit, on failure and on Ctrl-C/SIGTERM too.

Writes bench/results/distance.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import benchlib

SYSTEMS = ("rows", "tasks", "raw", "celery", "procrastinate")
#: procrastinate drains at 26 jobs/s at 5 ms (8 round trips a job): 2,000 jobs take 80 s
#: there, half the sweep's time; it runs when named (--systems).
DEFAULT_SYSTEMS = ("rows", "tasks", "raw", "celery")
LABELS = {"rows": "ours, rows (bulk-created, worker concurrency=2)", "tasks": "ours, tasks",
          "raw": "raw SQL, 1 row per transaction", "celery": "Celery + Redis",
          "procrastinate": "procrastinate"}
NEEDS = {"rows": "postgres", "tasks": "postgres", "raw": "postgres", "celery": "redis",
         "procrastinate": "postgres"}
PG_PORT, REDIS_PORT = 5432, 6379  # inside the namespace: its own loopback
LINK_PORTS = {"pg_worker": 6432, "pg_caller": 6433, "redis_worker": 6390, "redis_caller": 6391}
PROBE_USER = "bench_probe"
TEMPLATE = "ours_template"
RUN_TIMEOUT_S = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rtts", default="0,1,5", help="round-trip times in ms")
    parser.add_argument("--jobs", type=int, default=2_000)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--runs", type=int, default=3,
                        help="drains per system and RTT, the systems taking turns; the run "
                             "with the median jobs/s is reported (its latencies and counts "
                             "too), every run's jobs/s beside it")
    parser.add_argument("--idle", type=float, default=2.0,
                        help="seconds the idle workers' own round trips are counted")
    parser.add_argument("--systems", default=",".join(DEFAULT_SYSTEMS),
                        help=f"comma-separated, among: {', '.join(SYSTEMS)} (default: all "
                             "but procrastinate, which adds about 2.5 minutes)")
    parser.add_argument("--results", default="distance.json",
                        help="the file in bench/results/ to write (default distance.json)")
    parser.add_argument("--quick", action="store_true",
                        help="200 jobs, 3 samples, 0.5 s idle: a smoke test, not figures")
    args = parser.parse_args()
    systems = [s for s in args.systems.split(",") if s]
    if set(systems) - set(SYSTEMS):
        parser.error(f"--systems {args.systems}: choose among {', '.join(SYSTEMS)}")
    try:
        rtts = [float(x) for x in args.rtts.split(",")]
    except ValueError:
        parser.error(f"--rtts {args.rtts}: give milliseconds, comma-separated (0,1,5)")
    if any(r < 0 for r in rtts):
        parser.error(f"--rtts {args.rtts}: a round-trip time is 0 or more milliseconds")
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1")
    if args.quick:
        args.jobs, args.samples, args.idle = min(args.jobs, 200), min(args.samples, 3), 0.5
        args.runs = 1
    missing = [t for t in ("ip", "runuser", "initdb", "pg_ctl", "redis-server")
               if shutil.which(t) is None]
    if os.geteuid() != 0 or missing:
        sys.exit(f"distance.py needs root and {', '.join(missing) or 'these tools'} "
                 "(ip netns, runuser, PostgreSQL's initdb/pg_ctl, redis-server)")
    venvs = peer_venvs(systems)
    started = time.monotonic()
    loads = {"start": [round(x, 2) for x in os.getloadavg()]}
    # SIGTERM/SIGHUP end the run as Ctrl-C does, through every finally below (SIGINT too,
    # even where it was inherited as ignored, as in a shell's background job).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, interrupted)
    with Namespace() as space:
        versions = space.prepare(systems)
        results = []
        for rtt in rtts:
            with space.links(rtt) as links:
                measured = measure_rtt(links)
                print(f"--- RTT {rtt:g} ms: measured SELECT 1 {measured['select1_ms']} ms, "
                      f"PING {measured['ping_ms']} ms", file=sys.stderr, flush=True)
                runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
                for _ in range(args.runs):  # the systems take turns: drift hits each alike
                    for system in systems:
                        result = space.run(system, rtt, links, venvs, args)
                        result.update(rtt_ms=rtt, measured=measured)
                        runs[system].append(result)
                        show(result)
                results.extend(median_run(runs[system]) for system in systems)
    loads["end"] = [round(x, 2) for x in os.getloadavg()]
    add_ratios(results)
    table = report(results)
    path = benchlib.write_results(args.results, {
        "benchmark": "distance",
        "machine": benchlib.machine(),
        "servers": versions,
        "loadavg_1m_5m_15m": loads,
        "seconds": round(time.monotonic() - started, 1),
        "config": {"rtts_ms": rtts, "jobs": args.jobs, "samples": args.samples,
                   "runs": args.runs,
                   "idle_s": args.idle, "quick": args.quick, "systems": systems,
                   "per_s": "jobs / (workers launched -> nothing left), start-up included",
                   "turns": "forwarder turns: client bursts after server data it had "
                            "received, i.e. round trips waited for (first burst of a "
                            "connection included; a connection costs one RTT more)",
                   "latency": "handler's first line - just before the enqueue call, "
                              "workers idle, a random gap before each"},
        "results": results,
        "table": table,
    })
    print(table)
    shown = path.relative_to(benchlib.ROOT) if path.is_relative_to(benchlib.ROOT) else path
    print(f"\nwritten: {shown}")


def interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def peer_venvs(systems: list[str]) -> dict[str, str]:
    """The Python of each system: ours, or the peer's virtualenv (bench/peers.py makes it)."""
    import peers

    found = {s: sys.executable for s in systems if s in ("rows", "tasks", "raw")}
    for name in systems:
        if name in peers.PEERS:
            peers.ensure_venv(name, peers.peer_meta(name)["REQUIREMENTS"])
            found[name] = str(peers.VENVS / name / "bin" / "python")
    return found


class Namespace:
    """The network namespace with its private servers; everything undone on exit."""

    def __init__(self) -> None:
        self.name = f"dbw-bench-{os.getpid()}"
        self.stack = contextlib.ExitStack()
        self.folder = Path()
        self.redis: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Namespace:
        try:
            self._start()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def _start(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="dbworker_distance_"))
        self.stack.callback(shutil.rmtree, self.folder, ignore_errors=True)
        os.chmod(self.folder, 0o755)  # the postgres user reaches its data folder through it
        run(["ip", "netns", "add", self.name])
        self.stack.callback(subprocess.run, ["ip", "netns", "delete", self.name],
                            check=False)
        home = os.open("/proc/self/ns/net", os.O_RDONLY)
        self.stack.callback(os.close, home)
        self.stack.callback(self._end_processes)  # runs before the namespace goes
        self.stack.callback(os.setns, home, os.CLONE_NEWNET)
        # From here on this process and everything it starts are in the namespace.
        space = os.open(f"/run/netns/{self.name}", os.O_RDONLY)
        try:
            os.setns(space, os.CLONE_NEWNET)
        finally:
            os.close(space)
        run(["ip", "link", "set", "lo", "up"])
        self._start_postgres()
        self._start_redis()

    def _start_postgres(self) -> None:
        data, sockets = self.folder / "pg", self.folder / "sockets"
        for folder in (data, sockets):
            folder.mkdir(mode=0o700)
            shutil.chown(folder, "postgres", "postgres")
        run(["runuser", "-u", "postgres", "--", "initdb", "-D", str(data), "--auth=trust",
             "--username=postgres", "--no-sync", "--no-instructions", "--encoding=UTF8",
             "--locale=C"])
        options = (f"-c listen_addresses=127.0.0.1 -c port={PG_PORT} "
                   f"-c unix_socket_directories={sockets} "
                   "-c shared_preload_libraries=pg_stat_statements "
                   "-c pg_stat_statements.track_utility=on -c max_connections=100")
        self.stack.callback(self._stop_postgres, data)
        run(["runuser", "-u", "postgres", "--", "pg_ctl", "-D", str(data), "-w", "-t", "60",
             "-l", str(data / "server.log"), "-o", options, "start"],
            start_new_session=True)

    def _stop_postgres(self, data: Path) -> None:
        if (data / "postmaster.pid").exists():
            subprocess.run(["runuser", "-u", "postgres", "--", "pg_ctl", "-D", str(data),
                            "-m", "immediate", "-w", "-t", "30", "stop"], check=False,
                           capture_output=True)

    def _start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--bind", "127.0.0.1", "--port", str(REDIS_PORT), "--save", "",
             "--appendonly", "no", "--dir", str(self.folder), "--loglevel", "warning"],
            stdout=subprocess.DEVNULL, start_new_session=True)
        self.stack.callback(stop_process, self.redis)
        wait_for_port(REDIS_PORT)

    def _end_processes(self) -> None:
        """Whatever still runs in the namespace (workers, drivers, forwarders): all started
        by this run. SIGTERM, then SIGKILL after a grace; never this process."""
        for signum, grace in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 2.0)):
            pids = self._pids()
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            deadline = time.monotonic() + grace
            while self._pids() and time.monotonic() < deadline:
                time.sleep(0.05)

    def _end_strays(self, links: dict[str, dict[str, Any]]) -> None:
        """Kill what runs in the namespace but the servers and the forwarders."""
        keep = {os.getpid(), *(link["process"].pid for link in links.values())}
        if self.redis is not None:
            keep.add(self.redis.pid)
        postmaster = self.folder / "pg" / "postmaster.pid"
        if postmaster.exists():
            keep.add(int(postmaster.read_text().split()[0]))
        for pid in self._pids():
            try:
                parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            if pid not in keep and parent not in keep - {os.getpid()}:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _pids(self) -> list[int]:
        found = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True,
                               text=True, check=False).stdout.split()
        return [int(p) for p in found if int(p) != os.getpid()]

    # -- what the systems need ------------------------------------------------------------
    def prepare(self, systems: list[str]) -> dict[str, Any]:
        """The probe user, pg_stat_statements, and a migrated template of our tables."""
        import psycopg

        with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
            c.execute(f"CREATE ROLE {PROBE_USER} SUPERUSER LOGIN")
            c.execute("CREATE EXTENSION pg_stat_statements")
            pg_version = c.execute("SHOW server_version").fetchone()[0]
            if {"rows", "tasks"} & set(systems):
                c.execute(f'CREATE DATABASE "{TEMPLATE}"')
        if {"rows", "tasks"} & set(systems):
            env = {**benchlib.environment("postgres", TEMPLATE), "PGHOST": "127.0.0.1",
                   "PGPORT": str(PG_PORT), "PGUSER": "postgres"}
            run([sys.executable, "-m", "django", "migrate", "--verbosity=0"], env=env)
        redis = subprocess.run(["redis-server", "--version"], capture_output=True,
                               text=True).stdout.split()[2]
        return {"postgresql": pg_version, "redis": redis.removeprefix("v="),
                "postgresql_settings": "initdb defaults (fsync on, synchronous_commit on, "
                                       "shared_buffers 128MB), pg_stat_statements"}

    @contextlib.contextmanager
    def links(self, rtt: float):  # type: ignore[no-untyped-def]
        """The four forwarders at ``rtt`` ms; stopped afterwards."""
        started: dict[str, dict[str, Any]] = {}
        try:
            for name, port in LINK_PORTS.items():
                target = PG_PORT if name.startswith("pg") else REDIS_PORT
                stats = self.folder / f"{name}.json"
                process = subprocess.Popen(
                    [sys.executable, str(benchlib.BENCH / "netdelay.py"),
                     "--listen", f"127.0.0.1:{port}", "--connect", f"127.0.0.1:{target}",
                     "--rtt-ms", f"{rtt:g}", "--stats", str(stats)],
                    stdout=subprocess.PIPE, text=True, start_new_session=True)
                started[name] = {"process": process, "port": port, "stats": str(stats)}
                assert process.stdout is not None
                if process.stdout.readline().strip() != "ready":
                    raise RuntimeError(f"the forwarder {name} did not start")
            yield started
        finally:
            for link in started.values():
                stop_process(link["process"])

    def run(self, system: str, rtt: float, links: dict[str, dict[str, Any]],
            venvs: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
        """One system at one RTT, through distance_driver.py; what it measured."""
        import psycopg

        kind = NEEDS[system]
        prefix = "pg" if kind == "postgres" else "redis"
        worker, caller = links[f"{prefix}_worker"], links[f"{prefix}_caller"]
        name = f"bench_{system}"
        logs = self.folder / f"logs_{system}_{rtt:g}"
        config: dict[str, Any] = {
            "kind": system, "jobs": args.jobs, "samples": args.samples, "idle_s": args.idle,
            "gap_s": [0.1, 0.4], "settle_s": 0.1, "logs": str(logs), "pg_name": name,
            "links": {"worker": {"pid": worker["process"].pid, "stats": worker["stats"]},
                      "caller": {"pid": caller["process"].pid, "stats": caller["stats"]}},
        }
        env = benchlib.without_bytecode_ban(os.environ)
        for variable in ("PYTHONPATH", "VIRTUAL_ENV", "DJANGO_SETTINGS_MODULE"):
            env.pop(variable, None)
        peers_code = str(benchlib.BENCH / "peers")
        if kind == "postgres":
            config["server"] = {"pg_dsn": pg_dsn("postgres", PROBE_USER)}
            with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                template = f' TEMPLATE "{TEMPLATE}"' if system in ("rows", "tasks") else ""
                c.execute(f'CREATE DATABASE "{name}"{template}')
        else:
            config["server"] = {"redis_port": REDIS_PORT}
        if system in ("rows", "tasks", "raw"):
            env.update(benchlib.environment("postgres", name), PGHOST="127.0.0.1",
                       PGPORT=str(caller["port"]), PGUSER="postgres")
            env["PYTHONPATH"] = os.pathsep.join([peers_code, env["PYTHONPATH"]])
            config["worker_env"] = {"PGPORT": str(worker["port"])}
            module = "distance_ours"
        elif system == "celery":
            env.update(PYTHONPATH=peers_code,
                       PEER_REDIS_URL=f"redis://127.0.0.1:{caller['port']}/0")
            config["worker_env"] = {"PEER_REDIS_URL": f"redis://127.0.0.1:{worker['port']}/0"}
            module = "peer_celery"
        else:
            env.update(PYTHONPATH=peers_code, PEER_PG_HOST="127.0.0.1",
                       PEER_PG_PORT=str(caller["port"]), PEER_PG_USER="postgres",
                       PEER_PG_NAME=name)
            config["worker_env"] = {"PEER_PG_PORT": str(worker["port"])}
            module = f"peer_{system}"
        if system in ("celery", "procrastinate"):
            python = Path(venvs[system])
            env.update(VIRTUAL_ENV=str(python.parent.parent),
                       PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}")
        config_file, out = self.folder / "config.json", self.folder / "out.json"
        config_file.write_text(json.dumps(config))
        out.unlink(missing_ok=True)
        command = [venvs[system], str(benchlib.BENCH / "peers" / "distance_driver.py"),
                   "--module", module, "--config", str(config_file), "--out", str(out)]
        begun = time.monotonic()
        try:
            done = subprocess.run(command, env=env, cwd=peers_code, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=RUN_TIMEOUT_S)
            output, code = done.stdout, done.returncode
        except subprocess.TimeoutExpired as e:
            output, code = f"{e.output or ''}\ntimed out after {RUN_TIMEOUT_S}s", -1
        finally:
            self._end_strays(links)  # a failed driver's workers: not into the next run
        found = json.loads(out.read_text()) if out.exists() else {}
        if code or "error" in found or not found:
            tail = "\n".join(str(output).strip().splitlines()[-15:])
            found = {"error": found.get("error") or f"exit {code}", "log": tail}
            print(f"{system} at {rtt:g} ms failed:\n{tail}", file=sys.stderr, flush=True)
        if kind == "postgres":
            with psycopg.connect(pg_dsn("postgres"), autocommit=True) as c:
                c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        else:
            subprocess.run(["redis-cli", "-p", str(REDIS_PORT), "FLUSHALL"],
                           capture_output=True, check=False)
        return {"system": system, "label": LABELS[system],
                "seconds": round(time.monotonic() - begun, 1), **found}


def pg_dsn(dbname: str, user: str = "postgres") -> str:
    return f"host=127.0.0.1 port={PG_PORT} user={user} dbname={dbname}"


def run(command: list[str], **kwargs: Any) -> None:
    done = subprocess.run(command, capture_output=True, text=True, check=False, **kwargs)
    if done.returncode:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-2000:]}")


def stop_process(process: subprocess.Popen[Any]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def wait_for_port(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def measure_rtt(links: dict[str, dict[str, Any]], n: int = 20) -> dict[str, float]:
    """The RTT actually got through the callers' links: ``SELECT 1`` and Redis ``PING``
    (median of ``n``, on a connection already open)."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={links['pg_caller']['port']} user=postgres "
                         "dbname=postgres", autocommit=True) as c:
        c.execute("SELECT 1")
        select = []
        for _ in range(n):
            begin = time.perf_counter()
            c.execute("SELECT 1").fetchone()
            select.append(time.perf_counter() - begin)
    with socket.create_connection(("127.0.0.1", links["redis_caller"]["port"])) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ping = []
        for _ in range(n + 1):
            begin = time.perf_counter()
            s.sendall(b"*1\r\n$4\r\nPING\r\n")
            reply = b""
            while not reply.endswith(b"\r\n"):
                reply += s.recv(64)
            ping.append(time.perf_counter() - begin)
        ping = ping[1:]
    return {"select1_ms": round(1000 * statistics.median(select), 2),
            "ping_ms": round(1000 * statistics.median(ping), 2)}


def show(r: dict[str, Any]) -> None:
    if "error" in r:
        return
    latency = r.get("latency") or {}
    print(f"  {r['system']}: {r['per_s']}/s (net {r['net_per_s']}/s), worker turns/job "
          f"{r['drain']['worker_turns_per_unit']}, statements/job "
          f"{r['drain'].get('statements_per_unit')}, latency p50 {latency.get('p50_ms')} ms, "
          f"{r['seconds']}s, load {r['loadavg_1m']}", file=sys.stderr, flush=True)


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median jobs/s (of an even number, the lower middle), with every
    run's jobs/s (``runs_per_s``, ``runs_net_per_s``); a failed run is reported as such."""
    failed = [r for r in runs if "error" in r]
    if failed:
        return failed[0]
    ordered = sorted(runs, key=lambda r: r["per_s"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs_per_s"] = [r["per_s"] for r in runs]
    chosen["runs_net_per_s"] = [r["net_per_s"] for r in runs]
    return chosen


def add_ratios(results: list[dict[str, Any]]) -> None:
    """Each figure as a share of the same system's figure at the lowest RTT."""
    base: dict[str, dict[str, Any]] = {}
    for r in sorted(results, key=lambda r: r["rtt_ms"]):
        if "error" in r:
            continue
        first = base.setdefault(r["system"], r)
        r["vs_own_lowest_rtt"] = round(r["per_s"] / first["per_s"], 3)
        if r.get("latency") and first.get("latency"):
            r["latency_growth_ms"] = round(r["latency"]["p50_ms"] - first["latency"]["p50_ms"],
                                           2)


def per_s(r: dict[str, Any]) -> str:
    """The median run's jobs/s, and the range of every run's where there were several."""
    runs = r.get("runs_per_s") or []
    spread = f" ({min(runs):,}-{max(runs):,})" if len(runs) > 1 else ""
    return f"{r['per_s']:,}{spread}"


def report(results: list[dict[str, Any]]) -> str:
    headers = ["system", "RTT ms (SELECT 1 / PING)", "jobs/s", "% of own lowest RTT",
               "net jobs/s", "idle latency p50 ms", "round trips per job: workers, drain "
               "(net of start-up)", "statements per job (server)",
               "round trips per latency job (workers + caller)", "enqueue round trips per job"]
    rows = []
    for r in results:
        measured = r["measured"]
        rtt = f"{r['rtt_ms']:g} ({measured['select1_ms']} / {measured['ping_ms']})"
        if "error" in r:
            rows.append([r["label"], rtt, "failed", "", "", "", "", "", "",
                         r["error"][:120].replace("|", "/")])
            continue
        drain, net, latency = r["drain"], r["net"], r.get("latency")
        lat_turns = (latency["turns_per_job_median"]["worker"]
                     + latency["turns_per_job_median"]["caller"]) if latency else None
        rows.append([
            r["label"], rtt, per_s(r), f"{r['vs_own_lowest_rtt']:.0%}",
            f"{r['net_per_s']:,}" if r["net_per_s"] else "",
            latency["p50_ms"] if latency else "n/a (no idle loop)",
            f"{drain['worker_turns_per_unit']} ({net['worker_turns_per_unit']})",
            drain.get("statements_per_unit", ""),
            f"{lat_turns:g}" if lat_turns is not None else "",
            r["fill"]["caller_turns_per_unit"],
        ])
    return benchlib.markdown_table(headers, rows)


if __name__ == "__main__":
    main()
