"""Small SQL expressions the read model needs on every database (their SQL: the engine's)."""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, Func

from ..db import engine_for


class LastErrorClass(Func):
    """The ``exception_class_path`` of the last entry of a task's ``errors`` JSON list."""

    output_field = CharField()

    def as_sql(self, compiler: Any, connection: Any, function: str | None = None,
               template: str | None = None, arg_joiner: str | None = None,
               **extra_context: Any) -> tuple[str, Any]:
        template = engine_for(connection).json_last("exception_class_path")
        return super().as_sql(compiler, connection, function=function, template=template,
                              arg_joiner=arg_joiner, **extra_context)
