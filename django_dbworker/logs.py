"""One package logger; every event is a word plus key=value context."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("django_dbworker")


def _format(value: Any) -> str:
    text = str(value)
    if not text or any(ch in text for ch in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def log_event(level: int, event: str, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    context = " ".join(f"{k}={_format(v)}" for k, v in fields.items() if v not in (None, ""))
    logger.log(level, "%s %s", event, context, extra={"event": event, "fields": fields})
