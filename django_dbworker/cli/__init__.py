"""What ``manage.py dbworker`` does, apart from parsing: look units up, report on them,
plan a change, apply it. Every function returns plain data (JSON-ready mappings); the
command prints it as a table or as one JSON document (schema: docs/cli.md)."""

from ..exceptions import DBWorkerError


class OperationError(DBWorkerError, ValueError):
    """An operator named something that does not exist; the message names it."""
