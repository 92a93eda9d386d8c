"""The admin of workflows (and ``enqueue_many`` batches): the list with progress, a page per
workflow with its members as an indented list (each under the members it waits for, with
its dependencies and their statuses), and the action cancel."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from .. import conf
from ..models import TaskRecord, TaskStatus, Workflow
from ..workflows import handle
from . import display
from .actions import Change, GuardedActions
from .base import QueueTableAdmin
from .djadmin import action
from .executions import BOTH

#: At most this many members on a workflow's page (the task list shows them all).
LISTED = 500


def _cancel(pks: list[Any]) -> int:
    rows = list(Workflow.objects.using(conf.get().DATABASE).filter(pk__in=pks))
    for row in rows:
        handle.cancel(row)
    return len(rows)


CANCEL = Change(
    name="cancel_workflows", verb="Cancel", what="workflows", effect="cancelled already",
    changeable=lambda qs: qs.filter(cancelled_at__isnull=True),
    apply=_cancel,
)


def task_url(pk: Any) -> str:
    return reverse("admin:django_dbworker_taskrecord_change", args=[pk])


def workflow_url(pk: Any) -> str:
    return reverse("admin:django_dbworker_workflow_change", args=[pk])


def counts(progress: dict[str, int]) -> SafeString | str:
    """Badges ``3 successful``, ``1 running``, ... for the statuses that have members."""
    shown = [(s.value, f"{progress[s.value]} {s.label}") for s in TaskStatus
             if progress.get(s.value)]
    if not shown:
        return "no members"
    return format_html_join(" ", "{}", ((display.badge(s, text),) for s, text in shown))


@admin.register(Workflow)
class WorkflowAdmin(GuardedActions, QueueTableAdmin):
    list_display = ["label", "short_id", "created_at", "progress_column", "cancelled_at"]
    search_fields = ["name"]
    search_help_text = "A workflow id, or part of its name."
    ordering = ["-created_at"]
    list_per_page = 50
    actions = ["cancel_workflows"]
    fields = ["id", "name", "created_at", "cancelled_at", "progress_counts", "callback",
              "members"]
    readonly_fields = ["id", "name", "created_at", "cancelled_at", "progress_counts",
                       "callback", "members"]

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # its members are tasks: delete (or prune) those

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Workflow],
                           search_term: str) -> tuple[QuerySet[Workflow], bool]:
        import uuid

        try:
            return queryset.filter(pk=uuid.UUID(search_term.strip())), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    # ----- columns ----------------------------------------------------------------------

    @admin.display(description="workflow", ordering="name")
    def label(self, obj: Workflow) -> str:
        return obj.name or "(no name)"

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Workflow) -> str:
        return str(obj.pk)[:8]

    @admin.display(description="progress")
    def progress_column(self, obj: Workflow) -> SafeString | str:
        return counts(handle.progress(obj))

    @admin.display(description="progress")
    def progress_counts(self, obj: Workflow) -> SafeString:
        progress = handle.progress(obj)
        return format_html(
            '<span class="dbw-workflow-progress">{} of {} ended</span> {} '
            '<a href="{}?workflow_id={}">its tasks (and callback) in the task list</a>',
            sum(progress[s] for s in (TaskStatus.SUCCESSFUL, TaskStatus.FAILED,
                                      TaskStatus.CANCELLED)),
            progress["total"], counts(progress),
            reverse("admin:django_dbworker_taskrecord_changelist"), obj.pk)

    @admin.display(description="completion callback")
    def callback(self, obj: Workflow) -> SafeString | str:
        if obj.callback_id is None:
            return display.EMPTY
        task = TaskRecord.objects.using(conf.get().DATABASE).filter(
            pk=obj.callback_id).first()
        if task is None:
            return f"{obj.callback_id} (pruned)"
        return format_html('<a href="{}">{}</a> {}', task_url(task.pk),
                           task.task_path.rsplit(".", 1)[-1], display.badge(task.status))

    @admin.display(description="members (each under what it waits for)")
    def members(self, obj: Workflow) -> SafeString | str:
        found, total = handle.described(obj, LISTED)
        if not found:
            return display.EMPTY
        statuses = {str(m.task.pk): m.task.status for m in found}
        outside = {e.dependency_id for m in found for e in m.after
                   if e.dependency_id and e.dependency_id not in statuses}
        if outside:
            statuses |= {str(pk): status for pk, status in TaskRecord.objects.using(
                conf.get().DATABASE).filter(pk__in=outside).values_list("pk", "status")}
        items = format_html_join("", (
            '<li class="dbw-member" data-task="{}" style="margin-left: {}em">'
            '<a href="{}">{}</a> <code>{}</code> {}{}</li>'), (
            (m.task.pk, 2 * m.depth, task_url(m.task.pk), m.task.task_path.rsplit(".", 1)[-1],
             str(m.task.pk)[:8], display.badge(m.task.status), self._after(m, statuses))
            for m in found))
        more = (format_html("<p>... and {} more: see the task list.</p>", total - len(found))
                if total > len(found) else "")
        return format_html('<ul class="dbw-workflow-members">{}</ul>{}', items, more)

    def _after(self, member: handle.Member, statuses: dict[str, str]) -> SafeString | str:
        if not member.after:
            return ""
        parts = []
        for e in member.after:
            if e.dependency_id is None:
                on = format_html("{}[{}]", e.row_worker, e.row_source_id)
                status: SafeString | str = ""
            else:
                on = format_html('<a href="{}"><code>{}</code></a>', task_url(e.dependency_id),
                                 e.dependency_id[:8])
                found = statuses.get(e.dependency_id)
                status = display.badge(found) if found else "(pruned)"
            condition = "" if e.condition == "succeeded" else " when ended"
            parts.append(format_html('<span class="dbw-edge dbw-edge-{}">{} {}{}: {}</span>',
                                     e.state, on, status, condition, e.state))
        return format_html(" <small>after {}</small>",
                           format_html_join(", ", "{}", ((p,) for p in parts)))

    # ----- actions ----------------------------------------------------------------------

    @action(permissions=["change"], location=BOTH,
                  description="Cancel this workflow",
                  description_plural="Cancel the selected workflows")
    def cancel_workflows(self, request: HttpRequest, queryset: QuerySet[Workflow]) -> Any:
        return self.run_change(request, queryset, CANCEL,
                               permitted=self.has_change_permission(request))
