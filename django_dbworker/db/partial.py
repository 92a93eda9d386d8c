"""Indexes over the rows in a state set, on databases with and without partial indexes.

PostgreSQL and SQLite index only the rows a condition holds for (``WHERE state IN (...)``),
so a claim reads the waiting units and never the finished history. MariaDB and MySQL have no
partial indexes: there each such index leads with a *flag*, a virtual generated column that
is 1 for the rows in the state set and 0 for the others (``flag_column_sql``), and the
queries name the flag (``InStates``), so they read only the flagged part of the index. The
index still holds an entry per row, but a claim walks ``flag = 1`` and its cost follows
the waiting work as on the other two databases.

Uniqueness where a column is set (``UniqueUnlessNull``) needs no condition at all on
MariaDB/MySQL: a unique index there never compares NULLs, so a plain one enforces exactly
the guarantee the partial one gives elsewhere.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.core import checks
from django.db import models
from django.db.models import F, Lookup, Q
from django.db.models.expressions import Col

#: Django's warnings about what a database lacks that these classes make up for.
_ANSWERED = {"models.W036", "models.W037", "models.W043"}


def has_partial_indexes(connection: Any) -> bool:
    return bool(connection.features.supports_partial_indexes)


def condition_states(condition: Q) -> tuple[str, tuple[str, ...]]:
    """``(field, states)`` of a condition ``Q(field__in=[...])`` or ``Q(field=value)``,
    possibly ANDed with more terms after it (a *guard*: a term only the queries meant to
    use the index state, so that other queries cannot; on MariaDB/MySQL the flag alone
    decides, and the guard is a plain filter there)."""
    if not condition.children or condition.negated or condition.connector != Q.AND \
            or not isinstance(condition.children[0], tuple):
        raise ValueError(f"not a condition on one field's values: {condition!r}")
    lookup, value = condition.children[0]
    if lookup.endswith("__in"):
        return lookup[:-4], tuple(str(v) for v in value)
    if "__" in lookup:
        raise ValueError(f"not a condition on one field's values: {condition!r}")
    return lookup, (str(value),)


class PartialIndex(models.Index):
    """``models.Index(..., condition=Q(state__in=[...]))`` that MariaDB and MySQL get too,
    as an index leading with the generated column ``flag`` (added by the migration that
    adds the index: ``flag_column_sql``)."""

    def __init__(self, *expressions: Any, flag: str, **kwargs: Any) -> None:
        super().__init__(*expressions, **kwargs)
        if self.condition is None or self.expressions:
            raise ValueError("PartialIndex needs a condition, and fields (\"-name\": "
                             "descending), not expressions")
        self.flag = flag
        self.field, self.states = condition_states(self.condition)

    def deconstruct(self) -> Any:
        _, args, kwargs = super().deconstruct()
        kwargs["flag"] = self.flag
        return "django_dbworker.db.partial.PartialIndex", args, kwargs

    def check(self, model: Any, connection: Any) -> list[checks.CheckMessage]:
        return [e for e in super().check(model, connection) if e.id not in _ANSWERED]

    def create_sql(self, model: Any, schema_editor: Any, using: str = "",
                   **kwargs: Any) -> Any:
        connection = schema_editor.connection
        if has_partial_indexes(connection):
            return super().create_sql(model, schema_editor, using=using, **kwargs)
        q = schema_editor.quote_name
        parts = [q(self.flag)] + [
            q(model._meta.get_field(name).column) + (" DESC" if order == "DESC" else "")
            for name, order in self.fields_orders]
        return (f"CREATE INDEX {q(self.name)} ON {q(model._meta.db_table)} "
                f"({', '.join(parts)})")


def flag_column_sql(model: Any, index: PartialIndex, quote: Any) -> str:
    """``ALTER TABLE`` adding ``index.flag``: 1 where the index's condition holds, else 0
    (virtual: nothing stored but the index's entries)."""
    column = quote(model._meta.get_field(index.field).column)
    names = ", ".join(f"'{state}'" for state in _checked(index.states))
    return (f"ALTER TABLE {quote(model._meta.db_table)} ADD COLUMN {quote(index.flag)} "
            f"TINYINT AS ({column} IN ({names})) VIRTUAL")


def _checked(states: Iterable[str]) -> list[str]:
    names = list(states)
    for name in names:
        if not name.isalpha():  # our own state names only: never quote input
            raise ValueError(f"not a state name: {name!r}")
    return names


def flags(model: Any) -> dict[tuple[str, frozenset[str]], str]:
    """``(field, states) -> flag column`` of the model's partial indexes."""
    found = getattr(model._meta, "_dbworker_flags", None)
    if found is None:
        found = {(i.field, frozenset(i.states)): i.flag for i in model._meta.indexes
                 if isinstance(i, PartialIndex)}
        model._meta._dbworker_flags = found
    return found


class InStates(Lookup):
    """``field IN ('A', 'B')`` (``field = 'A'`` for one) with the names in the SQL text, so
    it matches a partial index; where the database has none, the flag column of the
    model's ``PartialIndex`` over the same states (when it has one). A lookup, so MySQL's
    compiler takes it as a condition as it is (it compares other expressions with TRUE,
    which no index serves)."""

    lookup_name = "dbworker_in_states"
    prepare_rhs = False

    def __init__(self, field: str, states: Iterable[str]) -> None:
        self.field_name = field
        self.states = tuple(_checked(str(s) for s in states))
        super().__init__(F(field), self.states)

    def __repr__(self) -> str:
        return f"InStates({self.field_name!r}, {self.states!r})"

    def get_prep_lookup(self) -> Any:
        return self.rhs

    def resolve_expression(self, *args: Any, **kwargs: Any) -> Any:
        resolved = super().resolve_expression(*args, **kwargs)
        resolved.field_name, resolved.states = self.field_name, self.states
        return resolved

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        sql, params = compiler.compile(self.lhs)
        if len(self.states) == 1:
            return f"{sql} = '{self.states[0]}'", tuple(params)
        names = ", ".join(f"'{state}'" for state in self.states)
        return f"{sql} IN ({names})", tuple(params)

    def as_mysql(self, compiler: Any, connection: Any) -> tuple[str, tuple[Any, ...]]:
        col = self.lhs
        if isinstance(col, Col):
            flag = flags(col.target.model).get((self.field_name, frozenset(self.states)))
            if flag is not None:
                quote = compiler.quote_name
                return f"{quote(col.alias)}.{quote(flag)} = 1", ()
        return self.as_sql(compiler, connection)


class UniqueUnlessNull(models.UniqueConstraint):
    """``UniqueConstraint(fields=[f], condition=Q(f__isnull=False))``: where the database
    has no partial indexes, a plain unique index, which gives the same guarantee (a unique
    index never compares NULLs) instead of none (Django's fields.W036)."""

    def _plain(self, connection: Any) -> bool:
        return not has_partial_indexes(connection)

    def _without_condition(self) -> models.UniqueConstraint:
        return models.UniqueConstraint(fields=list(self.fields), name=self.name)

    def deconstruct(self) -> Any:
        _, args, kwargs = super().deconstruct()
        return "django_dbworker.db.partial.UniqueUnlessNull", args, kwargs

    def check(self, model: Any, connection: Any) -> list[checks.CheckMessage]:
        return [e for e in super().check(model, connection) if e.id not in _ANSWERED]

    def constraint_sql(self, model: Any, schema_editor: Any) -> Any:
        if self._plain(schema_editor.connection):
            return self._without_condition().constraint_sql(model, schema_editor)
        return super().constraint_sql(model, schema_editor)

    def create_sql(self, model: Any, schema_editor: Any) -> Any:
        if self._plain(schema_editor.connection):
            return self._without_condition().create_sql(model, schema_editor)
        return super().create_sql(model, schema_editor)

    def remove_sql(self, model: Any, schema_editor: Any) -> Any:
        if self._plain(schema_editor.connection):
            return self._without_condition().remove_sql(model, schema_editor)
        return super().remove_sql(model, schema_editor)


class KeyField(models.CharField):
    """Text compared as keys: byte for byte on MariaDB/MySQL (``utf8mb4_bin``; their
    default collations would make ``'abc'`` and ``'ABC'`` one key), as text compares
    elsewhere."""

    def db_parameters(self, connection: Any) -> dict[str, Any]:
        parameters = super().db_parameters(connection)
        if connection.vendor == "mysql" and not self.db_collation:
            parameters["collation"] = "utf8mb4_bin"
        return parameters

    def deconstruct(self) -> Any:
        name, _, args, kwargs = super().deconstruct()
        return name, "django_dbworker.db.partial.KeyField", args, kwargs


def __getattr__(name: str) -> Any:
    """``WherePartialIndexesLack``, the migration operation, lives in ``flag_migrations``
    and is imported when a migration asks for it here (migration 0007 names it so): a
    supervisor and its children, which import this module with the models, never load
    Django's migration operations and state."""
    if name == "WherePartialIndexesLack":
        from .flag_migrations import WherePartialIndexesLack

        return WherePartialIndexesLack
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
