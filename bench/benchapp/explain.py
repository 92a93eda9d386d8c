"""BENCH_AUTO_EXPLAIN=<folder>: every PostgreSQL statement of every bench process (and of
the ``runworkers`` it starts) is explained by the server as it runs.

Each new connection loads ``auto_explain`` for its own session (``LOAD`` needs a superuser;
the server's settings are not touched) with ``log_analyze`` and ``log_buffers``, nested
statements included, at NOTICE level, so the plans come back to the client: a notice
handler appends them to ``<folder>/<pid>.jsonl``, one JSON object per statement
(``duration_ms``, ``plan``: the plan as the server gave it in JSON). ``summarise()`` reads
a folder back. It slows everything down: for plans, not for figures.
"""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

VARIABLE = "BENCH_AUTO_EXPLAIN"
_DURATION = re.compile(r"duration: ([0-9.]+) ms\s+plan:\s*", re.S)


def install() -> None:
    if not os.environ.get(VARIABLE):
        return
    from django.db.backends.signals import connection_created

    connection_created.connect(_explain_session, dispatch_uid="bench-auto-explain")


def _explain_session(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return
    folder = Path(os.environ[VARIABLE])
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"{os.getpid()}.jsonl"

    def noted(diagnostic: Any) -> None:
        text = diagnostic.message_primary or ""
        found = _DURATION.match(text)
        if not found:
            return
        record = {"pid": os.getpid(), "duration_ms": float(found.group(1)),
                  "plan": json.loads(text[found.end():])}
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    connection.connection.add_notice_handler(noted)
    with connection.connection.cursor() as cursor:
        cursor.execute("LOAD 'auto_explain'")
        for name, value in (("log_min_duration", "0"), ("log_analyze", "on"),
                            ("log_buffers", "on"), ("log_nested_statements", "on"),
                            ("log_format", "json"), ("log_level", "notice")):
            cursor.execute(f"SET auto_explain.{name} = {value}")
    if not connection.get_autocommit():
        connection.connection.commit()


def summarise(folder: str | Path, top: int = 20) -> list[dict[str, Any]]:
    """Per statement text: how many ran, their total and mean time, and the plan shapes
    seen (node types, relations and indexes), busiest first."""
    found: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"count": 0, "total_ms": 0.0, "shapes": defaultdict(int)})
    for path in Path(folder).glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            query = record["plan"].get("Query Text", "")
            entry = found[query]
            entry["count"] += 1
            entry["total_ms"] += record["duration_ms"]
            entry["shapes"][shape(record["plan"]["Plan"])] += 1
    rows = [{"query": q, "count": e["count"], "total_ms": round(e["total_ms"], 1),
             "mean_ms": round(e["total_ms"] / e["count"], 3), "shapes": dict(e["shapes"])}
            for q, e in found.items()]
    return sorted(rows, key=lambda r: -r["total_ms"])[:top]


def shape(node: dict[str, Any], depth: int = 0) -> str:
    """The plan as indented node types with their relation and index."""
    line = "  " * depth + node["Node Type"]
    if "Relation Name" in node:
        line += f" on {node['Relation Name']}"
    if "Index Name" in node:
        line += f" using {node['Index Name']}"
    return "\n".join([line, *(shape(child, depth + 1) for child in node.get("Plans", []))])
