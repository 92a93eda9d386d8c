"""The admin of executions: list, filters, search, the failures with their tracebacks, and
the actions retry (FAILED) and run again (FINISHED or FAILED)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import ValidationError
from django.db.models import OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest
from django.urls import NoReverseMatch, reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..db import keys
from ..models import Execution, Failure, State
from ..rows import store
from ..rows.registry import workers
from . import display
from .actions import Change, GuardedActions
from .base import QueueTableAdmin
from .djadmin import ActionLocation, action
from .filters import ExceptionFilter, StatusFilter, WorkerFilter

BOTH = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]

RETRY = Change(
    name="retry_failed", verb="Retry", what="failed executions", effect="not FAILED",
    changeable=lambda qs: qs.filter(state__in=store.TRANSITIONS["reset_failed"]),
    apply=store.reset_failed_ids,
)
RUN_AGAIN = Change(
    name="run_again", verb="Run again", what="finished or failed executions",
    effect="not FINISHED or FAILED",
    changeable=lambda qs: qs.filter(state__in=store.TRANSITIONS["reprocess"]),
    apply=store.reprocess_ids,
)


class FailureInline(admin.StackedInline):
    model = Failure
    extra = 0
    can_delete = False
    fields = ("attempt", "occurred_at", "exception_class", "message_display",
              "traceback_display")
    readonly_fields = fields
    ordering = ["-id"]
    verbose_name = "failed attempt"

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Whoever may see an execution may see why it failed.
        user = request.user
        return user.has_perm("django_dbworker.view_execution") or user.has_perm(
            "django_dbworker.change_execution")

    @admin.display(description="message")
    def message_display(self, obj: Failure) -> SafeString | str:
        return display.pre(obj.message, "dbw-pre dbw-message")

    @admin.display(description="traceback")
    def traceback_display(self, obj: Failure) -> SafeString | str:
        return display.pre(obj.traceback, "dbw-pre dbw-traceback")


@admin.register(Execution)
class ExecutionAdmin(GuardedActions, QueueTableAdmin):
    list_display = ["id", "worker", "source", "status", "tries", "error", "started",
                    "finished", "duration"]
    list_display_links = ["id"]
    list_filter = [WorkerFilter, ("state", StatusFilter), ExceptionFilter]
    search_fields = ["=source_id"]
    search_help_text = "The source row's primary key, exactly (rows of registered workers)."
    ordering = ["-id"]
    list_per_page = 50
    actions = ["retry_failed", "run_again"]
    busy_rows = Q(state=State.WORKING)
    busy_what = "working execution(s)"
    busy_advice = ("wait until their handler returns (or stop their runworkers), then "
                   "delete them")
    inlines = [FailureInline]
    fieldsets = [
        (None, {"fields": ["worker", "source", "status", "attempts", "crashes", "error"]}),
        ("Progress", {"fields": ["progress_display"]}),
        ("Times", {"fields": ["created_at", "available_at", "started_at", "finished_at",
                              "duration"]}),
        ("Claim", {"fields": ["supervisor", "claimed_host", "claimed_pid",
                              "lease_expires_at", "token"]}),
    ]
    readonly_fields = ["worker", "source", "status", "attempts", "crashes", "error",
                       "progress_display", "created_at", "available_at", "started_at",
                       "finished_at", "duration", "supervisor", "claimed_host",
                       "claimed_pid", "lease_expires_at", "token"]

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Execution],
                           search_term: str) -> tuple[QuerySet[Execution], bool]:
        """``source_id`` per worker, through the (worker, source_id) unique index: the
        worker filtered on, else every registered worker."""
        term = search_term.strip()
        if not term:
            return queryset, False
        names = [request.GET["worker"]] if request.GET.get("worker") else sorted(workers)
        return queryset.filter(worker__in=names, source_id=term), False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Execution]:
        last = Failure.objects.filter(execution=OuterRef("pk")).order_by("-id")
        return super().get_queryset(request).annotate(
            last_error_class=Subquery(last.values("exception_class")[:1]),
            last_error_message=Subquery(last.values("message")[:1]),
        )

    # ----- columns ----------------------------------------------------------------------

    @admin.display(description="source row", ordering="source_id")
    def source(self, obj: Execution) -> SafeString | str:
        url = self._source_url(obj)
        return format_html('<a href="{}">{}</a>', url, obj.source_id) if url else obj.source_id

    def _source_url(self, obj: Execution) -> str | None:
        worker = workers.get(obj.worker)
        if worker is None or not self.admin_site.is_registered(worker.source):
            return None
        meta = worker.source._meta
        try:
            pk = keys.from_key(worker.source, obj.source_id)
            return reverse(f"{self.admin_site.name}:{meta.app_label}_{meta.model_name}_change",
                           args=[quote(pk)])
        except (NoReverseMatch, ValidationError, ValueError, TypeError, OverflowError):
            return None  # a source_id that is not a key of the model (changed by hand)

    @admin.display(description="status", ordering="state")
    def status(self, obj: Execution) -> SafeString:
        return display.badge(None if obj.state == State.PENDING else obj.state)

    @admin.display(description="error")
    def error(self, obj: Execution) -> SafeString | str:
        # Annotated by get_queryset; not model fields.
        error_class = getattr(obj, "last_error_class", None)
        if obj.state != State.FAILED or not error_class:
            return display.EMPTY
        message = (getattr(obj, "last_error_message", None) or "").splitlines()[0:1]
        return format_html('<span class="dbw-error" title="{}">{}: {}</span>',
                           error_class, display.short_class(error_class),
                           (message[0] if message else "")[:120])

    @admin.display(description="tries", ordering="attempts")
    def tries(self, obj: Execution) -> int:
        return obj.attempts

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Execution) -> SafeString | str:
        return display.when(obj.started_at)

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: Execution) -> SafeString | str:
        return display.when(obj.finished_at)

    @admin.display(description="duration")
    def duration(self, obj: Execution) -> str:
        return display.duration(obj.started_at, obj.finished_at,
                                running=obj.state == State.WORKING)

    @admin.display(description="progress")
    def progress_display(self, obj: Execution) -> SafeString | str:
        return display.progress_bar(obj.progress, obj.progress_message)

    @admin.display(description="supervisor")
    def supervisor(self, obj: Execution) -> SafeString | str:
        if obj.supervisor_id is None:
            return display.EMPTY
        url = reverse(f"{self.admin_site.name}:django_dbworker_supervisor_change",
                      args=[obj.supervisor_id])
        return format_html('<a href="{}">{}</a>', url, obj.supervisor_id)

    # ----- actions ----------------------------------------------------------------------

    @action(permissions=["change"], location=BOTH,
            description="Retry the selected failed execution",
            description_plural="Retry the selected failed executions")
    def retry_failed(self, request: HttpRequest, queryset: QuerySet[Execution]) -> Any:
        return self.run_change(request, queryset, RETRY,
                               permitted=self.has_change_permission(request))

    @action(permissions=["change"], location=BOTH,
            description="Run this execution again",
            description_plural="Run the selected finished or failed executions again")
    def run_again(self, request: HttpRequest, queryset: QuerySet[Execution]) -> Any:
        return self.run_change(request, queryset, RUN_AGAIN,
                               permitted=self.has_change_permission(request))
