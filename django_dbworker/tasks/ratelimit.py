"""Start-rate limits shared by all supervisors: a token bucket row per key.

``reserve()`` locks the bucket row for the rest of the caller's transaction (PostgreSQL
``SELECT ... FOR UPDATE``; SQLite serialises writers anyway), refills it for the time that
passed, and says how many starts are allowed now; ``consume()`` takes the ones used.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction
from django.utils import timezone

from .. import conf
from ..models import RateBucket
from .rates import parse_rate


@dataclass
class Reservation:
    key: str
    tokens: float
    now: datetime
    allowed: int

    def consume(self, used: int) -> None:
        RateBucket.objects.using(conf.get().DATABASE).filter(key=self.key).update(
            tokens=max(self.tokens - used, 0.0), updated_at=self.now
        )


def reserve(key: str, rate: str, want: int) -> Reservation:
    """Lock ``key``'s bucket and say how many of ``want`` starts ``rate`` allows now."""
    using = conf.get().DATABASE
    assert transaction.get_connection(using).in_atomic_block, "call reserve() in atomic()"
    count, period = parse_rate(rate)
    now = timezone.now()
    manager = RateBucket.objects.using(using)
    manager.bulk_create([RateBucket(key=key, tokens=count, updated_at=now)],
                        ignore_conflicts=True)
    bucket = manager.select_for_update().get(key=key)
    elapsed = max((now - bucket.updated_at).total_seconds(), 0.0)
    tokens = min(count, bucket.tokens + elapsed * count / period)
    return Reservation(key, tokens, now, min(want, math.floor(tokens + 1e-9)))
