"""``WorkerStatusMixin``: worker status columns, filters and a "reprocess" action for the
admin of your own source models.

    from django_dbworker.admin import WorkerStatusMixin

    @admin.register(Photo)
    class PhotoAdmin(WorkerStatusMixin, admin.ModelAdmin):
        list_display = ["title"]
        dbworker_workers = ["make_thumbnail"]   # default: every worker over Photo
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import reduce
from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import BooleanField, Expression, F, OuterRef, QuerySet, Subquery
from django.http import HttpRequest

from ..db import keys
from ..models import Execution, ExecutionStatus, State
from ..rows import store
from ..rows.queries import Probe
from ..rows.registry import Worker, workers
from ..rows.status import has_execution_status
from . import display
from .actions import Change, GuardedActions
from .djadmin import ActionLocation, action, action_name, base_actions, get_action
from .paging import BoundedChangelist

NO_STATUS = "none"


def _annotation(name: str) -> str:
    return f"dbworker_{name}_state"


class WorkerStatusFilter(admin.SimpleListFilter):
    worker_name = ""

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(NO_STATUS, "no status yet")] + [
            (s.value, s.label) for s in ExecutionStatus]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        value = self.value()
        if not value:
            return queryset
        if value == NO_STATUS:
            return queryset.exclude(has_execution_status(worker=self.worker_name))
        if value not in ExecutionStatus.values:
            return queryset.none()
        return queryset.filter(status_is(workers[self.worker_name], [value]))


class KeysIn(Expression):
    """``pk IN (subquery)``; on PostgreSQL ``pk = ANY(ARRAY(subquery))``: the subquery runs
    once (an InitPlan) and the rows are fetched by primary key, whatever the planner knows
    of the tables. (A correlated ``EXISTS`` became a nested loop over the whole source table
    per execution on tables never analyzed: 22.6 s at a million rows.)"""

    conditional = True
    output_field = BooleanField()

    def __init__(self, lhs: Any, subquery: QuerySet[Any]) -> None:
        super().__init__()
        self.lhs, self.subquery = lhs, Subquery(subquery)

    def get_source_expressions(self) -> list[Any]:
        return [self.lhs, self.subquery]

    def set_source_expressions(self, exprs: Any) -> None:
        self.lhs, self.subquery = exprs

    def as_sql(self, compiler: Any, connection: Any) -> Any:
        lhs, lhs_params = compiler.compile(self.lhs)
        sub, sub_params = compiler.compile(self.subquery)
        return f"{lhs} IN {sub}", (*lhs_params, *sub_params)

    def as_postgresql(self, compiler: Any, connection: Any) -> Any:
        lhs, lhs_params = compiler.compile(self.lhs)
        sub, sub_params = compiler.compile(self.subquery)
        return f"{lhs} = ANY(ARRAY{sub})", (*lhs_params, *sub_params)


#: Up to this many matching executions, the filter reads them first (``KeysIn``); more,
#: and it probes the executions of each row the list walks.
FEW = 100_000


def status_is(worker: Worker, statuses: list[str]) -> KeysIn | Probe:
    """The source rows whose execution by ``worker`` has one of ``statuses``, in a shape
    whose plan does not depend on statistics: a rare status (FAILED among a million
    FINISHED) reads its executions by index and fetches the rows by key; a common one is
    probed per row (by the (worker, source_id) index) as the list walks the source table,
    which then finds a page's rows (and the bounded count's) early."""
    executions = Execution.objects.filter(worker=worker.name, state__in=statuses).order_by()
    if executions[:FEW + 1].count() <= FEW:
        key = keys.pk_expression(worker.source, F("source_id"))
        return KeysIn(F("pk"), executions.values_list(key))
    return Probe(executions.filter(source_id=keys.key_expression(OuterRef("pk"))))


def status_filter(name: str) -> type[WorkerStatusFilter]:
    return type(f"{name.title().replace('_', '')}StatusFilter", (WorkerStatusFilter,), {
        "worker_name": name, "title": f"{name} status", "parameter_name": f"dbworker_{name}",
    })


def status_column(name: str) -> Callable[[Any], Any]:
    @admin.display(description=f"{name} status", ordering=_annotation(name))
    def column(obj: Any) -> Any:
        state = getattr(obj, _annotation(name), None)
        return display.badge(None if state in (None, State.PENDING) else state)

    column.__name__ = f"dbworker_{name}_status"
    return column


class WorkerStatusMixin(BoundedChangelist, GuardedActions):
    """Put it before ``admin.ModelAdmin`` in your admin's bases. Its list counts up to a
    bound ("more than 10,000"), never the whole table (``paging``)."""

    #: Names of the workers to show; None: every worker whose source is this model.
    dbworker_workers: list[str] | None = None

    @property
    def media(self) -> forms.Media:
        return super().media + forms.Media(  # type: ignore[misc]
            css={"all": ["django_dbworker/admin.css"]})

    def get_dbworker_workers(self) -> list[Worker]:
        model = self.model  # type: ignore[attr-defined]
        if self.dbworker_workers is None:
            return workers.for_model(model)
        return [workers[name] for name in self.dbworker_workers]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Any]:
        qs = super().get_queryset(request)  # type: ignore[misc]
        for worker in self.get_dbworker_workers():
            state = Execution.objects.filter(
                worker=worker.name, source_id=keys.key_expression(OuterRef("pk")))
            qs = qs.annotate(**{_annotation(worker.name): Subquery(state.values("state")[:1])})
        return qs

    def get_list_display(self, request: HttpRequest) -> list[Any]:
        columns = list(super().get_list_display(request))  # type: ignore[misc]
        return columns + [status_column(w.name) for w in self.get_dbworker_workers()]

    def get_list_filter(self, request: HttpRequest) -> list[Any]:
        filters = list(super().get_list_filter(request))  # type: ignore[misc]
        return filters + [status_filter(w.name) for w in self.get_dbworker_workers()]

    def get_actions(self, request: HttpRequest,
                    action_location: ActionLocation = ActionLocation.CHANGE_LIST) -> Any:
        actions = base_actions(super(), request, action_location)
        if self.get_dbworker_workers() and self._may_reprocess(request):
            found = get_action(self, "dbworker_reprocess", action_location)
            if found is not None:
                actions[action_name(found)] = found
        return actions

    def _may_reprocess(self, request: HttpRequest) -> bool:
        return bool(self.has_change_permission(request)  # type: ignore[attr-defined]
                    and request.user.has_perm("django_dbworker.change_execution"))

    @action(location=[ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM],
            description="Reprocess this row",
            description_plural="Reprocess the selected %(verbose_name_plural)s")
    def dbworker_reprocess(self, request: HttpRequest, queryset: QuerySet[Any]) -> Any:
        selected = self.get_dbworker_workers()
        change = Change(
            name="dbworker_reprocess", verb="Reprocess",
            what=str(queryset.model._meta.verbose_name_plural),
            effect=f"{', '.join(w.name for w in selected)} has not finished or failed there",
            changeable=lambda qs: qs.filter(reduce(operator.or_, [
                has_execution_status(worker=w, statuses=store.TRANSITIONS["reprocess"])
                for w in selected])),
            apply=lambda pks: sum(store.reprocess(w, pks) for w in selected),
        )
        return self.run_change(request, queryset, change,
                               permitted=self._may_reprocess(request))
