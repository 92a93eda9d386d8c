"""How a source row's primary key is stored in ``Execution.source_id`` and read back.

``source_id`` is text. The key of a row is its primary key as the database itself casts it
to text, so that ``has_execution_status()`` can compare ``CAST(pk AS text)`` in SQL with the
keys we write from Python (UUIDs are hex on SQLite, hyphenated on PostgreSQL).
"""

from __future__ import annotations

from typing import Any, cast

from django.db import connections, models
from django.db.models.functions import Cast


def pk_field(model: type[models.Model]) -> models.Field[Any, Any]:
    """The concrete column behind the model's primary key (follows parent links)."""
    field = model._meta.pk
    while field is not None and field.is_relation:
        field = cast("models.ForeignKey[Any, Any]", field).target_field  # a parent link
    return field


def column_field(model: type[models.Model], name: str) -> models.Field[Any, Any]:
    """``model._meta.get_field(name)`` for one of the model's own columns (django-stubs
    also allows a reverse relation there, which our names never are)."""
    return cast("models.Field[Any, Any]", model._meta.get_field(name))


def column_name(model: type[models.Model], name: str) -> str:
    """The database column of the model's own field ``name`` (never None for a column)."""
    return cast(str, column_field(model, name).column)


def has_integer_pk(model: type[models.Model]) -> bool:
    return isinstance(pk_field(model), models.IntegerField)


def to_key(model: type[models.Model], pk: Any, using: str) -> str:
    field = pk_field(model)
    value = field.get_db_prep_value(field.to_python(pk), connections[using], prepared=False)
    return str(value)


def from_key(model: type[models.Model], key: str) -> Any:
    return pk_field(model).to_python(key)


def sort_key(model: type[models.Model], pk: Any) -> int | None:
    return int(pk) if has_integer_pk(model) else None


def key_expression(expression: Any) -> Cast:
    """SQL for a source pk expression cast to the text stored in ``source_id``."""
    return Cast(expression, output_field=models.CharField())


def pk_expression(model: type[models.Model], expression: Any) -> Cast:
    """SQL for a ``source_id`` expression cast back to the model's primary key type."""
    field = pk_field(model)
    if isinstance(field, models.IntegerField):
        output: models.Field = models.BigIntegerField()
    elif isinstance(field, models.CharField):
        output = models.CharField(max_length=field.max_length)
    else:
        output = field.__class__()
    return Cast(expression, output_field=output)
