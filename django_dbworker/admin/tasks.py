"""The admin of enqueued tasks: list, filters, search, arguments/result/errors, and the
actions retry (FAILED or CANCELLED) and cancel (waiting or running)."""

from __future__ import annotations

import uuid
from typing import Any, cast

from django.contrib import admin
from django.db.models import Q, QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import TaskRecord, TaskStatus
from ..tasks import registry as tasks
from ..tasks import store as taskstore
from . import display
from .actions import Change, GuardedActions
from .base import QueueTableAdmin
from .djadmin import action
from .executions import BOTH
from .filters import QueueFilter, StatusFilter, TaskPathFilter

CANCELLABLE = (TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RETRYING, TaskStatus.RUNNING)


def _cancel(pks: list[Any]) -> int:
    return sum(bool(taskstore.cancel(pk)) for pk in pks)


RETRY = Change(
    name="retry_tasks", verb="Retry", what="tasks", effect="not FAILED or CANCELLED",
    changeable=lambda qs: qs.filter(status__in=taskstore.TRANSITIONS["retry"]),
    apply=taskstore.retry,
)
CANCEL = Change(
    name="cancel_tasks", verb="Cancel", what="tasks",
    effect="already finished, or already asked to stop",
    changeable=lambda qs: qs.filter(
        Q(status__in=taskstore.TRANSITIONS["cancel_waiting"])
        | Q(status__in=taskstore.TRANSITIONS["cancel_running"],
            cancel_requested_at__isnull=True)),
    apply=_cancel,
)


@admin.register(TaskRecord)
class TaskRecordAdmin(GuardedActions, QueueTableAdmin):
    list_display = ["short_id", "name", "queue", "status_badge", "prio", "tries", "progress_column",
                    "runs_after", "duration"]
    list_filter = [("status", StatusFilter), QueueFilter, TaskPathFilter]
    search_fields = ["=task_path", "=idempotency_key"]
    search_help_text = ("A task id, a task's dotted path, an idempotency key or a unique key, "
                        "exactly.")
    ordering = ["-enqueued_at"]
    list_per_page = 50
    actions = ["retry_tasks", "cancel_tasks"]
    busy_rows = Q(status=TaskStatus.RUNNING)
    busy_what = "running task(s)"
    busy_advice = ("cancel them first (the Cancel action), then delete them once they have "
                   "stopped")
    fieldsets = [
        (None, {"fields": ["id", "task_path", "status_badge", "queue_name", "priority",
                           "backend", "attempts", "crashes", "snoozes", "schedule",
                           "idempotency_key", "unique_key", "workflow"]}),
        ("Call", {"fields": ["args_display", "kwargs_display", "result_display"]}),
        ("Progress", {"fields": ["progress_bar"]}),
        ("Dependencies", {"fields": ["waiting_for", "dependencies_display"]}),
        ("Times", {"fields": ["enqueued_at", "run_after", "available_at", "started_at",
                              "last_attempted_at", "finished_at", "duration",
                              "cancel_requested_at"]}),
        ("Claim", {"fields": ["claimed_host", "claimed_pid", "lease_expires_at",
                              "worker_ids"]}),
        ("Errors", {"fields": ["errors_display"]}),
    ]
    readonly_fields = [f for _, options in fieldsets  # one field a line: all names
                       for f in cast(list[str], options["fields"])]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[TaskRecord],
                           search_term: str) -> tuple[QuerySet[TaskRecord], bool]:
        """Indexed equalities, never a scan: the id, else the path of a task defined in the
        code (or any dotted name), else an idempotency key or a unique key."""
        term = search_term.strip()
        if not term:
            return queryset, False
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        if term in tasks.known() or ("." in term and " " not in term
                                     and not queryset.filter(idempotency_key=term).exists()):
            return queryset.filter(task_path=term), False
        return queryset.filter(Q(idempotency_key=term) | Q(unique_key=term)), False

    # ----- columns ----------------------------------------------------------------------

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: TaskRecord) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="task", ordering="task_path")
    def name(self, obj: TaskRecord) -> SafeString:
        name = format_html('<span title="{}">{}</span>', obj.task_path,
                           obj.task_path.rsplit(".", 1)[-1])
        if not obj.unique_key:
            return name
        return format_html('{}<br><small class="dbw-key" title="unique key">key: {}</small>',
                           name, obj.unique_key)

    @admin.display(description="status", ordering="status")
    def status_badge(self, obj: TaskRecord) -> SafeString:
        label = obj.status.lower()
        if obj.status == TaskStatus.RUNNING and obj.cancel_requested_at:
            label = "cancelling"
        elif obj.status == TaskStatus.WAITING:
            label = f"waiting for {obj.waiting_for}"
        return display.badge(obj.status, label)

    @admin.display(description="queue", ordering="queue_name")
    def queue(self, obj: TaskRecord) -> str:
        return obj.queue_name

    @admin.display(description="prio", ordering="priority")
    def prio(self, obj: TaskRecord) -> int:
        return obj.priority

    @admin.display(description="tries", ordering="attempts")
    def tries(self, obj: TaskRecord) -> str:
        """Attempts, and the snoozes beside them (they use none): "1 (+2 snoozed)"."""
        return f"{obj.attempts} (+{obj.snoozes} snoozed)" if obj.snoozes else str(obj.attempts)

    @admin.display(description="progress", ordering="progress")
    def progress_column(self, obj: TaskRecord) -> SafeString | str:
        return display.progress_bar(obj.progress, obj.progress_message, compact=True)

    @admin.display(description="run after", ordering="run_after")
    def runs_after(self, obj: TaskRecord) -> SafeString | str:
        return display.when(obj.run_after)

    @admin.display(description="progress")
    def progress_bar(self, obj: TaskRecord) -> SafeString | str:
        return display.progress_bar(obj.progress, obj.progress_message)

    @admin.display(description="duration")
    def duration(self, obj: TaskRecord) -> str:
        return display.duration(obj.last_attempted_at, obj.finished_at,
                                running=obj.status == TaskStatus.RUNNING)

    @admin.display(description="workflow")
    def workflow(self, obj: TaskRecord) -> SafeString | str:
        if obj.workflow_id is None:
            return display.EMPTY
        from .workflows import workflow_url

        return format_html('<a href="{}">{}</a>', workflow_url(obj.workflow_id),
                           obj.workflow_id)

    @admin.display(description="waits for")
    def dependencies_display(self, obj: TaskRecord) -> SafeString | str:
        """Its dependencies in ``after`` order: each a link to the task (or the row), the
        condition, and the edge's state with the dependency's status."""
        return display.dependencies(obj.pk)

    @admin.display(description="arguments")
    def args_display(self, obj: TaskRecord) -> SafeString | str:
        return display.pretty_json(obj.args)

    @admin.display(description="keyword arguments")
    def kwargs_display(self, obj: TaskRecord) -> SafeString | str:
        return display.pretty_json(obj.kwargs)

    @admin.display(description="result")
    def result_display(self, obj: TaskRecord) -> SafeString | str:
        if obj.status != TaskStatus.SUCCESSFUL:
            return display.EMPTY
        return display.pretty_json(obj.return_value)

    @admin.display(description="errors, one per failed attempt")
    def errors_display(self, obj: TaskRecord) -> SafeString | str:
        if not obj.errors:
            return display.EMPTY
        if not isinstance(obj.errors, list) or not all(isinstance(e, dict)
                                                        for e in obj.errors):
            return display.pretty_json(obj.errors)  # changed outside django-dbworker
        return format_html_join(
            "", '<div class="dbw-attempt"><h4>Attempt {} at {}: {}</h4>{}{}</div>',
            (("?" if e["attempt"] is None else e["attempt"], display.moment(e["occurred_at"]),
              e["exception_class"], display.pre(e["message"], "dbw-pre dbw-message"),
              display.pre(e["traceback"] or "", "dbw-pre dbw-traceback"))
             for e in reversed(obj.failure_dicts())),
        )

    # ----- actions ----------------------------------------------------------------------

    @action(permissions=["change"], location=BOTH,
            description="Retry this task",
            description_plural="Retry the selected failed or cancelled tasks")
    def retry_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> Any:
        return self.run_change(request, queryset, RETRY,
                               permitted=self.has_change_permission(request))

    @action(permissions=["change"], location=BOTH,
            description="Cancel this task",
            description_plural="Cancel the selected waiting or running tasks")
    def cancel_tasks(self, request: HttpRequest, queryset: QuerySet[TaskRecord]) -> Any:
        return self.run_change(request, queryset, CANCEL,
                               permitted=self.has_change_permission(request))
