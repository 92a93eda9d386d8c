"""One row by primary key, read as ``Model._default_manager.get(pk=...)`` reads it.

The runner reads a unit's source row, and the task runner its task row, once or twice per
unit; building and compiling that ``get()`` costs more than running it. When the default
manager is a plain one (its queryset is the same SQL every time) and selects no related
rows, the query is compiled once per model and database, and each read runs that SQL with
its own key and builds the instance the way Django's query iterator does: the compiler's
column list and field converters, ``Model.from_db``, annotations as attributes. Any other
manager gets ``get()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ObjectDoesNotExist
from django.core.signals import setting_changed
from django.db import connections, models

from . import engine_for
from .keys import pk_field


@dataclass(frozen=True, slots=True)
class Reader:
    """The compiled ``filter(pk=...)`` of one model and database, and how to read its row."""

    sql: str
    params: tuple[Any, ...]
    slot: int  # where the primary key goes in ``params``
    compiler: Any
    converters: dict[int, Any]
    fields: slice  # the model's columns in a row
    names: list[str]  # their attribute names, for Model.from_db
    annotations: dict[str, int]  # annotation name -> column

    def read[M: models.Model](self, model: type[M], pk: Any, using: str,
                              first: bool = False) -> M | None:
        connection = connections[using]
        rows = engine_for(connection).read(connection, self.sql, self.bind(pk), first=first)
        return self.instance(model, rows, using)

    def bind(self, pk: Any) -> list[Any]:
        """The parameters of ``sql`` for the row of primary key ``pk`` (a database value)."""
        params = list(self.params)
        params[self.slot] = pk
        return params

    def instance[M: models.Model](self, model: type[M], rows: list[tuple[Any, ...]],
                                  using: str) -> M | None:
        """The instance of what ``sql`` returned (None: no row)."""
        if not rows:
            return None
        if self.converters:
            rows = list(self.compiler.apply_converters(rows, self.converters))
        row = rows[0]
        instance = model.from_db(using, self.names, row[self.fields])
        for name, position in self.annotations.items():
            setattr(instance, name, row[position])
        return instance


_readers: dict[Hashable, Reader | None] = {}
_UNKNOWN: Any = object()


def get[M: models.Model](model: type[M], pk: Any, using: str,
                         annotations: dict[str, Any] | None = None, *,
                         first: bool = False) -> M:
    """The row of ``model`` with primary key ``pk``; raises ``model.DoesNotExist``.

    ``first``: the read is the first statement of the transaction just opened (its BEGIN
    may go with it: ``postgresql.execute_first``)."""
    reader = _reader_of(model, using, annotations)
    if reader is None:
        manager = model._default_manager.db_manager(using)
        qs = manager.annotate(**annotations) if annotations else manager.all()
        return qs.get(pk=pk)
    instance = reader.read(model, _prep(model, pk, using), using, first)
    if instance is None:
        raise does_not_exist(model)(
            f"{model._meta.object_name} matching query does not exist.")
    return instance


def statement(model: type[models.Model], pk: Any, using: str,
              annotations: dict[str, Any] | None = None) -> tuple[Reader, list[Any]] | None:
    """What ``get`` would send for the row of ``model`` with primary key ``pk``, without
    sending it: the ``Reader`` (its ``sql``, and ``instance`` for the rows it returns) and
    the parameters; None where ``get`` runs the manager's own ``get()``."""
    reader = _reader_of(model, using, annotations)
    if reader is None:
        return None
    return reader, reader.bind(_prep(model, pk, using))


def _reader_of(model: type[models.Model], using: str,
               annotations: dict[str, Any] | None) -> Reader | None:
    key = (using, connections[using].vendor, model, tuple(annotations or ()))
    reader = _readers.get(key, _UNKNOWN)
    if reader is _UNKNOWN:  # the manager is copied for the database only then (a tenth
        manager = model._default_manager.db_manager(using)  # of a cached read's time)
        reader = _readers[key] = _reader(manager, annotations or {}, using)
    return reader


def does_not_exist(model: type[models.Model]) -> type[ObjectDoesNotExist]:
    """``model.DoesNotExist``. Sources are concrete models (``registry``), which all have
    it; django-stubs declares it only on the concrete models it sees."""
    return model.DoesNotExist  # type: ignore[attr-defined]  # any concrete model: see above


def _reader(manager: models.Manager[Any], annotations: dict[str, Any],
            using: str) -> Reader | None:
    """Compile ``filter(pk=...)`` once; None when the query may not be reused."""
    if type(manager).get_queryset is not models.Manager.get_queryset:
        return None  # a custom get_queryset() may change its SQL between calls
    probes = _probes(manager.model)
    if probes is None:
        return None
    qs = manager.annotate(**annotations) if annotations else manager.all()
    compiled = []
    for probe in probes:
        compiler = qs.filter(pk=probe).query.get_compiler(using)
        sql, params = compiler.as_sql()
        compiled.append((compiler, sql, list(params)))
    (compiler, sql, params), (_, other_sql, other_params) = compiled
    slots = [i for i, (a, b) in enumerate(zip(params, other_params, strict=False)) if a != b]
    info = compiler.klass_info
    if (sql != other_sql or len(params) != len(other_params) or len(slots) != 1
            or params[slots[0]] != _prep(manager.model, probes[0], using)
            or not info or info.get("related_klass_infos")):
        return None
    select = compiler.select
    first, last = info["select_fields"][0], info["select_fields"][-1] + 1
    return Reader(
        sql=sql, params=tuple(params), slot=slots[0], compiler=compiler,
        converters=compiler.get_converters([column[0] for column in select]),
        fields=slice(first, last),
        names=[column[0].target.attname for column in select[first:last]],
        annotations=dict(compiler.annotation_col_map or {}),
    )


def _probes(model: type[models.Model]) -> list[Any] | None:
    """Two primary key values of the model's type that tell its parameter apart."""
    field = pk_field(model)
    if isinstance(field, models.IntegerField):
        return [-1, -2]
    if isinstance(field, models.UUIDField):
        return [uuid.UUID(int=1), uuid.UUID(int=2)]
    if isinstance(field, models.CharField):
        return ["\x01dbworker-a", "\x01dbworker-b"]
    return None


def _prep(model: type[models.Model], value: Any, using: str) -> Any:
    field = pk_field(model)
    return field.get_db_prep_value(field.to_python(value), connections[using], prepared=False)


@dataclass(frozen=True, slots=True)
class Columns:
    """Every column of a model as a statement's ``RETURNING`` list, and how to turn the rows
    it returns into instances as the query iterator would (its field converters)."""

    sql: str
    names: list[str]  # attribute names, for Model.from_db
    compiler: Any
    converters: dict[int, Any]

    def values(self, rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """``rows`` as Python values (JSON parsed, UUIDs and datetimes typed)."""
        if self.converters:
            return [tuple(r) for r in self.compiler.apply_converters(rows, self.converters)]
        return rows

    def instance[M: models.Model](self, model: type[M], using: str,
                                  values: tuple[Any, ...]) -> M:
        return model.from_db(using, self.names, values)


_columns: dict[Hashable, Columns] = {}


def columns(model: type[models.Model], using: str) -> Columns:
    """The ``Columns`` of ``model`` on ``using``, compiled once per process."""
    key = (using, connections[using].vendor, model)
    if key not in _columns:
        compiler = model._base_manager.db_manager(using).all().query.get_compiler(using)
        compiler.setup_query()
        select = [column[0] for column in compiler.select]
        quote = connections[using].ops.quote_name
        _columns[key] = Columns(
            sql=", ".join(quote(expression.target.column) for expression in select),
            names=[expression.target.attname for expression in select],
            compiler=compiler,
            converters=compiler.get_converters(select),
        )
    return _columns[key]


def forget(**kwargs: Any) -> None:
    _readers.clear()
    _columns.clear()


setting_changed.connect(forget, dispatch_uid="dbworker-source-readers")
