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


class KeyText(Cast):
    """A source pk cast to text as ``source_id`` holds it; on MariaDB/MySQL in the column's
    collation (``utf8mb4_bin``, ``db.partial.KeyField``): a cast takes the connection's
    collation, and comparing two collations is an error there (or, converted, an index
    that cannot be used)."""

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = compiler.compile(self.source_expressions[0])
        return f"CAST({sql} AS CHAR CHARACTER SET utf8mb4) COLLATE utf8mb4_bin", params


def key_expression(expression: Any) -> Cast:
    """SQL for a source pk expression cast to the text stored in ``source_id``."""
    return KeyText(expression, output_field=models.CharField())


class PkCast(Cast):
    """``source_id`` cast back to the primary key's type; a text key on MariaDB/MySQL in the
    key column's own collation, so the comparison can use its index (a cast takes the
    connection's collation, and two collations may not meet there)."""

    def __init__(self, expression: Any, output_field: Any, model: type[models.Model]) -> None:
        super().__init__(expression, output_field=output_field)
        self.model = model

    def as_mysql(self, compiler: Any, connection: Any, **extra: Any) -> Any:
        sql, params = super().as_mysql(compiler, connection, **extra)
        if isinstance(self.output_field, models.CharField):
            field = pk_field(self.model)
            collation = column_collation(connection, self.model._meta.db_table,
                                         cast(str, field.column))
            if collation:
                sql = f"({sql} COLLATE {collation})"
        return sql, params


#: ``(alias, table, column) -> collation`` of text key columns (MariaDB/MySQL).
_collations: dict[tuple[str, str, str], str | None] = {}


def column_collation(connection: Any, table: str, column: str) -> str | None:
    """The collation of ``table.column`` as the database's catalog has it (cached)."""
    key = (connection.alias, table, column)
    if key not in _collations:
        with connection.cursor() as cursor:
            cursor.execute("SELECT collation_name FROM information_schema.columns WHERE "
                           "table_schema = DATABASE() AND table_name = %s AND column_name = %s",
                           [table, column])
            row = cursor.fetchone()
        found = row[0] if row else None
        _collations[key] = found if found and found.replace("_", "").isalnum() else None
    return _collations[key]


def pk_expression(model: type[models.Model], expression: Any) -> Cast:
    """SQL for a ``source_id`` expression cast back to the model's primary key type."""
    field = pk_field(model)
    if isinstance(field, models.IntegerField):
        output: models.Field = models.BigIntegerField()
    elif isinstance(field, models.CharField):
        output = models.CharField(max_length=field.max_length)
    else:
        output = field.__class__()
    return PkCast(expression, output, model)
