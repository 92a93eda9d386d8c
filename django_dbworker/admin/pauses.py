"""The admin of pauses: adding one pauses a task queue or a row worker, deleting it resumes
it (through ``django_dbworker.pausing``, so supervisors hear of it at once on PostgreSQL).
Pauses are added and deleted, never edited."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import ValidationError
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import conf, pausing
from ..exceptions import InvalidPause
from ..models import Pause, PauseKind


class PauseForm(forms.ModelForm):
    class Meta:
        model = Pause
        fields = ["kind", "name", "reason"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        kind, name = data.get("kind"), data.get("name")
        if kind in PauseKind.values and name:
            try:
                pausing.target(**{kind: name})
            except InvalidPause as exc:
                self.add_error("name", ValidationError(str(exc), code="unknown"))
        return data

    def validate_unique(self) -> None:
        kind, name = self.cleaned_data.get("kind"), self.cleaned_data.get("name")
        if kind and name and Pause.objects.using(conf.get().DATABASE).filter(
                kind=kind, name=name).exists():
            self.add_error("name", ValidationError(
                f"The {kind} {name!r} is paused already; delete that pause to resume it.",
                code="unique"))


@admin.register(Pause)
class PauseAdmin(admin.ModelAdmin):
    form = PauseForm
    list_display = ["kind", "name", "since", "reason"]
    list_filter = ["kind"]
    search_fields = ["name", "reason"]
    ordering = ["kind", "name"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Pause]:
        return super().get_queryset(request).using(conf.get().DATABASE)

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # added (pause) and deleted (resume) only

    @admin.display(description="since", ordering="paused_at")
    def since(self, obj: Pause) -> str:
        return f"{obj.paused_at:%Y-%m-%d %H:%M:%S}"

    def save_model(self, request: HttpRequest, obj: Pause, form: Any, change: bool) -> None:
        pausing.pause(**{obj.kind: obj.name}, reason=obj.reason)
        row = self.get_queryset(request).get(kind=obj.kind, name=obj.name)
        obj.pk, obj.paused_at = row.pk, row.paused_at

    def delete_model(self, request: HttpRequest, obj: Pause) -> None:
        pausing.resume(**{obj.kind: obj.name})

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Pause]) -> None:
        for kind, name in queryset.values_list("kind", "name"):
            pausing.resume(**{kind: name})
