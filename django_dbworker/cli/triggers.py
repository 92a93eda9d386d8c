"""``dbworker triggers [status|install|remove] [--worker W ...]``: the optional database
triggers of row workers (``rows/triggers.py``), as one document."""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError

from ..exceptions import TriggerUnavailable, UnknownWorker
from ..rows import triggers as row_triggers
from . import OperationError

ACTIONS = ("status", "install", "remove")


def triggers(action: str, names: list[str] | None) -> dict[str, Any]:
    """Do ``action`` for the named workers (default: all); the document: ``action``,
    ``changed`` (the workers whose triggers were written or dropped) and ``workers``, the
    status of each named (or every) worker's triggers afterwards."""
    try:
        changed: list[str] = []
        if action == "install":
            changed = row_triggers.install(workers=names)
        elif action == "remove":
            changed = row_triggers.remove(workers=names)
        states = row_triggers.status()
        if action == "status" and names:
            row_triggers.named(names, also=states)
    except (UnknownWorker, TriggerUnavailable, NotSupportedError) as exc:
        raise OperationError(str(exc)) from None
    shown = [s.as_dict() for name, s in states.items() if not names or name in names]
    return {"action": action, "changed": changed, "workers": shown}
