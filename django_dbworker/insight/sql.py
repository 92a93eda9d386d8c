"""Small SQL expressions the read model needs on both databases."""

from __future__ import annotations

from typing import Any

from django.db import NotSupportedError
from django.db.models import CharField, Func


class LastErrorClass(Func):
    """The ``exception_class_path`` of the last entry of a task's ``errors`` JSON list."""

    output_field = CharField()

    def as_sql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        raise NotSupportedError(f"LastErrorClass is not written for {connection.vendor}.")

    def as_sqlite(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return super().as_sql(compiler, connection,
                              template="json_extract(%(expressions)s, "
                                       "'$[#-1].exception_class_path')", **extra)

    def as_postgresql(self, compiler: Any, connection: Any, **extra: Any) -> tuple[str, Any]:
        return super().as_sql(compiler, connection,
                              template="((%(expressions)s) -> -1 ->> 'exception_class_path')",
                              **extra)
