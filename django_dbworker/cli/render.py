"""Human tables for the command's documents (``--json`` prints the documents instead)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from . import units


def cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    text = [[cell(v) for v in row] for row in rows]
    if not text:
        return "(none)"
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    body = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip()
            for r in text]
    return "\n".join([line.rstrip(), "  ".join("-" * w for w in widths), *body])


def _runs(s: dict[str, Any]) -> str:
    parts = list(s["workers"])
    parts += ["tasks:*"] if s["queues"] is None else [f"tasks:{q}" for q in s["queues"]]
    return ",".join(parts)


def _unit_name(u: dict[str, Any]) -> str:
    return u["task"] if "task" in u else f"{u['worker']}[{u.get('source', '')}]"


def supervisors(rows: list[dict[str, Any]], *, status_now: bool = False) -> str:
    out = [table(["supervisor", "state", "started", "last heartbeat", "busy", "runs"], [
        (f"{s['host']}:{s['pid']}", s["state"], s["started_at"], s["last_heartbeat"],
         f"{len(s['running'])}/{s['concurrency']}", _runs(s)) for s in rows])]
    running = [(f"{s['host']}:{s['pid']}", _unit_name(u), u.get("execution") or u.get("id"),
                u.get("attempt"), u.get("child"), u.get("since"),
                *([u.get("status_now")] if status_now else []))
               for s in rows for u in s["running"]]
    if running:
        headers = ["supervisor", "unit", "id", "attempt", "child", "since"]
        out += ["", table(headers + (["status now"] if status_now else []), running)]
    return "\n".join(out)


def inspect(doc: dict[str, Any]) -> str:
    if "units" in doc:
        return "\n\n".join(unit(u) for u in doc["units"])
    return "\n".join([
        "Supervisors", supervisors(doc["supervisors"]), "",
        "Workers", table(["worker", "source", "concurrency", "transactional"], [
            (w["name"], w["source"], w["concurrency"], w["transactional"])
            for w in doc["workers"]]), "",
        "Queues", ", ".join(doc["queues"]) or "(none)",
    ])


def unit(u: dict[str, Any]) -> str:
    skip = {"errors", "error", "kind"}
    if u["kind"] == "execution":
        skip.update(units.EXECUTION_ALIASES)
    lines = [f"{u['kind']} {u['id']}"]
    lines += [f"  {k}: {units.status(u) if k == 'execution_status' else cell(v)}"
              for k, v in u.items() if k not in skip]
    for e in u.get("errors", []):
        lines += [f"  error of attempt {e['attempt']} at {cell(e['occurred_at'])}: "
                  f"{e['exception_class']}: {e['message']}"]
        if e.get("traceback"):
            lines += ["    " + t for t in e["traceback"].rstrip().splitlines()]
    return "\n".join(lines)


def _count(line: dict[str, Any], status: str) -> str | int:
    """A count; ">=N" where it stopped at the bound (``at_least``)."""
    n = line["counts"].get(status, 0)
    return f">={n}" if status in line.get("at_least", ()) else n


def _lines(title: str, lines: list[dict[str, Any]], statuses: list[str]) -> str:
    return table([title, *(s.lower() for s in statuses), "lag", "done 1m/5m/15m", "avg run"], [
        (line["name"], *(_count(line, s) for s in statuses),
         "-" if line["lag_seconds"] is None else f"{line['lag_seconds']:.1f}s",
         "/".join(str(n) for n in line["throughput"].values()),
         "-" if line["avg_seconds"] is None else f"{line['avg_seconds']:.3f}s")
        for line in lines])


def stats(doc: dict[str, Any]) -> str:
    from ..models import State, TaskStatus

    s = doc["supervisors"]
    out = [f"Supervisors: {s['alive']} alive, {s['dead']} dead, {s['stopped']} stopped "
           "(seen in the last day)"]
    if doc["workers"]:
        out += ["", _lines("worker", doc["workers"], list(State.values))]
    if doc["queues"]:
        out += ["", _lines("queue", doc["queues"], list(TaskStatus.values))]
    paused = [(kind, line["name"], line["paused_since"]) for kind in ("worker", "queue")
              for line in doc[f"{kind}s"] if line.get("paused_since")]
    if paused:
        out += ["", "Paused", table(["kind", "name", "since"], paused)]
    out += ["", "Failures by exception class", table(
        ["exception class", "worker or task", "failed", "latest"],
        [(g["exception_class"], g.get("worker") or g.get("task"), g["count"], g["last_at"])
         for g in doc["failures"]])]
    return "\n".join(out)


def _tries(u: dict[str, Any]) -> str:
    """A task's attempts, and its snoozes beside them (they use none)."""
    snoozes = u.get("snoozes")
    return f"{u['attempts']} (+{snoozes} snoozed)" if snoozes else str(u["attempts"])


def failures(doc: dict[str, Any], traceback: bool, *, listing: str) -> str:
    """``dbworker failed``, ``failed --retrying`` and ``dead``: each unit, whether it will
    be tried again, and when (its next try, or when it failed for good)."""
    def when(u: dict[str, Any]) -> Any:
        return u["available_at"] if u["will_retry"] else u["finished_at"]

    rows = [("execution", u["id"], f"{u['worker']}[{u['source_id']}]", units.status(u),
             u["attempts"], "yes" if u["will_retry"] else "no", when(u), units.last_error(u))
            for u in doc["executions"]]
    rows += [("task", u["id"], _task_name(u), u["status"], _tries(u),
              "yes" if u["will_retry"] else "no", when(u), units.last_error(u))
             for u in doc["tasks"]]
    c = doc["counts"]
    headers = ["kind", "id", "unit", "status", "attempts", "will retry",
               {"dead": "failed at", "retrying": "next try"}.get(listing,
                                                                 "next try / failed at"),
               "error"]
    summary = f"{c['executions']} execution(s) and {c['tasks']} task(s)"
    if listing == "failed":
        again = c["will_retry"]
        summary = (f"{summary} failed: {again['executions']} and {again['tasks']} will be "
                   "tried again, the others failed for good.")
    else:
        summary += " failed for good." if listing == "dead" else " to be tried again."
    out = [table(headers, rows), "", summary]
    if traceback:
        out += ["", "\n\n".join(unit(u) for u in [*doc["executions"], *doc["tasks"]])]
    return "\n".join(out)


def _task_name(u: dict[str, Any]) -> str:
    """A task's path, with its unique key (flow control) where it has one."""
    key = u.get("unique_key")
    return f"{u['task']} [{key}]" if key else str(u["task"])


def supervisor_list(doc: dict[str, Any], *, dead: bool) -> str:
    if not doc["supervisors"]:
        return ("No dead supervisors (none stopped beating without stopping)." if dead
                else "No supervisor beat in the last day.")
    return supervisors(doc["supervisors"], status_now=dead)


def plan(doc: dict[str, Any]) -> str:
    out = [doc["summary"]]
    if doc["items"]:
        out += ["", table(["kind", "id", "status", "will change"], [
            (i["kind"], i["id"], units.status(i), "yes" if i["will_change"] else "no")
            for i in doc["items"]])]
    return "\n".join(out)


def triggers(doc: dict[str, Any]) -> str:
    rows = [(w["worker"], w["table"], w["status"], w["reason"]) for w in doc["workers"]]
    text = table(("worker", "table", "triggers", "why"), rows)
    if doc["action"] != "status":
        verb = "Installed" if doc["action"] == "install" else "Removed"
        text += f"\n{verb} the triggers of: {', '.join(doc['changed']) or 'none'}."
    return text


def paused(doc: dict[str, Any]) -> str:
    if not doc["pauses"]:
        return "Nothing is paused."
    return table(["kind", "name", "since", "reason"],
                 [(p["kind"], p["name"], p["since"], p["reason"]) for p in doc["pauses"]])


def pause(doc: dict[str, Any]) -> str:
    p = doc["pause"]
    what = f"{p['kind']} {p['name']!r}"
    if doc["changed"]:
        return f"Paused {what}: supervisors claim nothing from it until it is resumed."
    return f"{what[0].upper()}{what[1:]} was paused already, since {cell(p['since'])}."


def resume(doc: dict[str, Any]) -> str:
    what = f"{doc['kind']} {doc['name']!r}"
    if doc["changed"]:
        return f"Resumed {what} (paused since {cell(doc['pause']['since'])})."
    return f"{what[0].upper()}{what[1:]} was not paused: nothing changed."


def _space(d: dict[str, Any]) -> str:
    parts = [f"{d['total_bytes'] / 1e6:.2f} MB ({d['scope']})"]
    if d.get("free_bytes") is not None:
        parts.append(f"free {d['free_bytes'] / 1e6:.2f} MB")
    if d.get("dead_rows") is not None:
        parts.append(f"dead rows {d['dead_rows']}")
    for key in ("auto_vacuum", "autovacuum"):
        if key in d:
            parts.append(f"{key} {d[key]}")
    return ", ".join(parts)


def vacuum(doc: dict[str, Any]) -> str:
    return "\n".join([f"Before: {_space(doc['before'])}", *(f"Ran: {sql}" for sql in
                      doc["statements"]), f"After:  {_space(doc['after'])} "
                      f"({doc['seconds']:.2f} s)"])
