"""A changelist paginator that never counts a whole table.

Django's paginator runs ``SELECT COUNT(*)`` over every row the changelist's filters match:
at a million units that read alone takes seconds. ``BoundedPaginator`` counts at most
``BOUND`` rows past the page asked for (``SELECT COUNT(*) FROM (... LIMIT n)``, read through
the index that serves the list's order), so its cost follows the page number, never the
table. When there are more, the count is ``AtLeast``: a number that prints itself as "more
than 10,000", wherever the admin shows it (the pagination line, "Select all ...").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cached_property
from typing import Any

from django.core.paginator import Page, Paginator
from django.http import HttpRequest

from ..db.connections import index_first

#: Rows counted beyond the requested page; more are reported as "more than".
BOUND = 10_000


class AtLeast(int):
    """A count that stopped at its bound: ``str()`` says "more than N"."""

    def __str__(self) -> str:
        return f"more than {int(self):,}"


class BoundedPaginator(Paginator):
    def __init__(self, object_list: Any, per_page: int, orphans: int = 0,
                 allow_empty_first_page: bool = True, *, page: int = 1,
                 bound: int = BOUND,
                 rows_by_key: Callable[[list[Any]], Any] | None = None) -> None:
        super().__init__(object_list, per_page, orphans, allow_empty_first_page)
        # Enough to validate the page asked for and show the page links after it.
        self.bound = max(page + 5, 1) * per_page + bound
        self.rows_by_key = rows_by_key

    @cached_property
    def count(self) -> int:
        # Only the keys: the list's annotations (subqueries per row) are not counted.
        rows: Any = self.object_list
        with index_first(rows.db):
            counted = rows.order_by().values("pk")[: self.bound + 1].count()
        return AtLeast(self.bound) if counted > self.bound else counted

    def page(self, number: Any) -> Page:
        """The page's keys first, walking the index of the list's order, then its rows by
        key: the rows skipped before a deep page cost an index entry each, not a row with
        the list's per-row subqueries. Both statements (and the count) run ``index_first``:
        without statistics PostgreSQL's planner sorts the whole table for any page past the
        first few, and reads a whole small table for a page's keys."""
        page = super().page(number)
        if self.rows_by_key is None or not hasattr(page.object_list, "values_list"):
            return page
        keyed = page.object_list.values_list("pk", flat=True)
        with index_first(keyed.db):
            keys = list(keyed)
            by_key = {obj.pk: obj for obj in self.rows_by_key(keys)}
        page.object_list = [by_key[k] for k in keys if k in by_key]
        return page


def page_number(request: HttpRequest) -> int:
    """The changelist's page (Django's ``?p=``, counted from 1)."""
    try:
        return max(int(request.GET.get("p", 1)), 1)
    except ValueError:
        return 1


class BoundedChangelist:
    """Mixed into a ModelAdmin: its changelist counts with ``BoundedPaginator`` and shows
    no full count."""

    show_full_result_count = False

    def get_paginator(self, request: HttpRequest, queryset: Any, per_page: int,
                      orphans: int = 0, allow_empty_first_page: bool = True) -> Paginator:
        def rows_by_key(keys: list[Any]) -> Any:
            # The admin's rows with its annotations, without the list's filters (the keys
            # passed them already; their joins would only cost).
            return self.get_queryset(request).filter(pk__in=keys)  # type: ignore[attr-defined]

        return BoundedPaginator(queryset, per_page, orphans, allow_empty_first_page,
                                page=page_number(request), rows_by_key=rows_by_key)
