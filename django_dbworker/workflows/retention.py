"""Retention of workflow rows: a ``Workflow`` goes once retention has pruned its members.

Its members are pruned like every task (``DBWORKER["RETENTION"]``, ``dbworker prune``);
the workflow row goes in the same round, once it is older than the same cutoff and no task
names it any more, so ``workflows.get(id)`` of a workflow whose tasks are gone says it is
unknown instead of showing an empty group, and the table does not grow forever.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Exists, OuterRef

from .. import conf
from ..models import TaskRecord, Workflow


def prune_batch(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` workflows created before ``cutoff`` that no task names."""
    using = conf.get().DATABASE
    memberless = Workflow.objects.using(using).filter(created_at__lt=cutoff).filter(
        ~Exists(TaskRecord.objects.using(using).filter(workflow_id=OuterRef("pk"))))
    ids = list(memberless.order_by().values_list("pk", flat=True)[:batch])
    if not ids:
        return 0
    return memberless.filter(pk__in=ids).delete()[0]
