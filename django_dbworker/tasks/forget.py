"""``result.forget()``: delete a task's row, as retention would, before its time
(docs/tasks.md, "Forgetting a result")."""

from __future__ import annotations

from typing import Any

from django.db import transaction

from .. import conf
from ..exceptions import CannotForget
from ..models import DependencyState, TaskDependency, TaskRecord, TaskStatus
from . import uniqueness


def forget(result_id: Any) -> bool:
    """Delete the task's row, its uniqueness key and its dependency edges; True if it was
    there. A RUNNING task is refused (cancel it, or wait for its end: deleting it would not
    stop it, and its end would have nowhere to go), and so is one that tasks still wait for
    (they would wait forever): ``CannotForget`` naming what to do."""
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        row = TaskRecord.objects.using(using).select_for_update().filter(pk=result_id) \
            .values_list("status", "task_path").first()
        if row is None:
            return False
        status, path = row
        if status == TaskStatus.RUNNING:
            raise CannotForget(
                f"Task {path} {result_id} is RUNNING: forgetting it would not stop it. Cancel "
                "it (django_dbworker.cancel) or wait for its end (result.get()), then forget.")
        waiting = TaskDependency.objects.using(using).filter(
            dependency_id=result_id, state=DependencyState.WAITING).count()
        if waiting:
            raise CannotForget(
                f"Task {path} {result_id} has {waiting} task(s) waiting for it: they would "
                "wait forever. Cancel them first, or let it end.")
        uniqueness.forget_holders([result_id])
        TaskDependency.objects.using(using).filter(dependent_id=result_id).delete()
        return bool(TaskRecord.objects.using(using).filter(pk=result_id).delete()[0])
