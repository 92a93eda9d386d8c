"""Where an idle unit's milliseconds go, from just before the caller's enqueue() or
create() to its handler's first line: a trace of each step.

    .venv/bin/python bench/latency_trace.py [--db postgres|sqlite|mariadb] [--samples 30]
                                            [--gap 0.02-0.1] [--out FILE.json]

A real ``runworkers --concurrency 2 --worker ping --queue default`` runs (as in
``latency.py``) with ``DBWORKER_TRACE`` set: the supervisor and its children mark their
steps (``django_dbworker/supervisor/trace.py``: the wake-up, each statement, the claim, the
hand-off to a child, the child's receipt, the unit's start); this process marks its own
statements and commits. Then, alternately, ``--samples`` times each, one unit is enqueued
(``stamp.enqueue()``) or saved (``Ping.objects.create()``) after an idle gap (``--gap``
seconds, uniform). Per kind, each step's median time after ``caller: before`` (ms), and the
median time from the step before, are printed as a table (and written with ``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import benchlib
import latency


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=benchlib.DATABASES, default="postgres")
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--gap", default="0.02-0.1", help="idle seconds between units: LO-HI")
    parser.add_argument("--out", help="write the steps as JSON here too")
    parser.add_argument("--keep", action="store_true", help="keep the trace file (its path "
                        "is printed): every mark of every process")
    args = parser.parse_args()
    low, high = (float(x) for x in args.gap.split("-"))
    folder = Path(tempfile.mkdtemp(prefix="dbworker_trace_"))
    trace_file = folder / "trace.log"
    os.environ["DBWORKER_TRACE"] = str(trace_file)  # before django_dbworker is imported
    with benchlib.scratch_database(args.db, "trace") as name:
        benchlib.setup_django(args.db, name)
        from django.db import connections

        from django_dbworker.supervisor import trace

        benchlib.load_tasks("benchapp.tasks.stamp", 0)
        connections.close_all()
        trace_commits()
        trace.statements("default")
        env = {**benchlib.environment(args.db, name), "DBWORKER_TRACE": str(trace_file)}
        command = [sys.executable, "-m", "django", "runworkers", "--concurrency=2",
                   "--worker=ping", "--queue=default", "--verbosity=0"]
        process = subprocess.Popen(command, env=env, cwd=benchlib.ROOT)
        try:
            latency.one("tasks", timeout=60)
            latency.one("rows", timeout=60)
            handler: dict[int, float] = {}
            for i in range(args.samples * 2):
                kind = ("tasks", "rows")[i % 2]
                time.sleep(random.uniform(low, high))
                trace.mark("sample", f"{i} {kind}")
                sample = latency.one_sample(kind, mark=trace.mark)
                handler[i] = sample["handler"]
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(60)
    steps = analyse(trace_file.read_text(), handler, os.getpid(), process.pid)
    if args.keep:
        print(f"the trace: {trace_file}")
    else:
        trace_file.unlink()
        folder.rmdir()
    text = report(steps)
    print(f"{args.db}, {args.samples} samples per kind, gap {args.gap} s, load "
          f"{os.getloadavg()[0]:.2f}\n\n{text}")
    if args.out:
        Path(args.out).write_text(json.dumps({"db": args.db, "steps": steps}, indent=2))


def trace_commits() -> None:
    """Mark this process's commits too (Django's ``_commit``: not a cursor's statement)."""
    from django.db.backends.base.base import BaseDatabaseWrapper

    from django_dbworker.supervisor import trace

    for wrapper in {type(c) for c in __import__("django.db").db.connections.all()}:
        original = wrapper._commit
        if getattr(original, "traced", False):
            continue

        def _commit(self: BaseDatabaseWrapper, original: Any = original) -> Any:
            trace.mark("commit")
            try:
                return original(self)
            finally:
                trace.mark("commit_done")

        _commit.traced = True  # type: ignore[attr-defined]
        wrapper._commit = _commit


def analyse(text: str, handler: dict[int, float], caller: int,
            supervisor: int) -> dict[str, list[dict[str, Any]]]:
    """Per kind, the steps in order: their median time after ``caller: before``."""
    samples: list[tuple[int, str, list[tuple[float, str]]]] = []
    for line in text.splitlines():
        stamp, pid, event, *rest = line.split(" ", 3)
        detail = rest[0] if rest else ""
        if event == "sample" and int(pid) == caller:
            number, kind = detail.split()
            samples.append((int(number), kind, []))
            continue
        if not samples:
            continue
        role = ("caller" if int(pid) == caller else
                "supervisor" if int(pid) == supervisor else "child")
        words = detail[:70] if event in ("sql", "sql_done", "claimed", "woke") else ""
        samples[-1][2].append((float(stamp), f"{role}: {event} {words}".strip()))
    by_kind: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for number, kind, events in samples:
        before = next((t for t, what in events if what == "caller: before"), None)
        if before is None:
            continue
        seen: dict[str, int] = defaultdict(int)
        for t, what in events:
            seen[what] += 1
            name = what if seen[what] == 1 else f"{what} #{seen[what]}"
            by_kind[kind][name].append((t - before) * 1000)
        if number in handler:
            by_kind[kind]["handler: first line"].append((handler[number] - before) * 1000)
    steps: dict[str, list[dict[str, Any]]] = {}
    for kind, found in by_kind.items():
        medians = {name: statistics.median(ms) for name, ms in found.items()}
        ordered = sorted(medians, key=lambda name: medians[name])
        steps[kind] = []
        previous = 0.0
        for name in ordered:
            m = medians[name]
            steps[kind].append({"step": name, "median_ms": round(m, 3),
                                "after_previous_ms": round(m - previous, 3),
                                "n": len(found[name])})
            previous = m
    return steps


def report(steps: dict[str, list[dict[str, Any]]]) -> str:
    parts = []
    for kind, rows in steps.items():
        parts.append(f"{kind}:\n\n" + benchlib.markdown_table(
            ["step", "ms after caller: before (median)", "ms after the step before", "n"],
            [[r["step"], r["median_ms"], r["after_previous_ms"], r["n"]] for r in rows]))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()
