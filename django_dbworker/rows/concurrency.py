"""Per-key concurrency limits of row workers: at most N units of one key WORKING at once,
on every supervisor of every host (``@worker(concurrency_limit=N, concurrency_key="field")``).

The key of a unit is the value of a field of its source row (as text), read when it is
claimed; without ``concurrency_key`` every unit of the worker has the same key. A claim of
such a worker (``claim``), in one transaction, as the keyed task claim does
(``tasks/concurrency.py``): its candidates in eligible's order ``FOR UPDATE SKIP LOCKED``,
their rows' keys, the ``ConcurrencySlot`` of each key locked ``SKIP LOCKED`` (the slot is
``worker:<name>:<key>``), the WORKING units of the worker counted by key (read after the
locks; bounded by what the worker runs now), and only the units that fit marked WORKING.
A unit frees its place by leaving WORKING (finished, unfinished, failed, released,
reaped, given back). A row whose key field changes while its unit works is counted under
its new key from then on.
"""

from __future__ import annotations

import hashlib
import uuid
from collections import Counter
from dataclasses import replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.db import connections, transaction
from django.utils import timezone

from .. import conf
from ..db import engine_for, keys
from ..models import Execution
from ..units import slots
from .queries import candidates
from .store import Claim, claim_parts

if TYPE_CHECKING:
    from ..units.claimant import Claimant
    from .registry import Worker

#: Reads of candidates one claim makes at most, each ``GROWTH`` times the one before.
PAGES = 4
GROWTH = 4
FIRST_PAGE = 32
MAX_PAGE = 1000


def slot_key(worker: Worker, value: Any) -> str:
    """The ``ConcurrencySlot`` key of a unit whose key field holds ``value``."""
    if worker.concurrency_key is None:
        return f"worker:{worker.name}"
    text = f"worker:{worker.name}:{value}"
    if len(text) <= 255:
        return text
    return f"worker:{worker.name}:sha256:{hashlib.sha256(str(value).encode()).hexdigest()}"


def _keys(worker: Worker, source_ids: set[str], using: str) -> dict[str, str]:
    """``source_id -> slot key`` of the units whose source rows exist."""
    if worker.concurrency_key is None:
        return dict.fromkeys(source_ids, slot_key(worker, None))
    model = worker.source
    by_pk = {keys.from_key(model, sid): sid for sid in source_ids}
    rows = model._default_manager.using(using).filter(pk__in=list(by_pk)).values_list(
        "pk", worker.concurrency_key)
    found = {}
    for pk, value in rows:
        sid = by_pk.get(pk)
        if sid is None:
            sid = keys.to_key(model, pk, using)
        found[sid] = slot_key(worker, value)
    return found


def _working(worker: Worker, using: str) -> Counter[str]:
    """How many units of the worker work now, by slot key."""
    sids = set(Execution.objects.using(using).working().filter(worker=worker.name)
               .values_list("source_id", flat=True))
    return Counter(_keys(worker, sids, using).values())


def claim(worker: Worker, limit: int, claimant: Claimant, lease: float) -> list[Claim]:
    """Claim up to ``limit`` units of ``worker`` in eligible's order, no key beyond
    ``worker.concurrency_limit``; committed on return."""
    if limit <= 0:
        return []
    using = conf_alias()
    connection = connections[using]
    now = timezone.now()
    per_key = worker.concurrency_limit or 1
    with (transaction.atomic(using=using),
          engine_for(connection).begun_with_first_statement(connection)):
        chosen: list[Any] = []
        passed: list[Any] = []  # candidates that do not fit now
        held: set[str] = set()
        skipped: set[str] = set()
        running: Counter[str] = Counter()
        for page_number in range(PAGES):
            want = limit - len(chosen)
            size = min(max(want * GROWTH, FIRST_PAGE) * GROWTH ** page_number, MAX_PAGE)
            qs = candidates(worker, now, using)
            if chosen or passed:
                qs = qs.exclude(pk__in=chosen + passed)
            if connection.features.has_select_for_update_skip_locked:
                qs = qs.select_for_update(
                    skip_locked=True,
                    of=("self",) if connection.features.has_select_for_update_of else ())
            page = list(qs.values_list("id", "source_id")[:size])
            key_of = _keys(worker, {sid for _, sid in page}, using)
            fresh = set(key_of.values()) - held - skipped
            if fresh:
                locked = slots.lock(using, sorted(fresh))
                skipped |= fresh - locked
                if locked - held:
                    held |= locked
                    counted = _working(worker, using)
                    for key in locked:
                        running[key] = counted[key]
            for pk, sid in page:
                k = key_of.get(sid)
                if k is None:
                    chosen.append(pk)  # its row is gone: the unit deals with that
                elif k in held and running[k] < per_key:
                    running[k] += 1
                    chosen.append(pk)
                else:
                    passed.append(pk)
                if len(chosen) == limit:
                    break
            if len(chosen) == limit or len(page) < size:
                break
        if not chosen:
            return []
        token = uuid.uuid4()
        expires = now + timedelta(seconds=lease)
        parts = claim_parts(worker, len(chosen), claimant, token=token, now=now,
                            expires=expires)
        quote = connection.ops.quote_name
        marks = ", ".join(["%s"] * len(chosen))
        parts = replace(parts, candidates=(
            f"SELECT {quote('id')} FROM {quote(Execution._meta.db_table)} "
            f"WHERE {quote('id')} IN ({marks})"), candidate_params=list(chosen), index=None)
        with (engine_for(connection).committed_with_statement(connection),
              connection.cursor() as cursor):
            rows = engine_for(connection).claim(cursor, parts)
    position = {pk: i for i, pk in enumerate(chosen)}
    rows = sorted(rows, key=lambda row: position[row[0]])
    return [Claim(row[0], worker.name, row[1], token, row[2], expires) for row in rows]


def conf_alias() -> str:
    return conf.get().DATABASE
