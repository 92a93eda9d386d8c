"""The admin's actions on every supported Django: Django 6.1 added actions on the change
form (``ActionLocation``, ``@admin.action(location=..., description_plural=...)``, actions
as ``Action`` objects); on Django 5.2 and 6.0 they are on the change list only, and an
action is a ``(function, name, description)`` tuple.

Our admins use these names instead of Django's (docs/compatibility.md).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import django
from django.contrib import admin
from django.http import HttpRequest

#: Whether Django offers actions on the change form (6.1 and later).
FORM_ACTIONS = django.VERSION >= (6, 1)

if TYPE_CHECKING or FORM_ACTIONS:
    from django.contrib.admin import ActionLocation
else:
    class ActionLocation(enum.Enum):
        """Django 6.1's, for the code that names one: only CHANGE_LIST has actions."""

        CHANGE_FORM = "CHANGE_FORM"
        CHANGE_LIST = "CHANGE_LIST"


def action(*, location: list[ActionLocation], description: str,
           description_plural: str, permissions: list[str] | None = None
           ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``@admin.action(...)``; before Django 6.1 the change list shows ``description_plural``
    (a list action runs on the selected rows) and ``location`` has no effect."""
    if FORM_ACTIONS:
        return admin.action(permissions=permissions, description=description,
                            description_plural=description_plural, location=location)
    return admin.action(permissions=permissions, description=description_plural)


def base_actions(parent: Any, request: HttpRequest, location: ActionLocation) -> Any:
    """``parent.get_actions(request, action_location=location)`` (``parent``: a
    ``super()``); before Django 6.1 the change form has none."""
    if FORM_ACTIONS:
        return parent.get_actions(request, action_location=location)
    return parent.get_actions(request) if location == ActionLocation.CHANGE_LIST else {}


def get_action(model_admin: Any, name: str, location: ActionLocation) -> Any:
    """``model_admin.get_action(name, location)``: an action, or None."""
    if FORM_ACTIONS:
        return model_admin.get_action(name, location)
    return model_admin.get_action(name) if location == ActionLocation.CHANGE_LIST else None


def action_name(found: Any) -> str:
    return str(found.name if FORM_ACTIONS else found[1])


def with_func(found: Any, func: Callable[..., Any]) -> Any:
    """The action ``found`` running ``func`` instead."""
    if FORM_ACTIONS:
        return replace(found, func=func)
    return (func, *found[1:])
