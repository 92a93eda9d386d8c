"""What the admins of our own tables share: read-only pages on DBWORKER["DATABASE"]."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Model, QuerySet
from django.http import HttpRequest

from .. import conf


class QueueTableAdmin(admin.ModelAdmin):
    """Rows are written by supervisors and changed only through actions (guarded UPDATEs),
    never by a form: nothing is added, the change permission opens only the list page
    (where the actions are), and rows are read from ``DBWORKER["DATABASE"]``."""

    class Media:
        css = {"all": ["django_dbworker/admin.css"]}

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return obj is None and super().has_change_permission(request)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Model]:
        return super().get_queryset(request).using(conf.get().DATABASE)
