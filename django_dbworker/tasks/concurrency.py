"""Per-key concurrency limits: at most N tasks with one concurrency key RUNNING at once, on
every supervisor of every host (``@task(concurrency_limit=N, concurrency_key=...)``).

Each task row carries its key and its limit (``TaskRecord.concurrency_key``,
``concurrency_limit``). The plain claim (``store.claim``) never takes a keyed task. A keyed
claim (``claim`` here), in one transaction:

1. reads candidates in claim order (priority, then the longest available), keyed or not,
   ``FOR UPDATE SKIP LOCKED``;
2. locks the ``ConcurrencySlot`` row of each of their keys, ``FOR UPDATE SKIP LOCKED``: a
   key another claim holds now is left for the next round (no waiting, so no deadlock
   between claims, whatever order their keys come in);
3. counts the RUNNING tasks of those keys (index ``dbworker_task_keyed_running``);
4. takes the candidates in claim order: a keyless one always, a keyed one while fewer than
   its own row's limit run with its key;
5. when full keys left room unused, counts the RUNNING tasks of every key (a guess, read
   without a lock: bounded by what runs everywhere) and reads the next candidates without
   the rows that cannot fit (at most ``PAGES`` reads in all, each ``GROWTH`` times larger
   than the one before), so full keys block neither
   other keys nor plain tasks behind them; where a locking read locks every row it walks
   past (InnoDB: ``Engine.locks_rows_it_filters``), those next pages are read without
   locks;
6. marks the chosen tasks RUNNING in one statement (``store.claim_ids``); a task read
   without a lock is locked there (``SKIP LOCKED``) and taken only if it still waits.

A task becomes RUNNING only in a claim that holds its key's lock, and the count is read
after the lock was taken (READ COMMITTED: a new snapshot per statement; SQLite: one writer
at a time), so the count is exact. A task frees its place by leaving RUNNING: it finished,
failed, was released (its child died), reaped (its lease expired) or given back.
Tasks left behind stay READY and use no attempt.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from django.db import connections, transaction
from django.db.models import Count, F, Q, QuerySet
from django.utils import timezone

from .. import conf
from ..db import compiled, engine
from ..models import ANY_QUEUE_GUARD, TaskRecord
from ..units import slots
from ..units.claimant import Claimant
from . import registry, store
from .store import TaskClaim

#: Reads of candidates one keyed claim makes at most (the first, and the next ones past
#: keys found full).
PAGES = 4
#: The first page reads ``GROWTH`` times the room left (at least ``FIRST_PAGE``), and each
#: page after it ``GROWTH`` times more, up to ``MAX_PAGE``: tasks that do not fit cost a
#: few more rows read, not another round of statements. (The rows are three small columns;
#: those not taken are unlocked at the commit.)
FIRST_PAGE = 32
GROWTH = 4
MAX_PAGE = 1000


# ----- declaration ------------------------------------------------------------------------


def declared() -> bool:
    """Whether a registered task has a concurrency limit: then claims take keyed tasks."""
    return any(getattr(t, "concurrency_limit", None) for t in registry.known().values())


# ----- the keyed claim --------------------------------------------------------------------


class Seen:
    """What a keyed claim saw of the waiting tasks, for ``supervisor.taskwork``: whether a
    keyed task waits (``keyed``: one was among the first candidates read, or more waited
    than were read, so one may), once a claim read them (``read``)."""

    __slots__ = ("keyed", "read")

    def __init__(self) -> None:
        self.read = False
        self.keyed = False


def claim(
    queues: list[str] | None,
    limit: int,
    claimant: Claimant,
    lease: float,
    *,
    only_path: str | None = None,
    exclude_paths: Sequence[str] = (),
    exclude_queues: frozenset[str] = frozenset(),
    seen: Seen | None = None,
) -> list[TaskClaim]:
    """Claim up to ``limit`` ready tasks, keyed or not, in claim order, no key beyond its
    limit (the module's docstring says how); ``exclude_queues``: paused queues, for a
    claim of every queue (``queues`` None); ``seen``: told whether a keyed task waits."""
    if limit <= 0:
        return []
    using = conf.get().DATABASE
    now = timezone.now()
    connection = connections[using]
    with (transaction.atomic(using=using),
          engine(using).begun_with_first_statement(connection)):
        paused = tuple(sorted(exclude_queues)) if queues is None else ()
        chosen, held = _choose(using, now, queues, limit, only_path, tuple(exclude_paths),
                               paused, seen)
        if not chosen:
            return []
        with engine(using).committed_with_statement(connection):  # the claim's UPDATE
            claims = store.claim_ids(chosen, claimant, lease, now, held=held)
    position = {pk: i for i, pk in enumerate(chosen)}
    return sorted(claims, key=lambda c: position[c.task_id])


def _choose(using: str, now: Any, queues: list[str] | None, limit: int,
            only_path: str | None, exclude: tuple[str, ...],
            paused: tuple[str, ...] = (), seen: Seen | None = None
            ) -> tuple[list[Any], bool]:
    """The ids to claim, in claim order, and whether the transaction holds all their rows
    (else some were read without a lock); it holds the slots of their keys. ``seen``:
    whether the first page held a keyed task or was full (``Seen``)."""
    chosen: list[Any] = []
    # The pages after the first filter out what cannot fit: read without locks where a
    # locking read would lock every row it walks past (Engine.locks_rows_it_filters).
    lock_filtered = not engine(using).locks_rows_it_filters
    held_all = True
    # How many run of each key: exact for the keys whose slots this claim holds; after a
    # first page that left room for want of places, a guess for every key that has a
    # RUNNING task (read without a lock, bounded by the tasks running everywhere), so
    # that the next pages do not even read what cannot fit.
    running: dict[str, int] = {}
    held: set[str] = set()
    skipped: set[str] = set()  # slots another claim holds now: next round
    for page_number in range(PAGES):
        if page_number == 1:
            running = _running(using, None) | {k: running[k] for k in held}
        want = limit - len(chosen)
        # Each page reads GROWTH times more: a full key's tasks may come in long runs (one
        # enqueue_many stores its calls grouped by key).
        size = min(max(want * GROWTH, FIRST_PAGE) * GROWTH ** page_number, MAX_PAGE)
        lock = page_number == 0 or lock_filtered
        page = _candidates(using, now, queues, only_path, exclude,
                           _full(running, skipped), chosen, size, paused, lock=lock)
        if page_number == 0 and seen is not None:
            seen.read = True
            seen.keyed = seen.keyed or len(page) >= size or any(
                key is not None for _, key, _ in page)
        fresh = {key for _, key, _ in page if key is not None and key not in held
                 and key not in skipped}
        if fresh:
            locked = slots.lock(using, sorted(fresh))
            skipped |= fresh - locked
            held |= locked
            running.update(_running(using, locked))
        for pk, key, key_limit in page:
            if key is None:
                chosen.append(pk)
            elif key in held and running.get(key, 0) < (key_limit or 1):
                running[key] = running.get(key, 0) + 1
                chosen.append(pk)
            else:
                continue
            held_all = held_all and lock
            if len(chosen) == limit:
                return chosen, held_all
        if len(page) < size:
            break  # nothing more waits
    return chosen, held_all


def _full(running: dict[str, int], skipped: set[str]) -> Q | None:
    """The waiting tasks that cannot start now: each row whose key runs at least its own
    limit, and every row of a key whose slot another claim holds."""
    by_count: dict[int, list[str]] = {}
    for key, count in running.items():
        if count > 0:
            by_count.setdefault(count, []).append(key)
    conditions = [Q(concurrency_key__in=sorted(keys), concurrency_limit__lte=count)
                  for count, keys in sorted(by_count.items())]
    if skipped:
        conditions.append(Q(concurrency_key__in=sorted(skipped)))
    if not conditions:
        return None
    full = conditions[0]
    for condition in conditions[1:]:
        full |= condition
    return full


def _candidates(using: str, now: Any, queues: list[str] | None, only_path: str | None,
                exclude: tuple[str, ...], full: Q | None, chosen: list[Any],
                size: int, paused: tuple[str, ...] = (), *, lock: bool = True
                ) -> list[tuple[Any, str | None, int | None]]:
    """Up to ``size`` waiting tasks in claim order, locked (``SKIP LOCKED``; ``lock``
    False: read without locks), without the ``full`` ones, those chosen already and those
    of ``paused`` queues: ``(id, key, limit)`` each."""
    connection = connections[using]

    def build(at: Any) -> QuerySet[TaskRecord, Any]:
        qs = TaskRecord.objects.using(using).ready(at)
        # Every queue: the index of every queue's claims (its guard: models.ANY_QUEUE_GUARD).
        qs = qs.filter(ANY_QUEUE_GUARD) if queues is None else qs.in_queues(queues)
        if paused:
            qs = qs.exclude(queue_name__in=list(paused))
        if only_path is not None:
            qs = qs.filter(task_path=only_path)
        if exclude:
            qs = qs.exclude(task_path__in=list(exclude))
        if full is not None:
            qs = qs.exclude(full)  # a keyless row (NULL key) is never excluded
        if chosen:
            qs = qs.exclude(pk__in=chosen)
        # The claim index's order (store.claim); ties in index order.
        qs = qs.order_by(F("priority").desc(), "available_at")
        if lock and connection.features.has_select_for_update_skip_locked:
            qs = qs.select_for_update(
                skip_locked=True,
                of=("self",) if connection.features.has_select_for_update_of else ())
        return qs.values_list("id", "concurrency_key", "concurrency_limit")[:size]

    # The first page of a claim is the same query every time but for ``now``: compiled
    # once (``db.compiled``); the later pages filter what this claim found.
    first = ("keyed", tuple(queues) if queues is not None else None, only_path, exclude,
             paused, size, lock)
    sql, params = compiled.sql_with_now(first, None, build, now, using,
                                        cacheable=full is None and not chosen)
    to_id = TaskRecord._meta.pk.to_python
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [(to_id(pk), k, k_limit) for pk, k, k_limit in cursor.fetchall()]


def _running(using: str, keys: set[str] | None) -> dict[str, int]:
    """How many tasks of each of ``keys`` run now (0 for none; None: of every key that has
    one), through the index ``dbworker_task_keyed_running``."""
    if keys is not None and not keys:
        return {}

    def build(these: list[str] | None) -> QuerySet[TaskRecord, Any]:
        qs = TaskRecord.objects.using(using).running()
        qs = (qs.filter(concurrency_key__isnull=False) if these is None
              else qs.filter(concurrency_key__in=these))
        return (qs.values("concurrency_key").annotate(n=Count("id")).order_by()
                .values_list("concurrency_key", "n"))

    found = dict.fromkeys(keys or (), 0)
    for key, n in slots.by_keys(using, "running", None if keys is None else sorted(keys), build):
        found[str(key)] = n
    return found


def running_counts(keys: Iterable[str]) -> dict[str, int]:
    """How many tasks of each key are RUNNING now (for people and tests)."""
    return _running(conf.get().DATABASE, set(keys))

