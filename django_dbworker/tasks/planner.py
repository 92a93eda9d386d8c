"""The claim of tasks, as the supervisor, ``testing`` and immediate mode make it: the
plain claim (``store.claim``: one statement), the keyed one for tasks with a concurrency
key (``concurrency.claim``), and both under start rates (``claim_limited``, with
``ratelimit``'s buckets), made units (``unit.TaskUnit``) the supervisor can run."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import transaction

from .. import conf
from ..units.claimant import Claimant
from . import concurrency, ratelimit, store
from .unit import TaskUnit


def claim(
    queues: list[str] | None,
    limit: int,
    claimant: Claimant,
    lease: float,
    *,
    only_path: str | None = None,
    exclude_paths: list[str] | tuple[str, ...] = (),
    exclude_queues: frozenset[str] = frozenset(),
    keyed: bool = False,
    seen: concurrency.Seen | None = None,
) -> list[TaskUnit]:
    """Claim up to ``limit`` ready tasks, highest priority first; ``exclude_queues``:
    paused queues, for a claim of every queue (``queues`` None).

    Tasks with a concurrency key only with ``keyed`` (``concurrency.claim``: the same,
    each key within its limit, telling ``seen`` whether a keyed task waits); without,
    they are left for a keyed claim."""
    if limit <= 0:
        if seen is not None:  # nothing read: a keyed task may wait (a bucket ran dry)
            seen.keyed = True
        return []
    if keyed:
        return TaskUnit.of(concurrency.claim(
            queues, limit, claimant, lease, only_path=only_path,
            exclude_paths=tuple(exclude_paths), exclude_queues=exclude_queues, seen=seen))
    return TaskUnit.of(store.claim(queues, limit, claimant, lease, only_path=only_path,
                                   exclude_paths=exclude_paths,
                                   exclude_queues=exclude_queues))


def claim_ids(ids: list[Any], claimant: Claimant, lease: float, now: datetime, *,
              held: bool = True) -> list[TaskUnit]:
    """The units of ``store.claim_ids``: the tasks ``ids`` the caller picked."""
    return TaskUnit.of(store.claim_ids(ids, claimant, lease, now, held=held))


def claim_limited(
    queues: list[str] | None,
    room: int,
    claimant: Claimant,
    lease: float,
    *,
    limits: dict[str, str],
    global_limit: str | None,
    exclude_queues: frozenset[str] = frozenset(),
    keyed: bool = False,
    seen: concurrency.Seen | None = None,
) -> list[TaskUnit]:
    """Claim up to ``room`` tasks, respecting per-task and global start rates and priority.

    ``limits`` maps task paths to their rate. In one transaction with the buckets: up to
    ``room`` unlimited tasks and, of each limited task, what its bucket allows; of those,
    the ``room`` first in claim order (priority, then age) are kept and the others given
    back at once, so a limited task of high priority is not starved by unlimited ones.
    Buckets pay only for the tasks kept. ``keyed``, ``seen``: as ``claim``'s.
    """
    if room <= 0:
        return []
    if not limits and global_limit is None:
        # one statement (keyed: one transaction), no buckets to keep
        return claim(queues, room, claimant, lease, exclude_queues=exclude_queues,
                     keyed=keyed, seen=seen)
    using = conf.get().DATABASE
    with transaction.atomic(using=using):
        overall = None
        if global_limit is not None:
            overall = ratelimit.reserve("__all_tasks__", global_limit, room)
            room = overall.allowed
        if room <= 0:
            if overall is not None:
                overall.consume(0)
            return []
        claims = claim(queues, room, claimant, lease, exclude_paths=tuple(limits),
                       exclude_queues=exclude_queues, keyed=keyed, seen=seen)
        buckets = []
        for path, rate in limits.items():
            bucket = ratelimit.reserve(f"task:{path}", rate, room)
            claims += claim(queues, bucket.allowed, claimant, lease, only_path=path,
                            exclude_queues=exclude_queues, keyed=keyed, seen=seen)
            buckets.append((path, bucket))
        claims.sort(key=store.claim_order)
        claims, surplus = claims[:room], claims[room:]
        store.unclaim(surplus)
        for path, bucket in buckets:
            bucket.consume(sum(1 for c in claims if c.task_path == path))
        if overall is not None:
            overall.consume(len(claims))
    return claims
