"""django-dbworker: your Django database as the background-work engine."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = [
    "Context",
    "ExecutionStatus",
    "Finished",
    "Outcome",
    "Snooze",
    "Unfinished",
    "after_row",
    "cancel",
    "chain",
    "cron",
    "dependency_results",
    "execution_status",
    "group",
    "has_execution_status",
    "has_task_status",
    "pause",
    "paused",
    "resume",
    "set_progress",
    "start",
    "task",
    "worker",
    "workers",
]

from .context import Context
from .outcomes import Finished, Outcome, Snooze, Unfinished

if TYPE_CHECKING:
    from .djtasks import task
    from .models import ExecutionStatus
    from .pausing import pause, paused, resume
    from .rows.registry import worker, workers
    from .rows.status import execution_status, has_execution_status
    from .supervisor.embedding import start
    from .tasks.schedules import cron
    from .tasks.store import cancel
    from .units.progress import set_progress
    from .workflows.builder import chain, group
    from .workflows.results import dependency_results
    from .workflows.rows import after_row
    from .workflows.task_status import has_task_status

_LAZY = {
    "cancel": ("tasks.store", "cancel"),
    "chain": ("workflows.builder", "chain"),
    "group": ("workflows.builder", "group"),
    "cron": ("tasks.schedules", "cron"),
    "dependency_results": ("workflows.results", "dependency_results"),
    "set_progress": ("units.progress", "set_progress"),
    "start": ("supervisor.embedding", "start"),
    "task": ("djtasks", "task"),
    "pause": ("pausing", "pause"),
    "paused": ("pausing", "paused"),
    "resume": ("pausing", "resume"),
    "ExecutionStatus": ("models", "ExecutionStatus"),
    "worker": ("rows.registry", "worker"),
    "workers": ("rows.registry", "workers"),
    "execution_status": ("rows.status", "execution_status"),
    "has_execution_status": ("rows.status", "has_execution_status"),
    "after_row": ("workflows.rows", "after_row"),
    "has_task_status": ("workflows.task_status", "has_task_status"),
}


def __getattr__(name: str) -> Any:
    # Models can only be imported once the app registry is ready; import them on first use
    # so that `from django_dbworker import Finished` works in settings-free code too.
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'django_dbworker' has no attribute {name!r}") from None
    from importlib import import_module

    value = getattr(import_module(f".{module}", __name__), attribute)
    globals()[name] = value
    return value
