"""The dashboard: counts by status, lag, throughput and failures, per worker and queue.

It hangs off the ``Dashboard`` proxy model so the admin index lists it; anyone who may view
executions or tasks may view it.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import reverse

from .. import conf
from ..insight import horizon, snapshot
from ..models import Dashboard, Pause, State, TaskStatus
from . import display


@admin.register(Dashboard)
class DashboardAdmin(admin.ModelAdmin):
    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        user = request.user
        return any(user.has_perm(f"django_dbworker.{p}") for p in (
            "view_execution", "change_execution", "view_taskrecord", "change_taskrecord"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        if not self.has_view_permission(request):
            raise PermissionDenied
        snap = snapshot.take()
        database = horizon.read()
        site = self.admin_site.name
        pause = _pause_links(request, self.admin_site)
        executions = reverse(f"{site}:django_dbworker_execution_changelist")
        tasks = reverse(f"{site}:django_dbworker_taskrecord_changelist")
        context = {
            **self.admin_site.each_context(request),
            "title": "Background work",
            "opts": self.opts,
            "snapshot": snap,
            "workers": [_line(w, executions, "worker", "state__exact") | pause("worker", w)
                        for w in snap.workers],
            "queues": [_line(q, tasks, "queue_name__exact", "status__exact") | pause("queue", q)
                       for q in snap.queues],
            "worker_states": [s.lower() for s in State.values],
            "task_statuses": [s.lower() for s in TaskStatus.values],
            "failures": [_failure(g, executions, tasks) for g in snap.failures],
            "supervisors_url": reverse(f"{site}:django_dbworker_supervisor_changelist"),
            "database": database,
            "database_warnings": horizon.warnings(database),
            "oldest_age": display.seconds((database.get("oldest_transaction") or {})
                                          .get("seconds")),
            **(extra_context or {}),
        }
        return TemplateResponse(request, "admin/django_dbworker/dashboard.html", context)


def _line(line: snapshot.Line, url: str, by: str, status_param: str) -> dict[str, Any]:
    peak = max(line.per_minute) or 1
    return {
        "name": line.name,
        "url": f"{url}?{urlencode({by: line.name})}",
        "cells": [(n, f"{url}?{urlencode({by: line.name, status_param: status})}")
                  for status, n in line.counts.items()],
        "lag": display.seconds(line.lag_seconds),
        "lagging": line.lag_seconds is not None and line.lag_seconds > 60,
        "done": " / ".join(str(n) for n in line.throughput.values()),
        "bars": [(n, round(100 * n / peak)) for n in line.per_minute],
        "avg": display.seconds(line.avg_seconds),
    }


def _pause_links(request: HttpRequest, admin_site: admin.AdminSite) -> Any:
    """For a line: when it was paused, and a link to pause or resume it (the Pause admin's
    add or delete page) for those allowed to."""
    site = admin_site.name
    pause_admin = admin_site._registry.get(Pause)
    may_add = pause_admin is not None and pause_admin.has_add_permission(request)
    may_delete = pause_admin is not None and pause_admin.has_delete_permission(request)
    ids = {(kind, name): pk for pk, kind, name in Pause.objects.using(
        conf.get().DATABASE).values_list("pk", "kind", "name")}

    def links(kind: str, line: snapshot.Line) -> dict[str, Any]:
        pk = ids.get((kind, line.name))
        since = line.paused_since
        out: dict[str, Any] = {"paused_since": since, "pause_url": None, "resume_url": None}
        if pk is not None and may_delete:
            out["resume_url"] = reverse(f"{site}:django_dbworker_pause_delete", args=[pk])
        elif pk is None and since is None and may_add:
            add = reverse(f"{site}:django_dbworker_pause_add")
            out["pause_url"] = f"{add}?{urlencode({'kind': kind, 'name': line.name})}"
        return out

    return links


def _failure(group: dict[str, Any], executions: str, tasks: str) -> dict[str, Any]:
    if group["kind"] == "execution":
        query = {"worker": group["worker"], "state__exact": State.FAILED,
                 "exception": group["exception_class"]}
        return {**group, "who": group["worker"], "url": f"{executions}?{urlencode(query)}"}
    query = {"task_path__exact": group["task"], "status__exact": TaskStatus.FAILED}
    return {**group, "who": group["task"], "url": f"{tasks}?{urlencode(query)}"}
