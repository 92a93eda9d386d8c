"""Table health: after 1,000,000 jobs, does the claim still use its index, and are dead
tuples kept in check? (PostgreSQL only.)

    .venv/bin/python bench/table_health.py [--jobs 1000000] [--kind tasks,rows]
                                           [--autovacuum auto|server|emulate|none]
                                           [--naptime SECONDS]

In a database of its own (``dbworker_bench_<pid>_health``, created and dropped), migrated
with the package's migrations (0004 sets ``fillfactor`` and autovacuum storage parameters
on ``django_dbworker_execution`` and ``django_dbworker_taskrecord``), ``--jobs`` jobs of
each kind go through the real code paths, the two kinds interleaved batch by batch as on a
live system that runs both:

- tasks: ``benchapp.tasks.noop.enqueue_many`` in batches of ``--enqueue-batch`` (10,000),
  ``taskplanner.claim(None, --claim-batch, ...)`` (all queues, as a ``runworkers`` without
  ``--queue``), then ``taskstore.succeed`` for each claimed task;
- rows: ``benchapp.Job`` rows and their PENDING executions of the ``noop`` worker inserted
  in bulk (``INSERT ... SELECT``, as claim_cost.py and throughput.py load them), in batches
  of ``--enqueue-batch``; ``planner.claim(noop, --claim-batch, ...)``; then
  ``store.complete(claim, Finished())`` for each claimed unit.

Completion: ``succeed()`` / ``complete()`` are called for every job, but under a
``connection.execute_wrapper`` that keeps their statement and parameters instead of
sending them; the kept statements (exactly what those functions send: the RUNNING ->
SUCCESSFUL / WORKING -> FINISHED update fenced by id, token, state and lease) are then sent
with one ``cursor.executemany`` per claim batch, in one transaction. That saves a round
trip and a commit per job, so that 2,000,000 jobs fit in a few minutes on 2 CPUs; every job
still leaves the same row versions and index entries as in production (one insert, the
claim's update, the completion's update).

The waiting queue is topped up by ``--enqueue-batch`` whenever fewer than ``--waiting``
(10,000) jobs of a kind wait, so 10,000-20,000 wait at any time, not 1,000,000 at once;
every sample, and the end, sees exactly ``--waiting`` waiting (``--jobs`` + ``--waiting``
are enqueued; the last ``--waiting`` stay for the final measurement).

Every ``--sample-every`` (100,000) jobs of each kind, and at 0: ``pg_stat_user_tables``
(live and dead tuples, updates and HOT updates, vacuum and analyze counts), table and index
sizes (each index, the claim indexes by name), the claim's plan (``EXPLAIN (ANALYZE,
BUFFERS, FORMAT JSON)`` of the statement the claim function sends, captured with an
``execute_wrapper``: the indexes it reads, whether anything is read by a Seq Scan, shared
buffers touched) and the median of 20 timed ``claim()`` calls of 10 jobs (each given back
with ``unclaim()``, not timed; tasks: all queues and the one queue ``default``). Dead tuples
are also read every ``--claim-batch`` * 20 jobs, for the largest dead-tuple ratio seen.

Autovacuum. The storage parameters of migration 0004 only matter if autovacuum runs. With
``--autovacuum server`` the server's autovacuum does the work (its runs are counted in
``autovacuum_count``). A shared server may run with ``autovacuum = off`` (the one these
figures come from does), and server settings are not ours to change; ``--autovacuum
emulate`` then runs autovacuum's own decision in a thread of this script: every
``--naptime`` seconds (default: the server's ``autovacuum_naptime``) it looks at every table
of the database like autovacuum does (PostgreSQL 15, ``relation_needs_vacanalyze``: dead
tuples > ``autovacuum_vacuum_threshold`` + ``autovacuum_vacuum_scale_factor`` x reltuples,
inserts since the last vacuum > the insert threshold + insert scale factor x reltuples,
changes since the last analyze > the analyze threshold + scale factor x reltuples; each
from the table's reloptions, else the server's settings) and runs ``VACUUM``, ``ANALYZE``
or ``VACUUM (ANALYZE)`` with autovacuum's cost-based delay (``vacuum_cost_delay`` =
``autovacuum_vacuum_cost_delay``, ``vacuum_cost_limit``), one table after the other, as
one autovacuum worker would. Those runs are counted in ``vacuum_count`` and listed in the
JSON. ``auto`` (the default) picks ``server`` when ``SHOW autovacuum`` says on, else
``emulate``. ``none``: no vacuum at all, to see what a table without autovacuum becomes.

Writes bench/results/table_health.json (machine, server settings, the tables' reloptions,
configuration, every sample, the dead-tuple trace, the vacuum runs, the final plans in
text, the load average) and prints Markdown tables.

Cost: ``--jobs 500000`` (1,000,000 jobs in all) took 20 minutes on 2 CPUs shared with other
benchmarks (load average 4-9; 830 jobs/s, most of it in the completions), so the default
(2,000,000 jobs in all) takes about 40 minutes there; ``run_all.py`` passes ``--jobs
50000`` (about 2 minutes at that rate, less on an idle machine).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import benchlib

TASK = "benchapp.tasks.noop"
WORKER = "noop"
KINDS = ("tasks", "rows")
TASK_TABLE = "django_dbworker_taskrecord"
TABLES = {"tasks": TASK_TABLE, "rows": benchlib.EXECUTION_TABLE}
CLAIM_INDEXES = {"tasks": "dbworker_task_claimable", "rows": "dbworker_execution_claimable"}
#: Every index a claim may walk: a task claim of one queue or of every queue may read either
#: partial index of claimable tasks (migration 0005 added the second, ordered for claims of
#: every queue; the planner picks whichever is cheaper for the queues asked).
CLAIM_PATH = {"tasks": {"dbworker_task_claimable", "dbworker_task_claimable_any"},
              "rows": {"dbworker_execution_claimable"}}
LEASE = 600.0  # longer than any batch takes between its claim and its completion
TIMED_CLAIMS = 20
TIMED_LIMIT = 10
SERVER_SETTINGS = (
    "server_version", "autovacuum", "autovacuum_naptime", "autovacuum_max_workers",
    "autovacuum_vacuum_threshold", "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_insert_threshold", "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_analyze_threshold", "autovacuum_analyze_scale_factor",
    "autovacuum_vacuum_cost_delay", "autovacuum_vacuum_cost_limit", "vacuum_cost_limit",
    "shared_buffers", "maintenance_work_mem", "synchronous_commit", "fsync",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000,
                        help="jobs of each kind through the system (default 1,000,000)")
    parser.add_argument("--kind", default=",".join(KINDS),
                        help="comma-separated: tasks, rows (default: both, interleaved)")
    parser.add_argument("--enqueue-batch", type=int, default=10_000)
    parser.add_argument("--claim-batch", type=int, default=500)
    parser.add_argument("--waiting", type=int, default=10_000,
                        help="top the queue up when fewer than this wait (default 10,000)")
    parser.add_argument("--sample-every", type=int, default=100_000)
    parser.add_argument("--autovacuum", choices=("auto", "server", "emulate", "none"),
                        default="auto")
    parser.add_argument("--naptime", type=float, default=None,
                        help="seconds between emulated autovacuum rounds (default: the "
                        "server's autovacuum_naptime)")
    args = parser.parse_args()
    args.kinds = [k for k in args.kind.split(",") if k]
    if not args.kinds or set(args.kinds) - set(KINDS):
        parser.error(f"--kind: choose among {', '.join(KINDS)}")
    if args.jobs % args.claim_batch or args.sample_every % args.claim_batch:
        parser.error("--jobs and --sample-every must be multiples of --claim-batch")

    started = time.monotonic()
    loads = {"start": [round(x, 2) for x in os.getloadavg()]}
    with benchlib.scratch_database("postgres", "health") as name:
        benchlib.setup_django("postgres", name)
        server = server_settings()
        if args.autovacuum == "auto":
            args.autovacuum = "server" if server["autovacuum"] == "on" else "emulate"
        if args.naptime is None:
            args.naptime = setting_seconds(server["autovacuum_naptime"])
        result = run(name, args, server)
    loads["end"] = [round(x, 2) for x in os.getloadavg()]
    result["loadavg_1m_5m_15m"] = loads
    result["seconds"]["total"] = round(time.monotonic() - started, 1)
    path = benchlib.write_results("table_health.json", result)
    print(report(result))
    print(f"\nwritten: {path.relative_to(benchlib.ROOT)}")


# ----- the run ----------------------------------------------------------------------------


def run(name: str, args: argparse.Namespace, server: dict[str, str]) -> dict[str, Any]:
    from django_dbworker.units.claimant import Claimant

    claimant = Claimant(pid=os.getpid())
    kinds = {kind: (Tasks if kind == "tasks" else Rows)(args, claimant) for kind in args.kinds}
    vacuum = Autovacuum(name, args.naptime, server) if args.autovacuum == "emulate" else None
    samples: list[dict[str, Any]] = []
    trace: list[dict[str, Any]] = []
    seconds = {"enqueue": 0.0, "claim": 0.0, "complete": 0.0, "samples": 0.0}
    begun = time.monotonic()
    done = 0
    next_sample = 0
    if vacuum is not None:
        vacuum.start(lambda: done)
    try:
        while True:
            for k in kinds.values():
                t = time.monotonic()
                k.top_up()
                seconds["enqueue"] += time.monotonic() - t
            if done >= next_sample:
                t = time.monotonic()
                samples.append(sample(kinds, done, begun))
                seconds["samples"] += time.monotonic() - t
                print(progress(samples[-1]), file=sys.stderr, flush=True)
                next_sample += args.sample_every
            if done >= args.jobs:
                break
            for k in kinds.values():
                t = time.monotonic()
                claims = k.claim(args.claim_batch)
                seconds["claim"] += time.monotonic() - t
                t = time.monotonic()
                k.complete(claims)
                seconds["complete"] += time.monotonic() - t
            done += args.claim_batch
            if done % (args.claim_batch * 20) == 0:
                trace.append({"jobs": done, "s": round(time.monotonic() - begun, 1),
                              **dead_tuples(list(kinds))})
    finally:
        if vacuum is not None:
            vacuum.stop()
    run_seconds = time.monotonic() - begun
    plans = {kind: k.final_plans() for kind, k in kinds.items()}
    return {
        "benchmark": "table_health",
        "machine": benchlib.machine(),
        "server_settings": server,
        "reloptions": reloptions(),
        "config": {
            "jobs_per_kind": args.jobs, "kinds": args.kinds,
            "enqueue_batch": args.enqueue_batch, "claim_batch": args.claim_batch,
            "waiting_at_least": args.waiting, "sample_every": args.sample_every,
            "autovacuum": args.autovacuum,
            "emulated_naptime_s": args.naptime if args.autovacuum == "emulate" else None,
            "timed_claims": f"{TIMED_CLAIMS} claim() calls of {TIMED_LIMIT}, each given back "
                            "with unclaim() (not timed); median",
            "task": TASK, "worker": WORKER, "lease_s": LEASE,
            "completion": "succeed()/complete() called per job; their statements sent "
                          "with one executemany per claim batch, in one transaction",
        },
        "seconds": {"run": round(run_seconds, 1),
                    **{k: round(v, 1) for k, v in seconds.items()}},
        "jobs_per_s": round(args.jobs * len(kinds) / run_seconds),
        "samples": samples,
        "dead_tuple_trace": trace,
        "vacuum_runs": vacuum.runs if vacuum is not None else [],
        "final_plans": plans,
        "summary": summarise(samples, trace, list(kinds), vacuum),
    }


class Kind:
    """One kind of job: how to enqueue, claim and complete it, and its claim statements."""

    label = ""
    table = ""

    def __init__(self, args: argparse.Namespace, claimant: Any) -> None:
        self.args = args
        self.claimant = claimant
        self.enqueued = 0
        self.claimed = 0

    def top_up(self) -> None:
        while self.enqueued - self.claimed < self.args.waiting:
            self.enqueue(self.args.enqueue_batch)
            self.enqueued += self.args.enqueue_batch

    def claim(self, limit: int) -> list[Any]:
        claims = self._claim(limit, None)
        if len(claims) != limit:
            raise RuntimeError(f"{self.label}: claimed {len(claims)}, not {limit}")
        self.claimed += limit
        return claims

    def complete(self, claims: list[Any]) -> None:
        """Call the completion for each claim, keep the statements it sends, then send them
        all with one executemany (one transaction)."""
        import psycopg
        from django.db import connection, transaction

        kept = Keep()
        with connection.execute_wrapper(kept):
            for c in claims:
                self._complete(c)
        by_sql: dict[str, list[Any]] = {}
        asynchronous = False
        for sql, params in kept.statements:
            sql, prefixed = statement_only(sql)
            asynchronous |= prefixed
            by_sql.setdefault(sql, []).append(params)
        changed = 0
        with transaction.atomic(), connection.cursor() as cursor:
            if asynchronous:  # what the prefix did for each statement, once for the batch
                cursor.execute(ASYNC_COMMIT)
            # The same statement text, but bound and prepared on the server (planned once
            # per batch, not once per job as Django's client-side binding would).
            with psycopg.Cursor(connection.connection) as prepared:
                for sql, many in by_sql.items():
                    prepared.executemany(sql, many)
                    changed += prepared.rowcount
        if changed != len(claims):
            raise RuntimeError(f"{self.label}: completed {changed} of {len(claims)}")

    def variants(self) -> dict[str, Any]:
        """The claims timed and explained at each sample: {name: queues or worker}."""
        raise NotImplementedError

    def timed(self, variant: Any) -> dict[str, Any]:
        samples = []
        for i in range(TIMED_CLAIMS + 2):
            t = time.perf_counter_ns()
            claims = self._claim(TIMED_LIMIT, variant)
            elapsed = time.perf_counter_ns() - t
            if len(claims) != TIMED_LIMIT:
                raise RuntimeError(f"{self.label}: claimed {len(claims)}, not {TIMED_LIMIT}")
            self._unclaim(claims)
            if i >= 2:  # two warm-up claims
                samples.append(elapsed)
        return {"median_us": round(statistics.median(samples) / 1000, 1),
                "p90_us": round(statistics.quantiles(samples, n=10)[-1] / 1000, 1)}

    def statement(self, variant: Any, limit: int = TIMED_LIMIT) -> tuple[str, Any]:
        """The SQL and parameters the claim function sends (the claim rolled back)."""
        from django.db import connection, transaction

        seen = Seen()
        with transaction.atomic(), connection.execute_wrapper(seen):
            self._claim(limit, variant)
            transaction.set_rollback(True)
        for sql, params in seen.statements:
            sql = statement_only(sql)[0]
            # UPDATE ... RETURNING, or WITH picked AS MATERIALIZED (...) UPDATE ... (the
            # tasks' claim since the engines moved into db/)
            head = sql.lstrip().upper()
            if head.startswith("UPDATE") or (head.startswith("WITH") and " UPDATE " in head):
                return sql, params
        raise RuntimeError(f"{self.label}: no claim statement among {seen.statements}")

    def explain(self, variant: Any, fmt: str = "JSON") -> Any:
        """EXPLAIN (ANALYZE, BUFFERS) of the claim statement, in a transaction rolled back."""
        from django.db import connection, transaction

        sql, params = self.statement(variant)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT {fmt}) {sql}", params)
            rows = cursor.fetchall()
            transaction.set_rollback(True)
        if fmt == "TEXT":
            return "\n".join(row[0] for row in rows)
        document = rows[0][0]
        return plan_facts((json.loads(document) if isinstance(document, str) else document)[0],
                          CLAIM_PATH[self.label])

    def explain_completion(self) -> dict[str, Any]:
        """EXPLAIN (ANALYZE, BUFFERS) of the completion of one claimed job (rolled back;
        the job is then given back): it should find the row by its primary key."""
        from django.db import connection, transaction

        claims = self._claim(1, None)
        kept = Keep()
        with connection.execute_wrapper(kept):
            self._complete(claims[0])
        sql, params = statement_only(kept.statements[0][0])[0], kept.statements[0][1]
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", params)
            document = cursor.fetchone()[0]
            transaction.set_rollback(True)
        self._unclaim(claims)
        pkey = f"{self.table}_pkey"
        facts = plan_facts((json.loads(document) if isinstance(document, str)
                            else document)[0], pkey)
        return {"uses_pkey": facts.pop("uses_claim_index"), **facts}

    def final_plans(self) -> dict[str, Any]:
        return {name: {"text": self.explain(variant, "TEXT"), **self.explain(variant)}
                for name, variant in self.variants().items()}

    def enqueue(self, count: int) -> None:
        raise NotImplementedError

    def _claim(self, limit: int, variant: Any) -> list[Any]:
        raise NotImplementedError

    def _complete(self, c: Any) -> None:
        raise NotImplementedError

    def _unclaim(self, claims: list[Any]) -> None:
        raise NotImplementedError


class Tasks(Kind):
    label = "tasks"
    table = TASK_TABLE

    def enqueue(self, count: int) -> None:
        from django.utils.module_loading import import_string

        import_string(TASK).enqueue_many([((), {})] * count)

    def variants(self) -> dict[str, Any]:
        return {"all queues": None, "queue default": ["default"]}

    def _claim(self, limit: int, variant: Any) -> list[Any]:
        from django_dbworker.tasks import planner as taskplanner

        return taskplanner.claim(variant, limit, self.claimant, LEASE)

    def _complete(self, c: Any) -> None:
        from django_dbworker.tasks import store as taskstore

        taskstore.succeed(c, None)

    def _unclaim(self, claims: list[Any]) -> None:
        from django_dbworker.tasks import store as taskstore

        taskstore.unclaim(claims)


class Rows(Kind):
    label = "rows"
    table = benchlib.EXECUTION_TABLE

    def __init__(self, args: argparse.Namespace, claimant: Any) -> None:
        super().__init__(args, claimant)
        from django_dbworker.rows.registry import workers

        self.worker = workers[WORKER]

    def enqueue(self, count: int) -> None:
        """``count`` new Job rows and their PENDING executions, in one transaction."""
        from django.db import connection, transaction
        from django.utils import timezone

        first, last = self.enqueued + 1, self.enqueued + count
        now = timezone.now()
        waiting = {"state": "PENDING", "attempts": 0, "available_at": now, "created_at": now,
                   "worker": WORKER}
        columns, expressions, params = benchlib.execution_select(connection, waiting)
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(
                f"INSERT INTO {benchlib.JOB_TABLE} (id, payload) SELECT i, 'payload ' || i "
                "FROM generate_series(%s, %s) i", [first, last])
            cursor.execute(
                f"INSERT INTO {benchlib.EXECUTION_TABLE} ({', '.join(columns)}) "
                f"SELECT {', '.join(expressions)} FROM {benchlib.JOB_TABLE} "
                f"WHERE id BETWEEN %s AND %s ORDER BY {benchlib.JOB_TABLE}.id",
                [*params, first, last])

    def variants(self) -> dict[str, Any]:
        return {f"worker {WORKER}": self.worker}

    def _claim(self, limit: int, variant: Any) -> list[Any]:
        from django_dbworker.rows import planner

        return planner.claim(self.worker, limit, self.claimant, LEASE)

    def _complete(self, c: Any) -> None:
        from django_dbworker.outcomes import Finished
        from django_dbworker.rows import store

        store.complete(c, Finished())

    def _unclaim(self, claims: list[Any]) -> None:
        from django_dbworker.rows import store

        store.unclaim(claims)


#: What ``Engine.execute_status`` puts before a claim or a completion with DBWORKER
#: ["ASYNC_COMMIT"] (one query, two statements): kept apart here, to EXPLAIN the statement
#: and to send it with executemany.
ASYNC_COMMIT = "SET LOCAL synchronous_commit = off"


def statement_only(sql: str) -> tuple[str, bool]:
    """``sql`` without the ``ASYNC_COMMIT`` prefix (or ``db.postgresql.STATUS_ONLY``, its
    variant for a row's completion: the same in a transaction that wrote nothing before); whether it
    had one."""
    from django_dbworker.db.postgresql import STATUS_ONLY

    for prefix in (ASYNC_COMMIT + "; ", STATUS_ONLY):
        if sql.startswith(prefix):
            return sql[len(prefix):], True
    return sql, False


class Keep:
    """An execute_wrapper that keeps each statement instead of sending it (an empty result
    goes in its place, for each statement of the query, so the caller can fetch)."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: Any) -> Any:
        if many:
            raise RuntimeError("the completion sent an executemany of its own")
        self.statements.append((sql, params))
        empty = "SELECT 1 WHERE false"
        return execute("; ".join([empty] * (1 + statement_only(sql)[1])), None, False,
                       context)


class Seen:
    """An execute_wrapper that notes each statement and sends it."""

    def __init__(self) -> None:
        self.statements: list[tuple[str, Any]] = []

    def __call__(self, execute: Callable[..., Any], sql: str, params: Any, many: bool,
                 context: Any) -> Any:
        self.statements.append((sql, params))
        return execute(sql, params, many, context)


def plan_facts(plan: dict[str, Any], claim_index: str | set[str]) -> dict[str, Any]:
    """From an EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) document: the scans, the indexes they
    read, whether the claim index (one of them, for a set) is among them and nothing is
    read by a Seq Scan, and the shared buffers the statement touched."""
    wanted = {claim_index} if isinstance(claim_index, str) else claim_index
    nodes: list[str] = []
    indexes: list[str] = []
    seq_scans: list[str] = []

    def walk(node: dict[str, Any]) -> None:
        nodes.append(node["Node Type"])
        if "Index Name" in node:
            indexes.append(node["Index Name"])
        if node["Node Type"] == "Seq Scan":
            seq_scans.append(node.get("Relation Name", "?"))
        for child in node.get("Plans", []):
            walk(child)

    top = plan["Plan"]
    walk(top)
    return {
        "uses_claim_index": bool(wanted & set(indexes)),
        "seq_scans": seq_scans,
        "indexes": sorted(set(indexes)),
        "nodes": nodes,
        "shared_buffers": int(top.get("Shared Hit Blocks", 0) + top.get("Shared Read Blocks", 0)),
        "execution_ms": plan.get("Execution Time"),
    }


# ----- what a sample reads ----------------------------------------------------------------


def query(sql: str, params: Any = None) -> list[dict[str, Any]]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        names = [c.name for c in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def flush_stats() -> None:
    """Make this backend's pending statistics visible before reading pg_stat_*."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")  # the flush happens at the end of a transaction


def table_stats(table: str) -> dict[str, Any]:
    (row,) = query(
        "SELECT n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, "
        "n_ins_since_vacuum, n_mod_since_analyze, vacuum_count, autovacuum_count, "
        "analyze_count, autoanalyze_count, last_vacuum, last_autovacuum, seq_scan, idx_scan "
        "FROM pg_stat_user_tables WHERE relname = %s", [table])
    for key in ("last_vacuum", "last_autovacuum"):
        row[key] = row[key].isoformat(timespec="seconds") if row[key] else None
    live, dead = row["n_live_tup"], row["n_dead_tup"]
    row["dead_ratio"] = round(dead / (live + dead), 4) if live + dead else 0.0
    (size,) = query("SELECT pg_relation_size(%s) AS heap, pg_indexes_size(%s) AS indexes, "
                    "pg_total_relation_size(%s) AS total", [table, table, table])
    row["bytes"] = size
    row["indexes"] = {
        r["indexrelname"]: {"bytes": r["bytes"], "idx_scan": r["idx_scan"]}
        for r in query("SELECT indexrelname, pg_relation_size(indexrelid) AS bytes, idx_scan "
                       "FROM pg_stat_user_indexes WHERE relname = %s ORDER BY indexrelname",
                       [table])
    }
    return row


def dead_tuples(kinds: list[str]) -> dict[str, Any]:
    flush_stats()
    found = {}
    for r in query("SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables "
                   "WHERE relname = ANY(%s)", [[TABLES[k] for k in kinds]]):
        kind = next(k for k in kinds if TABLES[k] == r["relname"])
        total = r["n_live_tup"] + r["n_dead_tup"]
        found[kind] = {"live": r["n_live_tup"], "dead": r["n_dead_tup"],
                       "dead_ratio": round(r["n_dead_tup"] / total, 4) if total else 0.0}
    return found


def sample(kinds: dict[str, Kind], done: int, begun: float) -> dict[str, Any]:
    flush_stats()
    found: dict[str, Any] = {"jobs": done, "s": round(time.monotonic() - begun, 1),
                             "loadavg_1m": round(os.getloadavg()[0], 2)}
    for kind, k in kinds.items():
        stats = table_stats(k.table)
        stats["waiting"] = k.enqueued - k.claimed
        stats["claim"] = {}
        for name, variant in k.variants().items():
            stats["claim"][name] = {**k.timed(variant), **k.explain(variant)}
        stats["completion"] = k.explain_completion()
        found[kind] = stats
    return found


def progress(s: dict[str, Any]) -> str:
    parts = [f"{s['jobs']:>9,} jobs, {s['s']:6.1f}s, load {s['loadavg_1m']}"]
    for kind in KINDS:
        if kind in s:
            t = s[kind]
            claims = ", ".join(f"{c['median_us']}µs/{c['shared_buffers']}buf"
                               for c in t["claim"].values())
            parts.append(f"{kind}: dead {t['n_dead_tup']:,} ({t['dead_ratio']:.1%}), "
                         f"vacuums {t['vacuum_count'] + t['autovacuum_count']}, "
                         f"heap {mb(t['bytes']['heap'])} MB, claim {claims}")
    return " | ".join(parts)


def server_settings() -> dict[str, str]:
    found = {}
    for name in SERVER_SETTINGS:
        (row,) = query(f"SHOW {name}")
        found[name] = str(next(iter(row.values())))
    return found


def reloptions() -> dict[str, list[str] | None]:
    return {r["relname"]: r["reloptions"] for r in query(
        "SELECT relname, reloptions FROM pg_class WHERE relname = ANY(%s) ORDER BY relname",
        [list(TABLES.values())])}


def setting_seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86400}
    for unit in sorted(units, key=len, reverse=True):
        if value.endswith(unit):
            return float(value[: -len(unit)]) * units[unit]
    return float(value)


def mb(n: int) -> float:
    return round(n / 1024 / 1024, 1)


# ----- autovacuum, emulated ---------------------------------------------------------------


class Autovacuum:
    """What an autovacuum worker would do in this database, every ``naptime`` seconds.

    Its own connection; VACUUM runs on the server, so the thread holds the GIL only to
    decide. Thresholds as PostgreSQL 15 computes them (``relation_needs_vacanalyze``), from
    each table's reloptions or else the server's settings; reltuples of a table never
    vacuumed or analysed count as 0.
    """

    def __init__(self, name: str, naptime: float, server: dict[str, str]) -> None:
        self.name = name
        self.naptime = naptime
        self.server = server
        self.runs: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, jobs: Callable[[], int]) -> None:
        self._jobs = jobs
        self._began = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="autovacuum", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _loop(self) -> None:
        import psycopg

        delay = self.server["autovacuum_vacuum_cost_delay"]
        limit = self.server["autovacuum_vacuum_cost_limit"]
        if limit == "-1":
            limit = self.server["vacuum_cost_limit"]
        with psycopg.connect(dbname=self.name, autocommit=True,
                             **benchlib.pg_connect_kwargs()) as c:
            c.execute(f"SET vacuum_cost_delay = '{delay}'")
            c.execute(f"SET vacuum_cost_limit = {int(limit)}")
            while not self._stop.wait(self.naptime):
                for table, what, why in self._needed(c):
                    if self._stop.is_set():
                        break
                    t = time.monotonic()
                    jobs = self._jobs()
                    command = {"vacuum": "VACUUM", "analyze": "ANALYZE",
                               "both": "VACUUM (ANALYZE)"}[what]
                    c.execute(f'{command} "{table}"')
                    self.runs.append({
                        "table": table, "what": command, "why": why, "at_jobs": jobs,
                        "at_s": round(t - self._began, 1),
                        "seconds": round(time.monotonic() - t, 2),
                    })

    def _needed(self, c: Any) -> list[tuple[str, str, dict[str, Any]]]:
        c.execute("SELECT pg_stat_clear_snapshot()")
        rows = c.execute(
            "SELECT s.relname, c.reltuples, c.reloptions, s.n_dead_tup, s.n_ins_since_vacuum, "
            "s.n_mod_since_analyze FROM pg_stat_user_tables s "
            "JOIN pg_class c ON c.oid = s.relid ORDER BY s.relname").fetchall()
        needed = []
        for table, reltuples, options, dead, inserted, modified in rows:
            opts = dict(o.split("=", 1) for o in options or [])
            if opts.get("autovacuum_enabled", "true") in ("false", "off"):
                continue

            def setting(name: str, opts: dict[str, str] = opts) -> float:
                return float(opts.get(name, self.server.get(name, "0")))

            tuples = max(float(reltuples), 0.0)
            vac = setting("autovacuum_vacuum_threshold") + \
                setting("autovacuum_vacuum_scale_factor") * tuples
            ins = setting("autovacuum_vacuum_insert_threshold") + \
                setting("autovacuum_vacuum_insert_scale_factor") * tuples
            anl = setting("autovacuum_analyze_threshold") + \
                setting("autovacuum_analyze_scale_factor") * tuples
            vacuum = dead > vac or (ins >= 0 and inserted > ins)
            analyze = modified > anl
            if vacuum or analyze:
                why = {"n_dead_tup": dead, "vacuum_threshold": round(vac),
                       "n_ins_since_vacuum": inserted, "insert_threshold": round(ins),
                       "n_mod_since_analyze": modified, "analyze_threshold": round(anl),
                       "reltuples": round(tuples)}
                needed.append((table, "both" if vacuum and analyze else
                               "vacuum" if vacuum else "analyze", why))
        return needed


# ----- the summary and the report -------------------------------------------------------


def summarise(samples: list[dict[str, Any]], trace: list[dict[str, Any]], kinds: list[str],
              vacuum: Autovacuum | None) -> dict[str, Any]:
    first, last = samples[0], samples[-1]
    found: dict[str, Any] = {}
    for kind in kinds:
        ratios = [s[kind]["dead_ratio"] for s in samples] + [t[kind]["dead_ratio"]
                                                            for t in trace]
        a, b = first[kind], last[kind]
        claims = {}
        for name in a["claim"]:
            c0, c1 = a["claim"][name], b["claim"][name]
            claims[name] = {
                "claim_us_at_0": c0["median_us"], "claim_us_at_end": c1["median_us"],
                "ratio": round(c1["median_us"] / c0["median_us"], 2),
                "buffers_at_0": c0["shared_buffers"], "buffers_at_end": c1["shared_buffers"],
                "uses_claim_index_always": all(s[kind]["claim"][name]["uses_claim_index"]
                                               for s in samples),
                "seq_scan_ever": any(s[kind]["claim"][name]["seq_scans"] for s in samples),
            }
        table = TABLES[kind]
        completions = [s[kind]["completion"] for s in samples]
        found[kind] = {
            "completion_by_pkey_always": all(c["uses_pkey"] for c in completions),
            "completion_indexes_seen": sorted({i for c in completions for i in c["indexes"]}),
            "table": table,
            "jobs": last["jobs"],
            "max_dead_ratio": max(ratios),
            "final_dead_tuples": b["n_dead_tup"], "final_live_tuples": b["n_live_tup"],
            "final_dead_ratio": b["dead_ratio"],
            "autovacuum_runs": b["autovacuum_count"],
            "emulated_vacuum_runs": sum(1 for r in (vacuum.runs if vacuum else [])
                                        if r["table"] == table and "VACUUM" in r["what"]),
            "hot_update_share": round(b["n_tup_hot_upd"] / b["n_tup_upd"], 3)
            if b["n_tup_upd"] else None,
            "heap_mb": [mb(a["bytes"]["heap"]), mb(b["bytes"]["heap"])],
            "indexes_mb": [mb(a["bytes"]["indexes"]), mb(b["bytes"]["indexes"])],
            "claim_index_kb": [a["indexes"][CLAIM_INDEXES[kind]]["bytes"] // 1024,
                               b["indexes"][CLAIM_INDEXES[kind]]["bytes"] // 1024],
            "index_mb_at_end": {name: mb(i["bytes"]) for name, i in b["indexes"].items()},
            "claims": claims,
        }
    return found


def report(result: dict[str, Any]) -> str:
    parts = []
    kinds = result["config"]["kinds"]
    for kind in kinds:
        headers = ["jobs", "s", "live", "dead", "dead %", "vacuums", "heap MB", "indexes MB",
                   "claim index kB"]
        names = list(result["samples"][0][kind]["claim"])
        headers += [f"claim() µs, {n} (buffers)" for n in names]
        rows = []
        for s in result["samples"]:
            t = s[kind]
            rows.append([
                f"{s['jobs']:,}", s["s"], f"{t['n_live_tup']:,}", f"{t['n_dead_tup']:,}",
                f"{t['dead_ratio']:.1%}", t["vacuum_count"] + t["autovacuum_count"],
                mb(t["bytes"]["heap"]), mb(t["bytes"]["indexes"]),
                t["indexes"][CLAIM_INDEXES[kind]]["bytes"] // 1024,
                *[f"{t['claim'][n]['median_us']} ({t['claim'][n]['shared_buffers']})"
                  + ("" if t["claim"][n]["uses_claim_index"] and not t["claim"][n]["seq_scans"]
                     else " NO INDEX")
                  for n in names],
            ])
        parts.append(f"### {kind} ({TABLES[kind]})\n\n"
                     + benchlib.markdown_table(headers, rows))
    headers = ["kind", "claim", "claim() at 0 / at end", "ratio", "buffers 0 / end",
               "claim index, no Seq Scan", "max dead %", "final dead", "vacuum runs",
               "HOT updates", "completion reads"]
    rows = []
    mode = result["config"]["autovacuum"]
    for kind in kinds:
        s = result["summary"][kind]
        runs = (f"{s['emulated_vacuum_runs']} (emulated)" if mode == "emulate"
                else str(s["autovacuum_runs"]))
        for name, c in s["claims"].items():
            rows.append([kind, name, f"{c['claim_us_at_0']} / {c['claim_us_at_end']} µs",
                         f"{c['ratio']}x", f"{c['buffers_at_0']} / {c['buffers_at_end']}",
                         "yes" if c["uses_claim_index_always"] and not c["seq_scan_ever"]
                         else "NO", f"{s['max_dead_ratio']:.1%}",
                         f"{s['final_dead_tuples']:,}", runs,
                         f"{s['hot_update_share']:.0%}" if s["hot_update_share"] is not None
                         else "-", ", ".join(s["completion_indexes_seen"])])
    server = result["server_settings"]
    header = (f"{result['config']['jobs_per_kind']:,} jobs of each kind in "
              f"{result['seconds']['run']} s ({result['jobs_per_s']:,} jobs/s); PostgreSQL "
              f"{server['server_version']}, autovacuum {server['autovacuum']} on the server, "
              f"mode {mode}"
              + (f" (naptime {result['config']['emulated_naptime_s']:g} s)"
                 if mode == "emulate" else "")
              + f"; load average {result['loadavg_1m_5m_15m']['start'][0]} at the start, "
              f"{result['loadavg_1m_5m_15m']['end'][0]} at the end.")
    return "\n\n".join([header, *parts, "### summary\n\n"
                        + benchlib.markdown_table(headers, rows)])


if __name__ == "__main__":
    main()
