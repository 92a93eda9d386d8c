"""The admin of stored cron schedules: list with the next run, a form that refuses wrong
values field by field (the validation ``dbworker schedules`` and the supervisors use), and
the actions enable and disable."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString

from ..models import StoredSchedule
from ..tasks import stored_schedules as stored
from ..tasks.schedules import MISFIRE
from . import display
from .actions import Change, GuardedActions
from .djadmin import action
from .executions import BOTH

ENABLE = Change(
    name="enable_schedules", verb="Enable", what="stored schedules", effect="enabled already",
    changeable=lambda qs: qs.filter(enabled=False),
    apply=lambda pks: stored.set_enabled(pks, True),
)
DISABLE = Change(
    name="disable_schedules", verb="Disable", what="stored schedules",
    effect="disabled already",
    changeable=lambda qs: qs.filter(enabled=True),
    apply=lambda pks: stored.set_enabled(pks, False),
)


FIELDS = ["name", "task_path", "cron", "time_zone", "args", "kwargs", "enabled", "misfire",
          "misfire_window"]


class StoredScheduleForm(forms.ModelForm):
    misfire = forms.ChoiceField(choices=[(m, m) for m in MISFIRE], initial="skip",
                                help_text="Ticks missed while no supervisor ran: skip them, "
                                "run the latest, or run all within the misfire window.")

    class Meta:
        model = StoredSchedule
        fields = FIELDS
        help_texts = {
            "task_path": "The task's dotted path, e.g. myapp.tasks.send_digest.",
            "cron": "Five fields, or six with seconds last: '0 8 * * *' is 08:00 every day.",
            "time_zone": "An IANA zone such as Europe/Paris; empty: TIME_ZONE.",
            "args": 'Positional arguments, a JSON list: [1, "a"].',
            "kwargs": 'Keyword arguments, a JSON object: {"user_id": 42}.',
            "misfire_window": "Seconds back a supervisor looks for missed ticks (latest, all).",
        }

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if self.errors:
            return data  # a field Django refused (not JSON, not a number) is named already
        for field, empty in (("args", []), ("kwargs", {})):
            if data.get(field) in (None, ""):
                data[field] = empty
        row = StoredSchedule(**{f: data.get(f) for f in FIELDS})
        for field, text in stored.problems(row, code=stored.code_schedules()).items():
            self.add_error(field, text)
        return data


@admin.register(StoredSchedule)
class StoredScheduleAdmin(GuardedActions, admin.ModelAdmin):
    form = StoredScheduleForm
    list_display = ["name", "task", "cron", "zone", "enabled", "next_run"]
    list_filter = ["enabled", "task_path"]
    search_fields = ["name", "task_path"]
    readonly_fields = ["next_run", "created_at", "updated_at"]
    actions = ["enable_schedules", "disable_schedules"]

    class Media:
        css = {"all": ["django_dbworker/admin.css"]}

    def get_queryset(self, request: HttpRequest) -> QuerySet[StoredSchedule]:
        return stored.rows()

    def save_model(self, request: HttpRequest, obj: StoredSchedule, form: Any,
                   change: bool) -> None:
        obj.updated_at = timezone.now()  # a new or edited schedule ticks from now on
        obj.save(using=stored.rows().db)

    # ----- columns ----------------------------------------------------------------------

    @admin.display(description="task", ordering="task_path")
    def task(self, obj: StoredSchedule) -> SafeString:
        return format_html('<span title="{}">{}</span>', obj.task_path,
                           obj.task_path.rsplit(".", 1)[-1])

    @admin.display(description="zone", ordering="time_zone")
    def zone(self, obj: StoredSchedule) -> str:
        return obj.time_zone or "TIME_ZONE"

    @admin.display(description="next run")
    def next_run(self, obj: StoredSchedule) -> SafeString | str:
        if obj.pk is None:
            return display.EMPTY
        when, problem = stored.row_status(obj, stored.code_schedules())
        if problem is not None:
            return format_html('<span class="dbw-status dbw-status-failed">{}</span>', problem)
        if when is None:
            return "disabled"
        return timezone.localtime(when).strftime("%Y-%m-%d %H:%M:%S %Z")

    # ----- actions ----------------------------------------------------------------------

    @action(permissions=["change"], location=BOTH,
            description="Enable this schedule",
            description_plural="Enable the selected schedules")
    def enable_schedules(self, request: HttpRequest, queryset: QuerySet[StoredSchedule]) -> Any:
        return self.run_change(request, queryset, ENABLE,
                               permitted=self.has_change_permission(request))

    @action(permissions=["change"], location=BOTH,
            description="Disable this schedule",
            description_plural="Disable the selected schedules")
    def disable_schedules(self, request: HttpRequest,
                          queryset: QuerySet[StoredSchedule]) -> Any:
        return self.run_change(request, queryset, DISABLE,
                               permitted=self.has_change_permission(request))
