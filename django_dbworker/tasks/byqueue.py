"""Which queues the next ``room`` tasks come from, read through each queue's own claim index.

A claim of several queues walks one index in claim order (priority, then age) and filters
by queue; tasks of a paused queue that come first in that order would be walked past at
every claim. While a paused queue holds waiting tasks, the supervisor asks this module
instead: the first ``room`` keys of each queue (an index walk per queue that stops after
``room`` entries), merged, say how many tasks to claim from each (``TaskWork.claim``).
"""

from __future__ import annotations

import heapq
from collections import Counter
from itertools import islice

from django.db.models import F
from django.utils import timezone

from .. import conf
from ..models import TaskRecord


def shares(queues: list[str], room: int) -> dict[str, int]:
    """``{queue: n}``: how many of the next ``room`` claimable tasks each queue holds."""
    now = timezone.now()
    rows = TaskRecord.objects.using(conf.get().DATABASE).ready(now)
    heads = [
        [(-priority, at, queue) for priority, at in rows.in_queues([queue]).order_by(
            F("priority").desc(), "available_at").values_list("priority", "available_at")[:room]]
        for queue in queues
    ]
    return dict(Counter(queue for _, _, queue in islice(heapq.merge(*heads), room)))
