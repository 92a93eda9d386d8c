"""Run every benchmark, then write one summary table (about 17-19 minutes on 2 CPUs).

    .venv/bin/python bench/run_all.py [--quick] [--only peers,...] [--distance]

Runs, one after the other, each on PostgreSQL, SQLite and MariaDB: ``throughput.py`` (rows,
tasks and the raw SQL reference, alternating, 3 runs of 5,000), ``row_feeds.py`` (rows
bulk-created and saved, as users write them, and the precreated reference; 3 runs of
5,000, without the history burst, which row_feeds.py alone runs), ``enqueue.py`` (enqueue_many of
10,000 and a loop of enqueue()), ``latency.py`` (idle latency and idle cost) and
``claim_cost.py`` (claim cost at 1,000 and 1,000,000 finished rows) and, PostgreSQL only,
``table_health.py --jobs=50000`` (dead tuples and the claim's plan under churn; its
1,000,000-job figures come from running it alone), ``flow_control.py`` (unique, keyed and
paused-queue drains next to plain tasks, 3 runs of 6,000), ``workflows.py`` (a fan-out/fan-in
of 10,000 tasks next to 10,000 independent ones, and the task claim with 100,000 finished
workflows vs none); then ``peers.py --runs=3 --budget=20
--samples=30``
(Celery + Redis, procrastinate, django-tasks-db, django-q2, Huey/SQLite, each in its own
virtualenv under ``bench/.peers/``: 5,000 no-op jobs drained three times, the median as
for ours, or once for a peer that takes over 10 s a drain, and the idle latency, ~2-3
minutes once the virtualenvs exist). Each writes its own
``bench/results/<name>.json``; this script then writes ``bench/results/summary.json`` and
``bench/results/summary.md``: the figures next to the targets of issue 6 and, in the
column "vs peers", next to the peers' figures of the same run (ours / theirs), with the
machine, its load average and the CPU steal of each benchmark; the same table goes into
README.md and bench/README.md, between the marker lines ``README_TABLES`` names.
``--only peers`` (say) runs those again and takes the others' figures from their last
results: for a benchmark a burst of CPU steal spoiled. ``--quick`` runs fewer repetitions
(for a smoke test, not figures). ``--distance`` runs ``distance.py`` after the others (the
database across a network at 0, 1 and 5 ms of RTT, ours and the peers; as root; about 10
minutes; it writes bench/results/distance.json, not the summary table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import benchlib

SCRIPTS = {
    "throughput": ["--runs=3", "--rows=5000"],
    "row_feeds": ["--runs=3", "--rows=5000", "--history=0"],
    "enqueue": ["--runs=5"],
    "latency": ["--samples=100"],
    "claim_cost": ["--iterations=100", "--warmup=10"],
    # three drains and the median, as throughput.py's for ours (one drain of Huey gave
    # 2,921 and 3,608 jobs/s in two runs of the same day), for the peers that drain in
    # seconds; the slow ones (12-18 s a drain) once, to keep run_all under ten minutes
    "peers": ["--runs=3", "--budget=20", "--samples=30"],
    # 50,000 jobs of each kind (1-2 min: the plans and the claim cost; too short for
    # autovacuum's 60 s naptime to show): the large figures come from table_health.py alone
    "table_health": ["--jobs=50000", "--sample-every=25000"],
    "flow_control": ["--runs=3", "--tasks=6000"],
    # issue 20: a fan-out/fan-in of 10,000 next to 10,000 independent tasks (3 drains
    # each), and the task claim with 100,000 finished workflows in history vs none
    "workflows": ["--runs=3", "--tasks=10000", "--history=100000"],
}
#: How long ``--distance`` adds (bench/distance.py's whole sweep, on 2 CPUs).
DISTANCE_MINUTES = "about 10 minutes (3 runs of each system per RTT)"
QUICK = {
    "throughput": ["--runs=1", "--rows=1000"],
    "row_feeds": ["--runs=1", "--rows=1000", "--history=0"],
    "enqueue": ["--runs=1", "--tasks=2000", "--loop=200"],
    "latency": ["--samples=10", "--idle=2"],
    "claim_cost": ["--iterations=10", "--warmup=2", "--large=20000"],
    "peers": ["--quick"],
    "table_health": ["--jobs=5000", "--sample-every=2500", "--waiting=2000",
                     "--enqueue-batch=2000"],
    "flow_control": ["--runs=1", "--tasks=1000", "--backlog=2000"],
    "workflows": ["--runs=1", "--tasks=1000", "--history=2000", "--iterations=10",
                  "--warmup=2"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--distance", action="store_true",
                        help="also run distance.py (the database across a network at 0, 1 "
                             "and 5 ms of RTT, ours and the peers; needs root; "
                             f"{DISTANCE_MINUTES}; its own bench/results/distance.json)")
    parser.add_argument("--only", help="comma-separated benchmarks to run again (the others'"
                        " figures come from their last results), e.g. after CPU steal")
    args = parser.parse_args()
    scripts = QUICK if args.quick else SCRIPTS
    only = [n for n in (args.only or "").split(",") if n]
    if set(only) - set(SCRIPTS):
        parser.error(f"--only: choose among {', '.join(SCRIPTS)}")
    started = time.monotonic()
    loads = {"start": [round(x, 2) for x in os.getloadavg()]}
    seconds, steal = earlier(only)
    first = benchlib.cpu_ticks()
    for name, passed in scripts.items():
        if only and name not in only:
            continue
        print(f"=== {name}", file=sys.stderr, flush=True)
        begun, ticks = time.monotonic(), benchlib.cpu_ticks()
        subprocess.run([sys.executable, str(benchlib.BENCH / f"{name}.py"), *passed],
                       check=True, cwd=benchlib.ROOT)
        seconds[name] = round(time.monotonic() - begun, 1)
        steal[name] = benchlib.steal_percent(ticks, benchlib.cpu_ticks())
    if args.distance:
        print("=== distance", file=sys.stderr, flush=True)
        begun, ticks = time.monotonic(), benchlib.cpu_ticks()
        subprocess.run([sys.executable, str(benchlib.BENCH / "distance.py"),
                        *(["--quick"] if args.quick else [])], check=True, cwd=benchlib.ROOT)
        seconds["distance"] = round(time.monotonic() - begun, 1)
        steal["distance"] = benchlib.steal_percent(ticks, benchlib.cpu_ticks())
    if not only:
        steal["total"] = benchlib.steal_percent(first, benchlib.cpu_ticks())
    loads["end"] = [round(x, 2) for x in os.getloadavg()]
    found = {name: json.loads((benchlib.RESULTS / f"{name}.json").read_text())
             for name in SCRIPTS if (benchlib.RESULTS / f"{name}.json").exists()}
    table = summary(found)
    benchlib.write_results("summary.json", {
        "benchmark": "summary",
        "machine": benchlib.machine(),
        "loadavg_1m_5m_15m": loads,
        "seconds": {**seconds, "total": round(time.monotonic() - started, 1)},
        "cpu_steal_percent": steal,
        "run_again": only,
        "quick": args.quick,
        "table": table,
    })
    machine = found["throughput"]["machine"]
    header = (f"Machine: {machine['cpu_count']} CPUs ({machine['cpu_model']}), PostgreSQL "
              f"{machine['postgres']}, SQLite {machine['sqlite']}, MariaDB "
              f"{machine.get('mariadb')} (mysqlclient {machine.get('mysqlclient')}); "
              "load average "
              f"{loads['start'][0]} at the start, {loads['end'][0]} at the end; "
              f"{round(time.monotonic() - started)} s "
              f"{'for ' + ', '.join(only) + ', run again now' if only else 'in all'}; "
              f"{steal_text(steal)}.\n\n")
    table += distance_text()
    (benchlib.RESULTS / "summary.md").write_text(header + table + "\n")
    print(header + table)
    print(f"\nwritten: {Path('bench/results/summary.md')}, bench/results/summary.json")
    if not args.quick:
        for readme in README_TABLES:
            put_table(readme, header + table)
            print(f"written: the table in {readme.relative_to(benchlib.ROOT)}")


def distance_text() -> str:
    """The last ``distance.py`` sweep (``--distance``, or run on its own) as a second
    table under the summary, with when and how it ran; nothing if it never ran."""
    path = benchlib.RESULTS / "distance.json"
    if not path.exists():
        return ""
    found = json.loads(path.read_text())
    loads = found.get("loadavg_1m_5m_15m", {})
    config = found.get("config", {})
    return (
        f"\n\nAcross a network (`bench/distance.py`, {found['created_at'][:16]} UTC, "
        f"{found['seconds']:.0f} s, load average {loads.get('start', ['?'])[0]} at the "
        f"start): {config.get('jobs', '?'):,} no-op jobs, two workers, each system's "
        "database (a private PostgreSQL, Redis for Celery) behind a forwarder adding the "
        "round-trip time in a network namespace of its own; round trips counted by the "
        "forwarder, statements by pg_stat_statements; idle latency from the caller's side."
        f"\n\n{found['table'].strip()}")


#: Files that show the latest summary between the two ``MARKERS`` lines; run_all rewrites
#: what is between them (not after --quick), so they cannot fall behind the results.
README_TABLES = (benchlib.ROOT / "README.md", benchlib.BENCH / "README.md")
MARKERS = ("<!-- bench/run_all.py writes the table below -->",
           "<!-- bench/run_all.py writes the table above -->")


def put_table(readme: Path, text: str) -> None:
    """Replace what is between the markers in ``readme`` with ``text``."""
    content = readme.read_text()
    begin, end = (content.find(marker) for marker in MARKERS)
    if begin < 0 or end < begin:
        raise SystemExit(f"{readme}: the lines {MARKERS[0]!r} and {MARKERS[1]!r} are "
                         "missing or out of order; put them around the summary table.")
    begin += len(MARKERS[0])
    readme.write_text(f"{content[:begin]}\n\n{text.strip()}\n\n{content[end:]}")


def earlier(only: list[str]) -> tuple[dict[str, float], dict[str, float | None]]:
    """Seconds and CPU steal of the benchmarks not run again (``--only``), from the last
    summary."""
    path = benchlib.RESULTS / "summary.json"
    if not only or not path.exists():
        return {}, {}
    last = json.loads(path.read_text())
    keep = [name for name in SCRIPTS if name not in only]
    return ({k: v for k, v in last.get("seconds", {}).items() if k in keep},
            {k: v for k, v in last.get("cpu_steal_percent", {}).items() if k in keep})


def steal_text(steal: dict[str, float | None]) -> str:
    """CPU steal by benchmark, and a warning where it was high enough to matter."""
    known = {k: v for k, v in steal.items() if k != "total" and v is not None}
    if not known:
        return "CPU steal not known"
    text = "CPU steal " + ", ".join(f"{k} {v:g}%" for k, v in known.items())
    high = [k for k, v in known.items() if v > STEAL_WARNING]
    if high:
        text += (f" (**{', '.join(high)}: the hypervisor gave that share of the CPUs to "
                 "other machines; those figures are low and not comparable**)")
    return text


#: Percent of CPU steal in one benchmark above which the summary says its figures are off.
STEAL_WARNING = 5.0


def summary(found: dict[str, Any]) -> str:
    peers = {r["peer"]: r for r in found.get("peers", {}).get("results", [])}
    rows: list[list[Any]] = []
    throughput = {r["db"]: r for r in found["throughput"]["results"]}
    postgres = throughput.get("postgres")
    # Rows as users load them (bulk_create(), save()) first; the precreated units of
    # throughput.py are a shortcut, shown after the tasks, never as the headline.
    rows += row_feed_rows(found.get("row_feeds"))
    shortcuts: list[list[Any]] = []
    for db, r in throughput.items():
        raw = r["raw"]["per_s"]
        rows.append([db, "raw SQL, 1 row per transaction, 2 processes (reference)",
                     f"{raw:,} jobs/s", f"{r['raw']['cpu_ms_per_job']} ms CPU/job", "", ""])
        for kind, label, target in (
            ("rows", "rows (transactional worker, no-op, units precreated: a shortcut), "
             "--concurrency 2", ">= 2,000 rows/s" if db == "postgres" else ""),
            ("tasks", "tasks (no-op), --concurrency 2",
             ">= 3,000 jobs/s and >= 50% of raw SQL" if db == "postgres" else ""),
        ):
            f = r[kind]
            compared = f"{f['vs_raw']:.0%} of raw SQL; {f['cpu_ms_per_job']} ms CPU/job"
            if db == "mariadb":
                target = MARIADB_TARGET
                if postgres:
                    compared += f"; {f['per_s'] / postgres[kind]['per_s']:.0%} of PostgreSQL"
            (shortcuts if kind == "rows" else rows).append(
                [db, label, f"{f['per_s']:,}/s (net {f['net_per_s']:,}/s)", compared,
                 vs_peers(f["per_s"], peers, PEER_COMPARISON[db], "drain"), target])
    rows += shortcuts
    for r in found["enqueue"]["results"]:
        rows.append([r["db"], f"enqueue_many of {r['tasks']:,} tasks",
                     f"{r['many_per_s']:,} tasks/s ({r['many_args_per_s']:,}/s with arguments)",
                     f"{r['ratio']}x per task vs enqueue() ({r['loop_per_s']:,}/s)", "",
                     ">= 50,000/s, >= 20x" if r["db"] == "postgres" else ""])
    for r in found["latency"]["results"]:
        wake = "LISTEN/NOTIFY" if r["listen_notify"] else (
            f"{r.get('wake_up', 'commit watching').split(' (')[0]}, "
            f"polling {r['poll_interval']:g}s")
        for kind in ("tasks", "rows"):
            c, f = latency_figures(r, kind)
            target = ("p50 <= Celery + Redis's, p99 <= 3x p50 (caller); p50 <= 3 ms, "
                      "p99 <= 20 ms (commit)" if r["db"] == "postgres" else "p50 <= 50 ms")
            what = ": from the caller (before enqueue()/create()); from the commit" if c else ""
            rows.append([r["db"], f"idle latency, {kind} ({wake}){what}",
                         (f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms; " if c else "")
                         + f"p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms", "",
                         vs_peers(c["p50_ms"], peers, PEER_COMPARISON[r["db"]], "latency")
                         if c else "", target])
        pss = f", {r['idle_pss_mb']} MB PSS" if "idle_pss_mb" in r else ""
        rows.append([r["db"], "idle supervisor + 2 children",
                     f"{r['idle_cpu_percent']}% CPU, {r['idle_rss_mb']} MB RSS{pss}", "", "",
                     "< 1% CPU, < 150 MB RSS"])
    for ratio in found["claim_cost"].get("ratios", []):
        rows.append([ratio["db"], f"claim cost, {ratio['worker']}, {ratio['limit']} unit(s): "
                     "1M vs 1k finished rows", f"{ratio['claim_ratio']}x (claim), "
                     f"{ratio['statement_ratio']}x (statement)", "", "", "<= 1.5x"])
    if "table_health" in found:
        rows += table_health_rows(found["table_health"])
    rows += flow_control_rows(found.get("flow_control"))
    rows += workflow_rows(found.get("workflows"))
    rows += peer_rows(peers, throughput)
    return benchlib.markdown_table(["db", "what", "figure", "compared", "vs peers (same run)",
                                    "target"], rows)


def latency_figures(r: dict[str, Any],
                    kind: str) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """Issue 24: a latency result's figures from the caller's side (None in results from
    before it) and from the commit (the only one before, under the kind's name)."""
    if "caller" in r:
        return r["caller"][kind], r["from_commit"][kind]
    return None, r[kind]


#: Issue 18: MariaDB drains rows and tasks at half PostgreSQL's rate of the same run or more.
MARIADB_TARGET = ">= 50% of PostgreSQL (same run)"


#: Issue 19: what each flow-control mechanism costs the drain, against plain tasks.
FLOW_KINDS = {
    "unique": ("tasks with a unique key each (@task(unique_key=...))", ">= 70% of plain"),
    "keyed": ("tasks over 50 concurrency keys, limit 2 (@task(concurrency_limit=...))",
              ">= 70% of plain"),
    "paused": ("plain tasks beside a paused queue holding 10,000 older ones",
               "~100% of plain"),
}


def flow_control_rows(flow: dict[str, Any] | None) -> list[list[Any]]:
    rows: list[list[Any]] = []
    for r in (flow or {}).get("results", []):
        plain = r["plain"]["per_s"]
        for kind, (label, target) in FLOW_KINDS.items():
            f = r[kind]
            rows.append([r["db"], f"flow control: {label}, --concurrency 2",
                         f"{f['per_s']:,}/s (net {f['net_per_s']:,}/s)",
                         f"{f['vs_plain']:.0%} of plain tasks ({plain:,}/s), net "
                         f"{f['net_vs_plain']:.0%}", "", target])
    return rows


def workflow_rows(workflows: dict[str, Any] | None) -> list[list[Any]]:
    """Issue 20: the fan-out/fan-in against independent tasks of the same run, and the
    task claim with finished workflows in history against none."""
    rows: list[list[Any]] = []
    for r in (workflows or {}).get("results", []):
        d = r.get("drain")
        if d:
            wf, ind = d["workflow"], d["independent"]
            net = wf["net_vs_independent"]
            rows.append([r["db"], f"workflow: fan-out/fan-in of {d['tasks']:,} (1 root, "
                         f"{d['tasks']:,} after it, 1 join), --concurrency 2",
                         f"{wf['per_s']:,}/s (net {wf['net_per_s'] or 0:,}/s)",
                         f"{wf['vs_independent']:.0%} of {d['tasks']:,} independent tasks "
                         f"({ind['per_s']:,}/s)" + (f", net {net:.0%}" if net else ""), "",
                         ">= 70% of independent"])
        c = r.get("claim")
        for row in (c or {}).get("rows", []):
            rows.append([r["db"], f"workflow: task claim of {row['limit']}, "
                         f"{c['history_workflows']:,} finished workflows vs none",
                         f"{row['ratio']}x", f"median {row['history']['median']} µs vs "
                         f"{row['none']['median']} µs", "", "<= 1.5x"])
    return rows


def row_feed_rows(feeds: dict[str, Any] | None) -> list[list[Any]]:
    """Rows as users write them (row_feeds.py): bulk-created, saved, and the precreated
    reference; MariaDB's next to PostgreSQL's of the same run."""
    if not feeds:
        return []
    rows = []
    by_db = {r["db"]: r for r in feeds["results"]}
    postgres = by_db.get("postgres", {})
    for db, r in by_db.items():
        for feed, label in (("bulk", "rows bulk_create()d (found by discovery)"),
                            ("save", "rows save()d one by one (post_save)"),
                            ("precreated", "rows precreated (shortcut, reference)")):
            f = r.get(feed)
            if not f:
                continue
            compared = [f"{f['cpu_ms_per_row']} ms CPU/row (ours)"]
            if f.get("server_cpu_ms_per_row") is not None:
                whose = " (all of mariadbd)" if db == "mariadb" else ""
                compared.append(f"server {f['server_cpu_ms_per_row']} ms CPU/row{whose}")
            target = ""
            if db == "mariadb" and feed != "precreated":
                target = MARIADB_TARGET
            if db == "mariadb" and postgres.get(feed):
                compared.append(f"{f['per_s'] / postgres[feed]['per_s']:.0%} of PostgreSQL")
            if db == "postgres" and feed == "bulk":
                target = ">= 2,000 rows/s, >= 90% of precreated"
            rows.append([db, f"{label}, worker feed, --concurrency 2",
                         f"{f['per_s']:,}/s (net {f['net_per_s'] or 0:,}/s)",
                         "; ".join(compared), "", target])
    return rows


def table_health_rows(health: dict[str, Any]) -> list[list[Any]]:
    """Table health: the claim after N jobs vs at 0 (time, buffers, index), dead tuples."""
    rows = []
    mode = health["config"]["autovacuum"]
    for kind, s in health.get("summary", {}).items():
        runs = (f"{s['emulated_vacuum_runs']} vacuums (autovacuum emulated)"
                if mode == "emulate" else f"{s['autovacuum_runs']} autovacuums")
        for name, c in s["claims"].items():
            index = ("claim index" if c["uses_claim_index_always"] and not c["seq_scan_ever"]
                     else "NOT the claim index / Seq Scan")
            rows.append(["postgres", f"table health, {kind}, claim ({name}): after "
                         f"{s['jobs']:,} jobs vs 0", f"{c['ratio']}x claim(); buffers "
                         f"{c['buffers_at_0']} -> {c['buffers_at_end']}; {index}",
                         f"dead tuples max {s['max_dead_ratio']:.0%}, final "
                         f"{s['final_dead_tuples']:,}; {runs}", "",
                         "claim uses its index; dead tuples kept in check"])
    return rows


# Which peers our figures on each database are compared with: the tools a user of that
# database would pick instead (on PostgreSQL: Celery with Redis and the PostgreSQL queues).
PEER_COMPARISON = {"postgres": ("celery", "procrastinate", "tasksdb", "djangoq2"),
                   "sqlite": ("huey",), "mariadb": ()}
PEER_STORE = {"redis": "redis", "postgres": "postgres", "sqlite": "sqlite"}


def vs_peers(ours: float, peers: dict[str, Any], names: tuple[str, ...], what: str) -> str:
    """``ours`` / the peers' figure measured in the same run: jobs/s (higher is better) or
    idle latency p50 from the caller's side (lower is better), e.g. "0.82x Celery + Redis"."""
    parts = []
    for name in names:
        peer = peers.get(name)
        if peer is None or peer["status"] != "ok" or not peer.get(what):
            continue
        theirs = (peer["drain"]["per_s"] if what == "drain"
                  else (peer["latency"].get("caller") or {}).get("p50_ms"))
        if theirs:
            ratio = ours / theirs
            parts.append(f"{ratio:.2f}x {peer['label']}" if ratio >= 0.1
                         else f"{ratio:.2g}x {peer['label']}")
    if not parts:
        return ""
    return ("jobs/s: " if what == "drain" else "p50: ") + ", ".join(parts)


def peer_rows(peers: dict[str, Any], throughput: dict[str, Any]) -> list[list[Any]]:
    """One row per peer: its drain (next to the raw SQL of its kind of database, same run)
    and its idle latency; or why it could not run."""
    rows = []
    for peer in peers.values():
        db = PEER_STORE.get(peer["needs"], peer["needs"])
        if peer["status"] != "ok":
            rows.append([db, f"peer: {peer['label']}", "failed", peer["error"][:160]
                         .replace("|", "/"), "", ""])
            continue
        package, version = list(peer["versions"].items())[1]  # after "python"
        d, lat = peer["drain"], peer["latency"]
        raw = throughput.get("sqlite" if db == "sqlite" else "postgres", {}).get("raw", {})
        compared = ""
        if raw.get("per_s"):
            kind = "SQLite" if db == "sqlite" else "PostgreSQL"
            compared = f"{d['per_s'] / raw['per_s']:.0%} of {kind} raw SQL; "
        compared += f"{d['cpu_ms_per_job']} ms CPU/job"
        rows.append([db, f"peer: {peer['label']} ({package} {version}), {peer['shape']}",
                     f"{d['per_s']:,}/s (net {d['net_per_s'] or 0:,}/s)", compared, "", ""])
        if lat:
            c, f = lat.get("caller"), lat.get("from_commit", lat)
            what = ": from the caller; from the commit" if c else ""
            rows.append([db, f"peer: {peer['label']}, idle latency{what}",
                         (f"p50 {c['p50_ms']} ms, p99 {c['p99_ms']} ms; " if c else "")
                         + f"p50 {f['p50_ms']} ms, p99 {f['p99_ms']} ms", "", "", ""])
    return rows


if __name__ == "__main__":
    main()
