"""The claim query: waiting units of one worker whose source rows are eligible, in order.

It starts from the claim index (only PENDING/UNFINISHED units of the worker are in it) and
probes the source table by primary key for each candidate, so its cost follows the pending
work and never the finished history. For integer-pk workers ordered by pk (the default),
the index order is the claim order and the scan stops after ``limit`` eligible units.

Two details keep it that way (``tests/test_claim_plan.py`` checks the plans):

- The states are written into the SQL as constants, not bound as parameters. A database
  uses a partial index only when it can prove the query's WHERE clause implies the index's;
  SQLite decides that when it prepares the statement, before it sees the parameters, so
  ``state IN (?, ?)`` would leave it scanning the worker's whole history.
- The order ends with ``(sort_key, source_id)``, which is unique per worker, and nothing
  after it: a further tie-breaker (``id``) is not in the index and forces a sort.
- On PostgreSQL the eligibility test stays a probe per waiting unit (``Probe``), never a
  join the planner could answer by hashing the whole source table.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Exists, F, OrderBy, OuterRef, QuerySet, Subquery

from ..db import engine_for, keys
from ..models import Execution
from .registry import Worker


class Probe(Exists):
    """``EXISTS`` that PostgreSQL checks per waiting unit by primary key, never as a join.

    PostgreSQL turns a plain ``EXISTS`` into a semi-join. When the claim must look at every
    waiting unit (an eligible ordered by a column of the source row), the planner may then
    hash the whole source table instead of probing it once per unit, whenever its cost
    model says that is cheaper: with 1,000 units waiting in a 100,000-row table that made a
    claim ten times slower than with 1,000 rows, and it grows with the history. ``OFFSET 0``
    is PostgreSQL's traditional optimisation fence: it keeps the subquery a per-row probe.
    """

    def as_sql(self, compiler: Any, connection: Any, template: str | None = None,
               **extra_context: Any) -> tuple[str, Any]:
        template = template or engine_for(connection).probe_template()
        return super().as_sql(compiler, connection, template=template, **extra_context)


def candidates(worker: Worker, now: datetime, using: str) -> QuerySet[Execution]:
    eligible = worker.eligible_queryset()
    model = worker.source
    pk_of_unit = keys.pk_expression(model, OuterRef("source_id"))
    qs = Execution.objects.using(using).claimable().filter(
        worker=worker.name, available_at__lte=now
    )
    qs = qs.filter(Probe(eligible.order_by().filter(pk=pk_of_unit)))
    return _order(qs, worker, eligible, pk_of_unit)


def _ordering(eligible: QuerySet[Any]) -> list[Any]:
    query = eligible.query
    if query.order_by:
        return list(query.order_by)
    meta_ordering = query.get_meta().ordering
    if query.default_ordering and meta_ordering:
        return list(meta_ordering)
    return ["pk"]


def _pk_direction(item: Any, model: Any) -> str | None:
    """'asc'/'desc' when ``item`` orders by the primary key, else None."""
    if isinstance(item, OrderBy) and isinstance(item.expression, F):
        # F.name: Django sets it in F.__init__; django-stubs do not declare it.
        name, desc = item.expression.name, item.descending  # type: ignore[attr-defined]
    elif isinstance(item, str):
        name, desc = item.removeprefix("-"), item.startswith("-")
    else:
        return None
    pk = model._meta.pk
    return ("desc" if desc else "asc") if name in ("pk", pk.name, pk.attname) else None


def _order(
    qs: QuerySet[Execution], worker: Worker, eligible: QuerySet[Any], pk_of_unit: Any
) -> QuerySet[Execution]:
    ordering = _ordering(eligible)
    if any(item == "?" for item in ordering):
        raise ValueError(f"Worker {worker.name!r}: eligible may not be ordered randomly.")
    by_row = eligible.order_by().filter(pk=pk_of_unit)
    order_by: list[Any] = []
    nulls_first: bool | None
    nulls_last: bool | None
    for i, item in enumerate(ordering):
        direction = _pk_direction(item, worker.source)
        if direction is not None:
            tail = [F("sort_key"), F("source_id")]
            order_by += [f.desc() if direction == "desc" else f.asc() for f in tail]
            break  # the pk is unique: nothing after it can change the order
        if isinstance(item, OrderBy):
            expression, descending = item.expression, item.descending
            nulls_first, nulls_last = item.nulls_first, item.nulls_last
        else:
            expression, descending = F(item.removeprefix("-")), item.startswith("-")
            nulls_first = nulls_last = None
        alias = f"_dbworker_order_{i}"
        value = Subquery(by_row.annotate(_v=expression).values("_v")[:1])
        qs = qs.annotate(**{alias: value})
        order_by.append(
            OrderBy(F(alias), descending=descending, nulls_first=nulls_first,
                    nulls_last=nulls_last)
        )
    else:
        order_by += [F("sort_key").asc(), F("source_id").asc()]
    return qs.order_by(*order_by)
