"""Where a unit's milliseconds go between its commit and its handler: timestamps of the
wake-up and hand-off path, for ``bench/latency_trace.py``.

Off unless the environment variable ``DBWORKER_TRACE`` names a file when this module is
first imported (a supervisor and the children it forks read it once): then ``mark(event)``
appends a line ``<time.time()> <pid> <event> <detail>`` to that file (one ``write`` of an
``O_APPEND`` descriptor per line: the lines of several processes do not mix), and
``statements(using)`` marks the start and the end of every statement that connection runs
through Django's cursors. Off, a trace point costs the test of the module constant ``ON``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

#: The file the marks go to (``DBWORKER_TRACE``); None: tracing is off.
FILE = os.environ.get("DBWORKER_TRACE") or None
ON = FILE is not None
_fd: int | None = None


def mark(event: str, detail: Any = "") -> None:
    """Note that ``event`` happened now (call it only when ``ON``)."""
    global _fd
    if FILE is None:
        return
    if _fd is None:
        _fd = os.open(FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    line = f"{time.time():.6f} {os.getpid()} {event} {detail}".replace("\n", " ")
    os.write(_fd, (line + "\n").encode())


def statements(using: str) -> None:
    """Mark every statement ``using`` runs in this process (``sql`` before it is sent,
    ``sql_done`` once its result is in), with its first words."""
    if FILE is None:
        return
    connection = connections[using]
    if _marking not in connection.execute_wrappers:
        connection.execute_wrappers.append(_marking)


def _marking(execute: Callable[..., Any], sql: str, params: Any, many: bool,
             context: dict[str, Any]) -> Any:
    words = " ".join(str(sql).split())[:300]
    mark("sql", words)
    try:
        return execute(sql, params, many, context)
    finally:
        mark("sql_done", words)
