"""The admin of supervisors: each live, stopped or dead ``runworkers`` and what it runs."""

from __future__ import annotations

from typing import Any, cast

from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from ..models import Supervisor, SupervisorQuerySet
from . import display
from .base import QueueTableAdmin


class StateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("alive", "alive"), ("dead", "dead"), ("stopped", "stopped")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if value in ("alive", "dead"):
            return getattr(queryset, value)()
        if value == "stopped":
            return cast(SupervisorQuerySet, queryset).stopped()
        return queryset


@admin.register(Supervisor)
class SupervisorAdmin(QueueTableAdmin):
    list_display = ["__str__", "state", "started", "heartbeat", "busy", "runs", "units_done"]
    list_filter = [StateFilter, "host"]
    search_fields = ["host", "=pid"]
    fieldsets = [
        (None, {"fields": ["id", "host", "pid", "state", "started_at", "last_heartbeat",
                           "heartbeat_expires_at", "stopped_at", "exit_code"]}),
        ("Work", {"fields": ["concurrency", "runs", "burst", "units_done", "running_table"]}),
    ]
    readonly_fields = [f for _, options in fieldsets  # one field a line: all names
                       for f in cast(list[str], options["fields"])]
    actions = None  # rows are written by supervisors; "dbworker prune" removes old ones

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # no actions either

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        # Each row with the database's clock, which its state is judged by, as the
        # takeover of a dead supervisor's units is (``Supervisor.state``).
        return cast(SupervisorQuerySet, super().get_queryset(request)).judged()

    @admin.display(description="state")
    def state(self, obj: Supervisor) -> SafeString:
        state = obj.state()
        return display.badge({"alive": "RUNNING", "dead": "FAILED"}.get(state, "stopped"),
                             state)

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Supervisor) -> str:
        return timezone.localtime(obj.started_at).strftime("%Y-%m-%d %H:%M:%S")

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat(self, obj: Supervisor) -> str:
        now = getattr(obj, "database_now", None) or timezone.now()
        ago = (now - obj.last_heartbeat).total_seconds()
        return f"{display.seconds(max(ago, 0.0))} ago"

    @admin.display(description="runs")
    def runs(self, obj: Supervisor) -> str:
        parts = []
        if obj.workers:
            parts.append("workers: " + ", ".join(obj.workers))
        if obj.queues is None:
            parts.append("every task queue")
        elif obj.queues:
            parts.append("queues: " + ", ".join(obj.queues))
        return "; ".join(parts) or display.EMPTY

    @admin.display(description="busy")
    def busy(self, obj: Supervisor) -> str:
        return f"{len(obj.running)} of {obj.concurrency}"

    @admin.display(description="running at the last heartbeat")
    def running_table(self, obj: Supervisor) -> SafeString | str:
        if not obj.running:
            return display.EMPTY
        site = self.admin_site.name

        def row(unit: dict[str, Any]) -> tuple[str, str, Any, Any, Any]:
            if "task" in unit:
                url = reverse(f"{site}:django_dbworker_taskrecord_change", args=[unit["id"]])
                what = unit["task"]
            else:
                url = reverse(f"{site}:django_dbworker_execution_change",
                              args=[unit["execution"]])
                what = f"{unit['worker']} [{unit.get('source', '')}]"
            return url, what, unit.get("attempt", ""), unit.get("child", ""), unit.get("since")

        rows = format_html_join(
            "", '<tr><td><a href="{}">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            (row(u) for u in obj.running))
        return format_html('<table class="dbw-table"><thead><tr><th>unit</th><th>attempt'
                           '</th><th>child pid</th><th>since</th></tr></thead><tbody>{}'
                           '</tbody></table>', rows)
