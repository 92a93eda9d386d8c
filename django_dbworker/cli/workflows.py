"""``dbworker workflow ID`` and ``dbworker workflows``: workflows (and ``enqueue_many``
batches) as documents, and their tables."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Count

from .. import conf
from ..exceptions import UnknownWorkflow
from ..models import TaskRecord, TaskStatus, Workflow
from ..workflows import handle
from . import OperationError, render, units


def _head(row: Workflow) -> dict[str, Any]:
    return {"id": str(row.pk), "name": row.name, "created_at": row.created_at,
            "cancelled_at": row.cancelled_at,
            "callback_id": None if row.callback_id is None else str(row.callback_id)}


def workflow(raw_id: str, limit: int) -> dict[str, Any]:
    """One workflow: its progress, its first ``limit`` members (enqueue order) each with
    its dependencies (``after``) and depth, and its callback."""
    try:
        found = handle.get(raw_id)
    except UnknownWorkflow as exc:
        raise OperationError(f"{units.shown(raw_id)}: {exc}") from None
    row = found.row
    members, total = handle.described(row, limit)
    progress = handle.progress(row)
    callback = None
    if row.callback_id is not None:
        task = TaskRecord.objects.using(conf.get().DATABASE).filter(pk=row.callback_id).first()
        callback = None if task is None else units.task(task, traceback=False)
    return {
        "workflow": _head(row),
        "progress": progress,
        "done": not any(progress[s] for s in handle.OPEN),
        "members": [{**units.task(m.task, traceback=False), "depth": m.depth,
                     "after": [e.as_dict() for e in m.after]} for m in members],
        "more": total - len(members),
        "callback": callback,
    }


def workflows(limit: int) -> dict[str, Any]:
    """The ``limit`` most recent workflows, newest first, with their progress."""
    using = conf.get().DATABASE
    rows = list(Workflow.objects.using(using).order_by("-created_at")[:limit])
    counts: dict[str, dict[str, int]] = defaultdict(dict)
    callbacks = {r.callback_id for r in rows if r.callback_id is not None}
    per_status = (TaskRecord.objects.using(using).filter(workflow_id__in=[r.pk for r in rows])
                  .exclude(pk__in=callbacks).order_by().values_list("workflow_id", "status")
                  .annotate(n=Count("id")).values_list("workflow_id", "status", "n"))
    for workflow_id, status, n in per_status:
        counts[str(workflow_id)][status] = n
    out = []
    for r in rows:
        progress = {s.value: counts[str(r.pk)].get(s.value, 0) for s in TaskStatus}
        progress["total"] = sum(progress.values())
        out.append({**_head(r), "progress": progress,
                    "done": not any(progress[s] for s in handle.OPEN)})
    return {"workflows": out}


def _counts(progress: dict[str, int]) -> str:
    shown = [f"{s.lower()} {n}" for s, n in progress.items() if n and s != "total"]
    return ", ".join(shown) or "no members"


def _edge(e: dict[str, Any]) -> str:
    """``1a2b3c4d: met``, ``thumbnail[7] (ended)``: a dependency, for people."""
    on = (e["dependency_id"][:8] if e["dependency_id"]
          else f"{e['row_worker']}[{e['row_source_id']}]")
    condition = "" if e["condition"] == "succeeded" else " (ended)"
    return f"{on}{condition}: {e['state']}"


def render_workflow(doc: dict[str, Any]) -> str:
    w = doc["workflow"]
    lines = [f"Workflow {w['id']}" + (f" ({w['name']})" if w["name"] else ""),
             f"created {render.cell(w['created_at'])}"
             + (f", cancelled {render.cell(w['cancelled_at'])}" if w["cancelled_at"] else ""),
             f"{doc['progress']['total']} members: {_counts(doc['progress'])}"
             + (" (all ended)" if doc["done"] else ""), ""]
    rows = []
    for m in doc["members"]:
        after = ", ".join(_edge(e) for e in m["after"])
        rows.append(("  " * m["depth"] + m["task"].rsplit(".", 1)[-1], m["id"], m["status"],
                     m["attempts"], after, units.last_error(m)))
    lines.append(render.table(["task", "id", "status", "attempts", "after", "last error"],
                              rows))
    if doc["more"]:
        lines.append(f"... and {doc['more']} more (--limit)")
    c = doc["callback"]
    lines.append("")
    lines.append("callback: " + ("-" if c is None else
                                 f"{c['task']} {c['id']} {c['status']}"))
    return "\n".join(lines)


def render_workflows(doc: dict[str, Any]) -> str:
    return render.table(["id", "name", "created", "cancelled", "members", "progress"], [
        (w["id"], w["name"], w["created_at"], w["cancelled_at"], w["progress"]["total"],
         _counts(w["progress"]) + (" (all ended)" if w["done"] else ""))
        for w in doc["workflows"]])
