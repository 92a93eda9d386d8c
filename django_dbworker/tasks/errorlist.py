"""A task's stored errors (``TaskRecord.errors``, a JSON list): one entry per failed
attempt, and what of a stored list a new entry is added to."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from ..units.failures import FailureInfo


def error_entry(info: FailureInfo, attempt: int, when: datetime) -> dict[str, Any]:
    return {
        "exception_class_path": info.exception_class,
        "message": info.message,
        "traceback": info.traceback,
        "attempt": attempt,
        "at": when.isoformat(),
    }


def kept_errors(stored: Any) -> list[Any]:
    """The stored errors a new one is added to: only the objects of a list (a value
    changed outside django-dbworker, say by an UPDATE, is not kept)."""
    if not isinstance(stored, list):
        return []
    return [e for e in stored if isinstance(e, dict)
            and isinstance(e.get("exception_class_path"), str)
            and isinstance(e.get("traceback"), str)]
