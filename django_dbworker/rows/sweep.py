"""Discovery: source rows written without ``save()`` get their PENDING unit.

Each worker has two passes (docs/workers.md, "How a row becomes a unit"):

- **New rows** (a source whose primary key is an integer: auto-increment keys, the common
  case). Every ``SWEEP_INTERVAL`` the rows above the worker's *watermark*
  (``SweepState.watermark``: the highest key a pass has looked at) are read through the
  primary key index, ``SWEEP_BATCH`` keys at a time; the eligible ones without an execution
  get one and the watermark moves up. When nothing was written, a pass is one indexed query
  that returns no row: its cost follows the new rows, never the history. Keys missing below
  the newest one looked at (*gaps*: a transaction that took its keys and has not committed
  yet, a rolled back insert, a deleted row) are looked at again every pass for ``GAP_WAIT``
  seconds, so rows committed late are found as soon as they are visible.
- **Full**: a walk over every source row by primary key, one chunk a step and paced, that
  adds eligible rows without an execution wherever they are (keys inserted below the
  watermark, rows made eligible by ``update()``, sources without integer keys), then over the
  executions by id range for ones whose source row is gone. It runs every
  ``FULL_SWEEP_INTERVAL`` (and first of all for a source without integer keys, where it is
  the only discovery). Its position is kept in ``SweepState``: one process walks it at a
  time, and a restarted supervisor resumes it.

A chunk of source rows is a key range ``(after, end]``: the server probes the unique index of
executions for each row of it (``Probe``: never a join the planner could misjudge on a table
it has no statistics for yet), and no list of keys is sent back to it.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from datetime import timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.db.models import Max, OuterRef, Q, QuerySet, Value
from django.db.models.functions import Concat
from django.utils import timezone

from .. import conf
from ..db import keys
from ..models import Execution, State, SweepState
from .pending import add_selected
from .queries import Probe
from .registry import Worker

logger = logging.getLogger("django_dbworker")

#: Seconds a gap below the watermark is looked at again before the full pass is left to
#: find what commits in it later (a transaction that holds its keys longer than this).
GAP_WAIT = 600.0
#: Gaps remembered per worker, at most (the newest are kept).
MAX_GAPS = 100
#: Seconds without a step after which another process takes a full pass over.
FULL_TAKEOVER = 120.0
#: Seconds between two writes of a full pass's position (what a restart may walk again).
FULL_SAVE_EVERY = 10.0
#: Seconds between two steps of a full pass (it is background work: paced, never urgent;
#: a step is ~10 ms of the database's time per 1,000 rows, so at most a tenth of one core).
FULL_PAUSE = 0.1


@dataclass
class Gap:
    """Keys ``low..high`` (inclusive) missing below the watermark, watched until ``until``."""

    low: int
    high: int
    until: float


class Sweeper:
    """One worker's discovery: its pass over new rows, its gaps, its share of full passes.

    The ``Discovery`` duty drives it: ``restart()`` when a pass is due, ``step(now)`` each
    round while ``urgent`` work remains (a pass over new rows; a full pass that is the only
    discovery of its source), ``background(now)`` each round otherwise.
    """

    def __init__(self, worker: Worker, batch: int, *, full_interval: float | None = None,
                 owner: uuid.UUID | None = None,
                 periodic_full: Any = None) -> None:
        self.worker = worker
        self.batch = batch
        #: Seconds between full passes (None: only the first one).
        self.full_interval = full_interval
        self.owner = owner or uuid.uuid4()
        #: ``periodic_full(worker) -> bool``: whether full passes are still needed (not when
        #: database triggers create the units); None: always.
        self.periodic_full = periodic_full
        self.by_watermark = keys.has_integer_pk(worker.source)
        self.gaps: list[Gap] = []
        self.watermark: int | None = None
        self._begun = True
        self._new_rows = False
        self._first_walk = False
        #: A full pass this process walks: its phase ("rows", "orphans"), its positions.
        self.full_phase = ""
        self.full_urgent = False
        self.cursor: Any = None
        self.orphan_cursor = 0
        self._orphan_end: int | None = None
        self._next_full_step = 0.0
        self._saved_at = 0.0

    # ----- the passes, as the Discovery duty drives them ---------------------------------

    def restart(self) -> None:
        """A pass is due: the next ``step`` reads where this worker's discovery stands."""
        self._begun = False

    @property
    def urgent(self) -> bool:
        """Whether work that ``--burst`` waits for remains: a pass started and not begun,
        new rows, a full pass that is the source's only discovery."""
        return not self._begun or self._new_rows or (bool(self.full_phase) and self.full_urgent)

    def step(self, now: float) -> tuple[int, bool]:
        """One chunk of the urgent work; (units added, whether it is over)."""
        if not self._begun:
            self._begin(now)
        if self._new_rows:
            added = self._new_rows_step(now)
        elif self.full_phase and self.full_urgent:
            added = self._full_step(now)
        else:
            return 0, True
        return added, not self.urgent

    def next_step_in(self, now: float) -> float | None:
        """Seconds until the next paced step of a full pass nothing waits for; None when
        there is none."""
        if not self.full_phase or self.full_urgent:
            return None
        return max(0.0, self._next_full_step - now)

    def background(self, now: float) -> int:
        """One paced chunk of a full pass that nothing waits for; units added."""
        if not self.full_phase or self.full_urgent or now < self._next_full_step:
            return 0
        self._next_full_step = now + FULL_PAUSE
        return self._full_step(now)

    def sweep_all(self) -> int:
        """Walk every source row and execution now, in this process, without touching the
        shared state (``testing.run_workers`` and tests use it); units added."""
        cursor: Any = None
        added = 0
        while True:
            end, n = self._rows_chunk(cursor)
            added += n
            if end is None:
                break
            cursor = end
        orphan_cursor, last = 0, self._last_execution_id()
        while orphan_cursor < last:
            orphan_cursor = self._orphans_chunk(orphan_cursor)
        return added

    # ----- where discovery stands ----------------------------------------------------

    def _using(self) -> str:
        return conf.get().DATABASE

    def _states(self) -> QuerySet[SweepState]:
        return SweepState.objects.using(self._using()).filter(worker=self.worker.name)

    def _state(self) -> SweepState:
        state = self._states().first()  # a read first: SQLite's write lock only when new
        if state is None:
            SweepState.objects.using(self._using()).bulk_create(
                [SweepState(worker=self.worker.name)], ignore_conflicts=True)
            state = self._states().get()
        return state

    def _begin(self, now: float) -> None:
        state = self._state()
        self._begun = True
        if self.by_watermark:
            self.watermark = state.watermark
            self._new_rows = True
            # No full pass ever ended: this pass walks every row above the watermark,
            # and the passes before it (stopped midway) walked the rows below it.
            self._first_walk = state.full_ended_at is None
        if not self.full_phase:
            self._maybe_take_full(state, now)

    def _maybe_take_full(self, state: SweepState, now: float) -> None:
        wall = timezone.now()
        if state.full_phase:  # under way: resume it once its walker is gone
            if state.full_owner != self.owner and state.full_stepped_at is not None and (
                    wall - state.full_stepped_at < timedelta(seconds=FULL_TAKEOVER)):
                return
        elif state.full_ended_at is None:
            if self.by_watermark:  # the first pass over new rows walks every row
                return
        elif not self._periodic(state, wall):
            return
        taken = self._states().filter(_same(state, "full_owner"), _same(state, "full_stepped_at"))
        fresh = not state.full_phase
        changes: dict[str, Any] = {"full_owner": self.owner, "full_stepped_at": wall}
        if fresh:
            changes.update(full_phase="rows", full_cursor=None, orphan_cursor=None,
                           full_started_at=wall)
        if not taken.update(**changes):
            return  # another process took it first
        self.full_phase = "rows" if fresh else state.full_phase
        self.cursor = (None if fresh or state.full_cursor is None
                       else keys.from_key(self.worker.source, state.full_cursor))
        self.orphan_cursor = 0 if fresh else (state.orphan_cursor or 0)
        self._orphan_end = None
        # Without integer keys the full pass is the only discovery: --burst waits for it
        # when it is the first one or a due one.
        self.full_urgent = not self.by_watermark
        self._next_full_step = self._saved_at = now
        logger.debug("full sweep of %s %s", self.worker.name, "started" if fresh else "resumed")

    def _periodic(self, state: SweepState, wall: Any) -> bool:
        if self.full_interval is None or state.full_ended_at is None:
            return False
        if wall - state.full_ended_at < timedelta(seconds=self.full_interval):
            return False
        return self.periodic_full is None or bool(self.periodic_full(self.worker))

    # ----- new rows ------------------------------------------------------------------

    def _new_rows_step(self, now: float) -> int:
        """The next chunk above the watermark: the first key after it (one indexed lookup),
        then the keys of ``[first, first + batch)``. Integer keys are unique, so the range
        holds ``batch`` rows at most whatever the planner estimates: no plan here can read
        more than a chunk, with or without statistics."""
        model = self.worker.source
        rows = model._base_manager.using(self._using())
        first = _first_after(rows, self.watermark)
        if first is None:
            self._new_rows = False
            added = self._look_at_gaps(now)
            if self._first_walk:  # it was a walk over every row: a full pass, as of now
                self._first_walk = False
                self._states().filter(full_ended_at__isnull=True).update(
                    full_ended_at=timezone.now())
            return added
        pks = sorted(rows.filter(pk__gte=first, pk__lt=first + self.batch)
                     .values_list("pk", flat=True)) or [first]  # (deleted meanwhile)
        start, end = self.watermark, pks[-1]
        added = self._add_missing(first - 1, end)
        self._note_gaps(start, pks, now)
        self.watermark = end
        self._states().filter(Q(watermark__lt=end) | Q(watermark__isnull=True)).update(
            watermark=end)
        return added

    def _note_gaps(self, start: int | None, pks: list[int], now: float) -> None:
        previous = pks[0] - 1 if start is None else start
        for pk in pks:
            if pk > previous + 1:
                self.gaps.append(Gap(previous + 1, pk - 1, now + GAP_WAIT))
            previous = pk
        del self.gaps[:-MAX_GAPS]

    def _look_at_gaps(self, now: float) -> int:
        """Add the eligible rows committed in a gap since; forget gaps past their wait."""
        self.gaps = [gap for gap in self.gaps if gap.until > now]
        if not self.gaps:
            return 0
        model = self.worker.source
        within = reduce(or_, (Q(pk__gte=g.low, pk__lte=g.high) for g in self.gaps))
        found = sorted(model._base_manager.using(self._using()).filter(within)
                       .values_list("pk", flat=True))
        if not found:
            return 0
        # The gaps' ranges again, not the keys found: a gap a long transaction filled may
        # hold more keys than a statement may have parameters.
        missing = (self.worker.eligible_queryset().using(self._using()).order_by()
                   .filter(within).filter(~Probe(self._has_unit())))
        added = add_selected(self.worker, missing, self._using())
        self.gaps = [piece for gap in self.gaps for piece in _split(gap, found)]
        return added

    # ----- the full pass ---------------------------------------------------------------

    def _full_step(self, now: float) -> int:
        added = 0
        phase = self.full_phase
        if phase == "rows":
            end, added = self._rows_chunk(self.cursor)
            if end is None:
                self.full_phase, self.orphan_cursor = "orphans", 0
            else:
                self.cursor = end
        elif phase == "orphans":
            if self._orphan_end is None:
                self._orphan_end = self._last_execution_id()
            if self.orphan_cursor >= self._orphan_end:
                self._finish_full()
                return 0
            self.orphan_cursor = self._orphans_chunk(self.orphan_cursor)
        if self.full_phase != phase or now - self._saved_at >= FULL_SAVE_EVERY:
            self._save_full(now)
        return added

    def _save_full(self, now: float) -> None:
        """Keep the pass's position (a write: every ``FULL_SAVE_EVERY`` seconds, not every
        step, so a pass that finds nothing rarely queues for SQLite's write lock)."""
        self._saved_at = now
        kept = self._states().filter(full_owner=self.owner).update(
            full_phase=self.full_phase,
            full_cursor=(None if self.cursor is None
                         else keys.to_key(self.worker.source, self.cursor, self._using())),
            orphan_cursor=self.orphan_cursor, full_stepped_at=timezone.now())
        if not kept:  # another process took the pass over: it goes on from where we were
            self.full_phase = ""

    def _finish_full(self) -> None:
        self._states().filter(full_owner=self.owner).update(
            full_phase="", full_cursor=None, orphan_cursor=None, full_owner=None,
            full_ended_at=timezone.now(), full_stepped_at=timezone.now())
        self.full_phase, self.cursor, self.orphan_cursor = "", None, 0
        self._orphan_end = None
        logger.debug("full sweep of %s ended", self.worker.name)

    # ----- chunks ----------------------------------------------------------------------

    def _has_unit(self) -> QuerySet[Execution]:
        return Execution.objects.filter(
            worker=self.worker.name, source_id=keys.key_expression(OuterRef("pk")))

    def _add_missing(self, start: Any, end: Any) -> int:
        """Units for the eligible rows in ``(start, end]`` that have none."""
        missing = (
            _after(self.worker.eligible_queryset().using(self._using()).order_by(), "pk", start)
            .filter(pk__lte=end)
            .filter(~Probe(self._has_unit()))
        )
        return add_selected(self.worker, missing, self._using())

    def _rows_chunk(self, cursor: Any) -> tuple[Any, int]:
        """The source rows after ``cursor``, ``batch`` keys: (the chunk's last key or None
        when none follows, units added). Integer keys: the range ``[first, first + batch)``
        after the first key (bounded whatever the planner thinks); others: up to the
        ``batch``-th key in order."""
        rows = self.worker.source._base_manager.using(self._using())
        if self.by_watermark:
            first = _first_after(rows, cursor)
            if first is None:
                return None, 0
            end = first + self.batch - 1
            return end, self._add_missing(first - 1, end)
        end = _chunk_end(_after(rows, "pk", cursor), "pk", self.batch)
        if end is None:
            return None, 0
        return end, self._add_missing(cursor, end)

    def _last_execution_id(self) -> int:
        last = Execution.objects.using(self._using()).aggregate(last=Max("id"))["last"]
        return last or 0

    def _orphans_chunk(self, after: int) -> int:
        """Delete the executions with an id in ``[first, first + batch)`` (``first``: the
        first id after ``after``) whose source row is gone; the range's end (the table's
        last id when none follows). Ranges of ids, not of this worker's executions: one
        primary key range scan each, however many executions the table holds, and no plan
        that statistics could turn into a walk over the worker's whole history.

        Running units are left alone: their handler finds the row gone and forgets them.
        """
        using = self._using()
        model = self.worker.source
        executions = Execution.objects.using(using)
        first = (executions.filter(id__gt=after).order_by("id")
                 .values_list("id", flat=True).first())
        if first is None:
            return max(after, self._orphan_end or 0, self._last_execution_id())
        end = first + self.batch - 1
        source = model._base_manager.using(using).filter(
            pk=keys.pk_expression(model, OuterRef("source_id")))
        # The worker is compared through an expression no index serves: given
        # ``worker = %s`` the planners combine the id range with the unique index's part for
        # the worker, which reads every execution the worker ever had (PostgreSQL without
        # statistics: 33 ms a range at 200,000, against 9 ms).
        gone = list(executions.filter(id__gte=first, id__lte=end)
                    .alias(_worker=Concat("worker", Value("")))
                    .filter(_worker=self.worker.name)
                    .filter(~Probe(source)).values_list("id", flat=True))
        if gone:  # a read first: a delete takes SQLite's write lock even for no rows
            executions.filter(id__in=gone).exclude(state=State.WORKING).delete()
        return end


def _same(state: SweepState, field: str) -> Q:
    value = getattr(state, field)
    return Q(**{f"{field}__isnull": True}) if value is None else Q(**{field: value})


def _split(gap: Gap, found: list[int]) -> list[Gap]:
    """What is left of ``gap`` once the keys ``found`` (sorted) are no longer missing."""
    pieces, low = [], gap.low
    for pk in found:
        if low <= pk <= gap.high:
            if pk > low:
                pieces.append(Gap(low, pk - 1, gap.until))
            low = pk + 1
    if low <= gap.high:
        pieces.append(Gap(low, gap.high, gap.until))
    return pieces


def _first_after(rows: Any, after: int | None) -> int | None:
    """The first primary key above ``after`` (any when None): ``LIMIT 1`` in key order,
    which every planner answers from the primary key index."""
    return _after(rows, "pk", after).order_by("pk").values_list("pk", flat=True).first()


def _after(qs: Any, field: str, cursor: Any) -> Any:
    return qs if cursor is None else qs.filter(**{f"{field}__gt": cursor})


def _chunk_end(qs: Any, field: str, batch: int) -> Any:
    """The ``batch``-th value of ``field`` in ``qs`` in its order, or the last one when
    fewer follow; None when none does."""
    ordered = qs.order_by(field).values_list(field, flat=True)
    end = list(ordered[batch - 1:batch])
    if not end:
        end = list(qs.order_by(f"-{field}").values_list(field, flat=True)[:1])
    return end[0] if end else None
