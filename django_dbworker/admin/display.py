"""Small HTML pieces the admin pages share: status badges, progress bars, durations."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

#: What an empty cell shows (the admin's own empty value).
EMPTY = "-"


def badge(status: str | None, label: str | None = None) -> SafeString:
    """A coloured status label; ``None`` shows as "no status" (a PENDING unit)."""
    key = (status or "none").lower()
    return format_html('<span class="dbw-status dbw-status-{}">{}</span>', key,
                       label or (key if status else "no status"))


def progress_bar(percent: float | None, message: str = "",
                 compact: bool = False) -> SafeString | str:
    if percent is None:
        return EMPTY
    value = max(0.0, min(100.0, float(percent)))
    return format_html(
        '<span class="dbw-progress" title="{}" role="progressbar" aria-valuenow="{}" '
        'aria-valuemin="0" aria-valuemax="100"><span style="width: {}%"></span></span> '
        '<span class="dbw-progress-text">{}%{}</span>',
        message, f"{value:g}", f"{value:.1f}", f"{value:.0f}",
        f" {message}" if message and not compact else "",
    )


def seconds(value: float | None) -> str:
    if value is None:
        return EMPTY
    if value < 1:
        return f"{value * 1000:.0f} ms"
    if value < 120:
        return f"{value:.1f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


def duration(started: datetime | None, finished: datetime | None,
             running: bool = False) -> str:
    """How long the last attempt took, or has run so far."""
    if started is None:
        return EMPTY
    if finished is None or finished < started:
        return f"running {seconds((timezone.now() - started).total_seconds())}" if running \
            else EMPTY
    return seconds((finished - started).total_seconds())


def when(value: datetime | None) -> SafeString | str:
    """A compact time for list columns: 14:03:05 today, 11-29 14:03 otherwise."""
    if value is None:
        return EMPTY
    local = timezone.localtime(value)
    today = local.date() == timezone.localtime().date()
    text = local.strftime("%H:%M:%S" if today else "%m-%d %H:%M")
    return format_html('<time datetime="{}" title="{}">{}</time>', value.isoformat(),
                       local.strftime("%Y-%m-%d %H:%M:%S %Z"), text)


def moment(value: datetime | str | None) -> str:
    """A full local time, e.g. of a failed attempt; text that is no time is shown as it is."""
    if not isinstance(value, datetime):
        return EMPTY if value in (None, "") else str(value)
    if timezone.is_naive(value):
        return value.isoformat(sep=" ")
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def pre(text: str, css: str = "dbw-pre") -> SafeString | str:
    return format_html('<pre class="{}">{}</pre>', css, text) if text else EMPTY


def pretty_json(value: Any) -> SafeString | str:
    return pre(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def short_class(path: str) -> str:
    """``builtins.ValueError`` -> ``ValueError``."""
    return path.rsplit(".", 1)[-1] if path else ""


def dependencies(task_id: Any) -> SafeString | str:
    """The edges of a dependent, one line each: the dependency (a link to its admin page,
    or the row), its status, the condition and the edge's state."""
    from django.urls import reverse

    from ..models import TaskDependency, TaskRecord

    edges = list(TaskDependency.objects.filter(dependent_id=task_id).order_by("position"))
    if not edges:
        return EMPTY
    ids = [e.dependency_id for e in edges if e.dependency_id is not None]
    found = {pk: (path, status) for pk, path, status in TaskRecord.objects.filter(
        pk__in=ids).values_list("pk", "task_path", "status")}
    lines = []
    for e in edges:
        if e.dependency_id is None:
            what = format_html("row {}[{}]", e.row_worker, e.row_source_id)
        elif e.dependency_id in found:
            path, status = found[e.dependency_id]
            url = reverse("admin:django_dbworker_taskrecord_change", args=[e.dependency_id])
            what = format_html('<a href="{}">{}</a> {} {}', url, str(e.dependency_id)[:8],
                               path.rsplit(".", 1)[-1], badge(status))
        else:
            what = format_html("{} (pruned)", str(e.dependency_id)[:8])
        lines.append(format_html('<li class="dbw-dependency">{} &middot; {}: {}</li>', what,
                                 e.condition, e.state))
    return format_html("<ol>{}</ol>", format_html_join("", "{}", ((line,) for line in lines)))
