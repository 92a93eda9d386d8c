"""The migration operation that adds the flag columns of ``PartialIndex`` where a database
has no partial indexes (``db.partial``). A module of its own: only ``migrate`` and
``makemigrations`` need Django's migration operations, not the processes that import the
models (``partial.__getattr__`` still serves it under its first path,
``django_dbworker.db.partial.WherePartialIndexesLack``, which migration 0007 names)."""

from __future__ import annotations

from typing import Any

from django.db import migrations

from .partial import PartialIndex, flag_column_sql, has_partial_indexes


class WherePartialIndexesLack(migrations.SeparateDatabaseAndState):
    """Migration operations that change only the state on databases with partial indexes
    (where the indexes and constraints they swap are the same SQL), and run on the others,
    with the flag column of every ``PartialIndex`` they add added first (and dropped after
    the indexes when reversed)."""

    def __init__(self, operations: list[Any]) -> None:
        super().__init__(database_operations=operations, state_operations=operations)

    def deconstruct(self) -> Any:
        return (self.__class__.__qualname__, [], {"operations": self.state_operations})

    def _flagged(self, app_label: str, state: Any) -> list[tuple[Any, PartialIndex]]:
        found: dict[tuple[str, str], tuple[Any, PartialIndex]] = {}
        for operation in self.database_operations:
            index = getattr(operation, "index", None)
            if isinstance(operation, migrations.AddIndex) and isinstance(index, PartialIndex):
                model = state.apps.get_model(app_label, operation.model_name)
                found.setdefault((model._meta.db_table, index.flag), (model, index))
        return list(found.values())

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if has_partial_indexes(schema_editor.connection):
            return
        for model, index in self._flagged(app_label, to_state):
            schema_editor.execute(flag_column_sql(model, index, schema_editor.quote_name))
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        if has_partial_indexes(schema_editor.connection):
            return
        super().database_backwards(app_label, schema_editor, from_state, to_state)
        q = schema_editor.quote_name
        for model, index in self._flagged(app_label, from_state):
            schema_editor.execute(f"ALTER TABLE {q(model._meta.db_table)} "
                                  f"DROP COLUMN {q(index.flag)}")


class AddFlaggedIndex(migrations.AddIndex):
    """``AddIndex`` of a ``PartialIndex`` whose flag column is new (migrations import it
    from here, as only they need it): where the database has no partial indexes, the
    column is added first (and dropped after the index when reversed); elsewhere a plain
    ``AddIndex`` of the partial index."""

    index: PartialIndex

    def database_forwards(self, app_label: str, schema_editor: Any, from_state: Any,
                          to_state: Any) -> None:
        if not has_partial_indexes(schema_editor.connection):
            model = to_state.apps.get_model(app_label, self.model_name)
            schema_editor.execute(flag_column_sql(model, self.index, schema_editor.quote_name))
        super().database_forwards(app_label, schema_editor, from_state, to_state)

    def database_backwards(self, app_label: str, schema_editor: Any, from_state: Any,
                           to_state: Any) -> None:
        super().database_backwards(app_label, schema_editor, from_state, to_state)
        if not has_partial_indexes(schema_editor.connection):
            model = from_state.apps.get_model(app_label, self.model_name)
            q = schema_editor.quote_name
            schema_editor.execute(f"ALTER TABLE {q(model._meta.db_table)} "
                                  f"DROP COLUMN {q(self.index.flag)}")
