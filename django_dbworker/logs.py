"""One package logger; every event is a word plus key=value context, or one JSON object."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

logger = logging.getLogger("django_dbworker")


def _format(value: Any) -> str:
    text = str(value)
    if "\n" in text or "\r" in text:  # one event, one line (psycopg's errors span several)
        text = text.replace("\r", "\\r").replace("\n", "\\n")
    if not text or any(ch in text for ch in ' "='):
        return '"' + text.replace('"', '\\"') + '"'
    return text


def log_event(level: int, event: str, **fields: Any) -> None:
    if not logger.isEnabledFor(level):
        return
    context = " ".join(f"{k}={_format(v)}" for k, v in fields.items() if v not in (None, ""))
    logger.log(level, "%s %s", event, context, extra={"event": event, "fields": fields})


def _plain(value: Any) -> Any:
    """A JSON value for a log field: numbers, strings, booleans as they are; else text."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, event and the event's fields.

    Use it in ``LOGGING`` (``"()": "django_dbworker.logs.JsonFormatter"``), or run
    ``runworkers --log-format json``. Records not written by ``log_event`` carry their
    message as ``event``.
    """

    def format(self, record: logging.LogRecord) -> str:
        event = getattr(record, "event", None)
        document: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": event if event is not None else record.getMessage(),
        }
        if event is not None:
            fields = getattr(record, "fields", {}) or {}
            document.update({k: _plain(v) for k, v in fields.items()
                             if k not in document and v not in (None, "")})
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        return json.dumps(document, ensure_ascii=False)
