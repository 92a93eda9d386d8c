"""Units that failed for good, grouped by the exception class of their last error."""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Max, OuterRef, Subquery

from .. import conf
from ..models import Execution, Failure, TaskRecord
from .sql import LastErrorClass


def grouped() -> list[dict[str, Any]]:
    """One entry per (worker or task, exception class): how many, and the latest when.

    Entries are ``{"kind": "execution", "worker": ..., ...}`` or ``{"kind": "task",
    "task": ..., "queue": ...}`` with ``exception_class``, ``count`` and ``last_at``; the
    largest groups first.
    """
    using = conf.get().DATABASE
    last_class = Subquery(Failure.objects.using(using).filter(execution=OuterRef("pk"))
                          .order_by("-id").values("exception_class")[:1])
    executions = (Execution.objects.using(using).failed()
                  .annotate(exception_class=last_class)
                  .values("worker", "exception_class")
                  .annotate(count=Count("id"), last_at=Max("finished_at")).order_by())
    tasks = (TaskRecord.objects.using(using).failed()
             .annotate(exception_class=LastErrorClass("errors"))
             .values("task_path", "queue_name", "exception_class")
             .annotate(count=Count("id"), last_at=Max("finished_at")).order_by())
    groups = [
        {"kind": "execution", "worker": r["worker"],
         "exception_class": r["exception_class"] or "", "count": r["count"],
         "last_at": r["last_at"]}
        for r in executions
    ] + [
        {"kind": "task", "task": r["task_path"], "queue": r["queue_name"],
         "exception_class": r["exception_class"] or "", "count": r["count"],
         "last_at": r["last_at"]}
        for r in tasks
    ]
    return sorted(groups, key=lambda g: (-g["count"], g["exception_class"]))
