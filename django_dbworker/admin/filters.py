"""List filters that do not scan the tables for their choices."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import OuterRef, QuerySet
from django.http import HttpRequest

from ..db.partial import InStates
from ..models import SETTLED, TASK_SETTLED, Failure
from ..rows.queries import Probe
from ..rows.registry import workers
from ..tasks import names
from ..tasks import registry as tasks


class StatusFilter(admin.ChoicesFieldListFilter):
    """Django's filter by a status field's choices (its ``?status__exact=`` URLs), where a
    settled status (no claim reads it) also names the set of the partial index by status
    (``dbworker_task_status``, ``dbworker_execution_state``): on MariaDB and MySQL that is
    its flag column, the only way into that index; elsewhere a condition it implies."""

    #: The settled values of each status field.
    SETTLED = {"status": TASK_SETTLED, "state": SETTLED}

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        filtered = super().queryset(request, queryset)
        settled = self.SETTLED.get(self.field_path, ())
        raw: str | list[str] | None = self.lookup_val  # the URL's (a list since Django 5.0)
        values = [raw] if isinstance(raw, str) else list(raw or [])
        if filtered is not None and values and all(v in settled for v in values):
            return filtered.filter(InStates(self.field_path, settled))
        return filtered


class NamedFilter(admin.SimpleListFilter):
    """Choices from the code and the settings, never a ``DISTINCT`` over the table (a
    full scan at every page view); a name no longer declared is still found by URL."""

    field = ""

    def names(self) -> set[str]:
        raise NotImplementedError

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        choices = self.names()
        if value := self.value():
            choices.add(value)
        return [(name, name) for name in sorted(choices)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        return queryset.filter(**{self.field: self.value()}) if self.value() else queryset


class WorkerFilter(NamedFilter):
    """The registered workers."""

    title = "worker"
    parameter_name = field = "worker"

    def names(self) -> set[str]:
        return set(workers)


class QueueFilter(NamedFilter):
    """The queues of ``TASKS``' DBWorkerBackends (the parameter Django's own filter used)."""

    title = "queue name"
    parameter_name = "queue_name__exact"
    field = "queue_name"

    def names(self) -> set[str]:
        return set(names.configured_queues())


class TaskPathFilter(NamedFilter):
    """The tasks defined in the code."""

    title = "task path"
    parameter_name = "task_path__exact"
    field = "task_path"

    def names(self) -> set[str]:
        return set(tasks.known())


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
        # A probe per execution the other filters leave (by execution_id), never a join
        # that reads every failure: the plan does not depend on the tables' statistics.
        return queryset.filter(Probe(Failure.objects.filter(
            execution=OuterRef("pk"), exception_class=self.value())))
