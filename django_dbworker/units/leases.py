"""The lease life cycle, written once over both tables: a claimed unit is held (its token,
its supervisor's id, a lease that expires), renewed while its supervisor lives, and given
back by one of four roads, each a guarded UPDATE fenced by its token:

- ``release``: cut off (a shutdown: not a crash) or its process died (a crash, counted;
  FAILED once it crashed ``max_crashes`` times);
- ``unclaim``: claimed ahead and never run (the attempt is taken back);
- ``reap``: its lease expired (its supervisor stopped renewing: a crash);
- ``reap_held``: its supervisor's heartbeat stopped (``supervisor/takeover.py``);
- ``release_untracked``: held in the database but not in its supervisor's memory.

A table of leased units is a ``Leases`` (the kind of unit, ``units.protocol.Kind``): its
model, its held rows (``held``: the partial index renewal reads), the status a unit goes
back to, and the two records that differ by table (``crashed_too_often``, ``crashed``).
``rows.store.EXECUTIONS`` and ``tasks.store.TASKS`` are the two.
"""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta
from typing import Any, ClassVar, cast

from django.db import connections, transaction
from django.db.models import Case, F, Model, Q, QuerySet, When
from django.utils import timezone

from .. import conf
from ..db import engine, engine_for
from .claimant import Claimant, by_tokens
from .failures import FailureInfo, too_many_crashes

#: Rows one reaping round reads at most, per table.
REAP_BATCH = 1000


def alias() -> str:
    return conf.get().DATABASE


def one_statement(using: str) -> Any:
    """The transaction a claim runs in (``Engine.one_statement``)."""
    connection = connections[using]
    return engine_for(connection).one_statement(connection)


def lease_live(using: str) -> bool:
    """Whether a child's record also needs its lease unexpired, not only its token
    (``Engine.checks_lease_on_record``).

    Leases are written with ``timezone.now()`` by the supervisor, a fork on the same host:
    the child compares with the same clock.
    """
    return engine(using).checks_lease_on_record


def lease_lost(kind: str) -> FailureInfo:
    """The crash a reaped unit counts: its lease expired while it ran."""
    return FailureInfo(
        "django_dbworker.exceptions.LeaseLost",
        f"the lease of this {kind} expired while it ran: its supervisor stopped renewing "
        "it (process killed, paused or cut off from the database)",
    )


class Leases:
    """A table of leased units (one kind of unit) and its lease life cycle."""

    #: The word for one unit of the kind in messages: "execution", "task".
    name: ClassVar[str]
    #: The model whose rows are the units.
    model: ClassVar[type[Model]]
    #: The status column, the status of a held unit, and the one it goes back to.
    status: ClassVar[str]
    held_status: ClassVar[str]
    back_status: ClassVar[str]

    # ----- what differs by table ---------------------------------------------------------

    def held(self, using: str) -> QuerySet[Any, Any]:
        """The held units, through the partial index renewal reads."""
        raise NotImplementedError

    def claim_of(self, pk: Any, attempt: int, token: uuid.UUID, now: datetime) -> Any:
        """A claim of the unit ``pk`` for ``release`` (what the fence needs)."""
        raise NotImplementedError

    def crashed_too_often(self, c: Any, fenced: QuerySet[Any, Any], info: FailureInfo,
                          now: datetime, back: dict[str, Any]) -> int:
        """Record ``c`` FAILED for good if ``fenced`` (its row, if it crashed as often as
        allowed but once) matches; ``info`` says why. Returns how many rows changed: 0
        when it may crash again."""
        raise NotImplementedError

    def crashed(self, c: Any, fenced: QuerySet[Any, Any], info: FailureInfo, now: datetime,
                back: dict[str, Any]) -> int:
        """Give ``c`` back with one more crash counted (``back``: the columns every road
        back writes)."""
        return fenced.update(**{self.status: self.back_status}, crashes=F("crashes") + 1,
                             **back)

    def unclaimed(self, using: str, first: Q) -> dict[str, Any]:
        """The columns ``unclaim`` writes besides the attempt, the lease and the token
        (``first``: the unit was to run its first attempt)."""
        return {self.status: self.back_status}

    # ----- the life cycle, the same for every table --------------------------------------

    def fenced(self, c: Any, using: str) -> QuerySet[Any, Any]:
        """The row of ``c``, held with its token: what every change of its lease guards."""
        return self.model._default_manager.using(using).filter(
            pk=c.unit_pk, token=c.token, **{self.status: self.held_status})

    def release(self, c: Any, *, crashed: FailureInfo | None, max_crashes: int) -> int:
        """Give a cut-off unit back: claimable again, or FAILED once it crashed too often.

        ``crashed`` is None when the unit was cut off by a shutdown (not its fault).
        """
        using = alias()
        now = timezone.now()
        with transaction.atomic(using=using):
            qs = self.fenced(c, using)
            back = {"token": None, "lease_expires_at": None, "available_at": now}
            if crashed is None:
                return qs.update(**{self.status: self.back_status}, **back)
            failed = self.crashed_too_often(c, qs.filter(crashes__gte=max_crashes - 1),
                                            too_many_crashes(crashed, max_crashes), now, back)
            return failed or self.crashed(c, qs, crashed, now, back)

    def unclaim(self, claims: list[Any]) -> int:
        """Give back units claimed ahead that never ran, fenced by their tokens: not a
        crash. The attempt is taken back (a unit that had not started before gets no
        ``started_at``); ``available_at`` (already passed) is kept, so it keeps its place."""
        if not claims:
            return 0
        using = alias()
        first = Q(attempts__lte=1)
        return self.model._default_manager.using(using).filter(
            by_tokens(claims), **{self.status: self.held_status}
        ).update(
            **self.unclaimed(using, first),
            attempts=F("attempts") - 1,
            started_at=Case(When(first, then=None), default=F("started_at")),
            token=None,
            lease_expires_at=None,
        )

    def renew(self, claimant: Claimant, lease: float) -> int:
        """Extend the lease of every unit ``claimant`` holds: one statement, through the
        held units' index. Held means claimed with its supervisor id: running or waiting in
        a child, or claimed ahead. What it gave back, recorded, or lost to a reaper is no
        longer held with its id, so no list of held units is needed (the renewer thread
        has none)."""
        return self.held(alias()).filter(supervisor_id=claimant.supervisor_id).update(
            lease_expires_at=timezone.now() + timedelta(seconds=lease))

    def expired(self, now: datetime, using: str, spare: Claimant | None = None) -> Any:
        """The units whose lease expired (at most ``REAP_BATCH``), read through the held
        units' index; not those of ``spare`` (the reaping supervisor's own)."""
        qs = self.held(using).filter(lease_expires_at__lt=now)
        if spare is not None:
            qs = qs.exclude(supervisor_id=spare.supervisor_id)
        return qs.values_list("pk", "attempts", "token")[:REAP_BATCH]

    def reap(self, max_crashes: int, spare: Claimant | None = None) -> int:
        """Take back units whose lease expired (their process or supervisor is gone),
        except those of ``spare``: a supervisor does not reap its own units, it knows
        where they are (``supervisor.duties.leases.Reaping``). Each counts a crash."""
        now = timezone.now()
        info = lease_lost(self.name)
        return sum(self.release(self.claim_of(pk, attempt, cast(uuid.UUID, token), now),
                                crashed=info, max_crashes=max_crashes)
                   for pk, attempt, token in list(self.expired(now, alias(), spare)))

    def held_by(self, supervisor_ids: list[uuid.UUID], using: str) -> Any:
        """The units held by one of ``supervisor_ids`` (at most ``REAP_BATCH``), through
        the held units' index: the units in flight, never the history."""
        return self.held(using).filter(supervisor_id__in=supervisor_ids).values_list(
            "pk", "attempts", "token", "supervisor_id")[:REAP_BATCH]

    def reap_held(self, holders: dict[uuid.UUID, FailureInfo | None],
                  max_crashes: int) -> Counter[uuid.UUID]:
        """Take back the units gone supervisors still hold, each fenced by its token and
        released as ``reap`` releases, with its holder's crash (``holders``: supervisor id
        to the crash to count; None: not a crash). Returns how many went back, by holder
        (``supervisor/takeover.py``)."""
        now = timezone.now()
        taken: Counter[uuid.UUID] = Counter()
        for pk, attempt, token, holder in list(self.held_by(list(holders), alias())):
            by = cast(uuid.UUID, holder)  # one of ``holders``
            c = self.claim_of(pk, attempt, cast(uuid.UUID, token), now)  # held: a token
            taken[by] += self.release(c, crashed=holders[by], max_crashes=max_crashes)
        return taken

    def release_untracked(self, claimant: Claimant, held: set[tuple[Any, uuid.UUID]]) -> int:
        """Give back the units ``claimant`` holds in the database but not in memory
        (``held``: ``(pk, token)`` pairs; a claim's units share its token): not a crash
        (``supervisor.units.release_untracked``)."""
        now = timezone.now()
        rows = self.held(alias()).filter(supervisor_id=claimant.supervisor_id).values_list(
            "pk", "attempts", "token")
        return sum(self.release(self.claim_of(pk, attempt, cast(uuid.UUID, token), now),
                                crashed=None, max_crashes=1)
                   for pk, attempt, token in list(rows) if (pk, token) not in held)
