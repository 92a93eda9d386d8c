"""Small SQL expressions the read model needs on every database (their SQL: the engine's)."""

from __future__ import annotations

from typing import Any

from django.db.models import CharField, FloatField, Func

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


class SecondsBetween(Func):
    """Seconds from the first time to the second, as a float, in the database's own SQL:
    never a Python function called per row (Django's SQLite subtraction of two
    DateTimeFields calls ``django_timestamp_diff`` for each)."""

    output_field = FloatField()
    arity = 2

    def as_sql(self, compiler: Any, connection: Any, function: str | None = None,
               template: str | None = None, arg_joiner: str | None = None,
               **extra_context: Any) -> tuple[str, Any]:
        (first, p1), (second, p2) = (compiler.compile(e) for e in self.get_source_expressions())
        text, second_first = engine_for(connection).seconds_between()
        return text.format(first=first, second=second), \
            [*p2, *p1] if second_first else [*p1, *p2]
