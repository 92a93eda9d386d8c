"""What the admins of our own tables share: read-only pages on DBWORKER["DATABASE"], and
deletes that never remove a unit while it runs."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.actions import delete_selected
from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse

from .. import conf
from .djadmin import ActionLocation, base_actions, with_func
from .paging import BoundedChangelist


class QueueTableAdmin(BoundedChangelist, admin.ModelAdmin):
    """Rows are written by supervisors and changed only through actions (guarded UPDATEs),
    never by a form: nothing is added, the change permission opens only the list page
    (where the actions are), and rows are read from ``DBWORKER["DATABASE"]``.

    ``busy_rows`` selects the rows a process is running now: "Delete selected" and the delete
    page leave them alone (the DELETE itself excludes them, so a row that started meanwhile
    is kept too) and say why: ``busy_advice``.

    Lists stay bounded at millions of rows: a bounded count (``paging``), no facet counts
    (the dashboard counts by status), filters whose choices come from the code."""

    show_facets = admin.ShowFacets.NEVER

    #: Rows that must not be deleted (RUNNING tasks, WORKING executions).
    busy_rows: Q | None = None
    #: What to do instead, e.g. "cancel them first".
    busy_advice: str = ""
    #: e.g. "running task(s)".
    busy_what: str = ""

    class Media:
        css = {"all": ["django_dbworker/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Model]:
        return super().get_queryset(request).using(conf.get().DATABASE)

    # ----- deletes that skip running units ----------------------------------------------

    def get_actions(self, request: HttpRequest,
                    action_location: ActionLocation = ActionLocation.CHANGE_LIST) -> Any:
        actions = base_actions(super(), request, action_location)
        # Django's actions are never None; django-stubs' dict allows it.
        if (delete := actions.get("delete_selected")) is not None:
            actions["delete_selected"] = with_func(delete, type(self).delete_idle_selected)
        return actions

    def delete_idle_selected(self, request: HttpRequest,
                             queryset: QuerySet[Any]) -> HttpResponse | None:
        """Django's "Delete selected", for the selected rows that are not running; the
        running ones are named and left alone."""
        if self.busy_rows is not None:
            running = queryset.filter(self.busy_rows).count()
            if running:
                self._refuse_busy(request, running)
                queryset = queryset.exclude(self.busy_rows)
                if not queryset.exists():
                    return None
        return delete_selected(self, request, queryset)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> None:
        if self.busy_rows is not None:
            queryset = queryset.exclude(self.busy_rows)  # in the DELETE's own WHERE
        queryset.delete()

    def delete_model(self, request: HttpRequest, obj: Any) -> None:
        self.delete_queryset(request, self.get_queryset(request).filter(pk=obj.pk))

    def delete_view(self, request: HttpRequest, object_id: str,
                    extra_context: Any = None) -> Any:
        if self.busy_rows is not None and self.has_delete_permission(request):
            obj = self.get_object(request, object_id)
            if obj is not None and self.get_queryset(request).filter(
                    self.busy_rows, pk=obj.pk).exists():
                self._refuse_busy(request, 1)
                opts = self.model._meta
                return HttpResponseRedirect(reverse(
                    f"{self.admin_site.name}:{opts.app_label}_{opts.model_name}_changelist"))
        return super().delete_view(request, object_id, extra_context)

    def _refuse_busy(self, request: HttpRequest, count: int) -> None:
        self.message_user(
            request, f"{count} {self.busy_what} not deleted: they are running; "
            f"{self.busy_advice}.", messages.WARNING)
