"""Admin actions that change units: permission-checked, confirmed when several rows are
selected, and refused with 403 when the request was forged.

Django removes an action the user may not run from the page, but a forged POST naming it
would only get "No action selected". ``GuardedActions`` answers such a POST with 403, and
every action checks its permission again before it changes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import django
from django.contrib import messages
from django.contrib.admin import helpers
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.text import capfirst

from .djadmin import FORM_ACTIONS, ActionLocation, base_actions

#: At most this many selected rows are listed on the confirmation page.
LISTED = 100
#: Rows changed per statement by an action: each batch is its own short transaction.
BATCH = 1_000


def _batches(queryset: QuerySet[Any]) -> Iterator[list[Any]]:
    """The primary keys of ``queryset`` in batches of ``BATCH``, by keyset on the key."""
    rows = queryset.order_by("pk").values_list("pk", flat=True)
    pks = list(rows[:BATCH])
    while pks:
        yield pks
        if len(pks) < BATCH:
            return
        pks = list(rows.filter(pk__gt=pks[-1])[:BATCH])


@dataclass(frozen=True, slots=True)
class Change:
    """What an action does: which rows it changes, and how."""

    name: str
    #: e.g. "Retry"; the button and the confirmation page's title use it.
    verb: str
    #: e.g. "failed executions": what it changes, shown in messages.
    what: str
    #: The selected rows it would change (the guard of its UPDATE, read beforehand).
    changeable: Callable[[QuerySet[Any]], QuerySet[Any]]
    #: Change these primary keys; return how many changed.
    apply: Callable[[list[Any]], int]
    #: What happens to a row, for the confirmation page.
    effect: str


class GuardedActions:
    """Mixed into a ModelAdmin whose actions are built with ``run_change``."""

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> Any:
        self._refuse_forged(request, "action", ActionLocation.CHANGE_LIST)
        return super().changelist_view(request, extra_context)  # type: ignore[misc]

    def changeform_view(self, request: HttpRequest, object_id: Any = None, form_url: str = "",
                        extra_context: Any = None) -> Any:
        field = f"{ActionLocation.CHANGE_FORM.value}-action"
        self._refuse_forged(request, field, ActionLocation.CHANGE_FORM)
        return super().changeform_view(  # type: ignore[misc]
            request, object_id, form_url, extra_context)

    def _refuse_forged(self, request: HttpRequest, field: str,
                       location: ActionLocation) -> None:
        if request.method != "POST":
            return
        allowed = base_actions(self, request, location)
        for name in request.POST.getlist(field):
            if name and name not in allowed:
                if location == ActionLocation.CHANGE_FORM and not FORM_ACTIONS:
                    raise PermissionDenied(
                        f"Actions on a change page need Django 6.1 (this is Django "
                        f"{django.get_version()}); run {name!r} from the list page.")
                raise PermissionDenied(f"You may not run the action {name!r} here.")

    def run_change(self, request: HttpRequest, queryset: QuerySet[Any], change: Change,
                   *, permitted: bool) -> HttpResponse | None:
        """Check, confirm when several rows are selected, then apply ``change`` in batches
        of ``BATCH`` primary keys: "select all" of a million rows never loads them."""
        if not permitted:
            raise PermissionDenied(f"You may not {change.verb.lower()} {change.what}.")
        count = queryset.order_by().count()
        if count > 1 and request.POST.get("post") != "yes":
            return self._confirm(request, queryset, count, change)
        changed, batches = 0, 0
        logged: list[Any] = []
        for pks in _batches(change.changeable(queryset)):
            changed += change.apply(pks)
            batches += 1
            logged += pks[:LISTED * 10 - len(logged)]
        self._log(request, queryset.model, logged, change)
        left = count - changed
        text = f"{change.verb}: {changed} of {count} selected {change.what} changed"
        text += f", in {batches} batches of up to {BATCH:,}." if batches > 1 else "."
        if left:
            text += f" {left} could not be changed ({change.effect}) and were left as they were."
        level = messages.SUCCESS if changed else messages.WARNING
        self.message_user(request, text, level)  # type: ignore[attr-defined]
        return None

    def _confirm(self, request: HttpRequest, queryset: QuerySet[Any], count: int,
                 change: Change) -> TemplateResponse:
        opts = queryset.model._meta
        listed = list(queryset[:LISTED])
        will = set(change.changeable(queryset.filter(pk__in=[o.pk for o in listed]))
                   .values_list("pk", flat=True))
        across = request.POST.get("select_across", "0")
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": f"{change.verb} {count} {change.what}?",
            "opts": opts,
            "app_label": opts.app_label,
            "change": change,
            "rows": [(obj, obj.pk in will) for obj in listed],
            "more": max(count - LISTED, 0),
            "count": count,
            "changing": change.changeable(queryset).order_by().count(),
            # "Select all": the action runs on the changelist's query again, not on keys.
            "pks": [] if across == "1" else [obj.pk for obj in listed],
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "select_across": across,
            "verbose_name": capfirst(opts.verbose_name),
        }
        return TemplateResponse(request, "admin/django_dbworker/confirm_action.html", context)

    def _log(self, request: HttpRequest, model: Any, pks: list[Any], change: Change) -> None:
        if not pks:
            return
        user_id = request.user.pk
        assert user_id is not None, "the admin serves logged-in staff only"
        LogEntry.objects.log_actions(
            user_id=user_id,
            queryset=model._default_manager.filter(pk__in=pks[:LISTED * 10]),
            action_flag=CHANGE,
            change_message=f"{change.verb} ({change.name})",
        )
