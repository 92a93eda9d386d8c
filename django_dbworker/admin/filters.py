"""List filters that do not scan the tables for their choices."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Exists, OuterRef, QuerySet
from django.http import HttpRequest

from ..models import Failure
from ..rows.registry import workers


class WorkerFilter(admin.SimpleListFilter):
    """The registered workers (a worker removed from the code is still found by URL)."""

    title = "worker"
    parameter_name = "worker"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = set(workers)
        if value := self.value():
            names.add(value)
        return [(name, name) for name in sorted(names)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(worker=self.value()) if self.value() else queryset


class ExceptionFilter(admin.SimpleListFilter):
    """Executions that failed with this exception class (the dashboard links here)."""

    title = "exception class"
    parameter_name = "exception"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        value = self.value()
        return [(value, value)] if value else []

    def has_output(self) -> bool:
        return bool(self.value())

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        if not self.value():
            return queryset
        return queryset.filter(Exists(Failure.objects.filter(
            execution=OuterRef("pk"), exception_class=self.value())))
