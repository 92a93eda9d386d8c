"""Workers whose handlers do nothing, so a benchmark measures only the machinery."""

import time

from benchapp.models import Feed, Job, Ping, Row
from django_dbworker import Finished, worker


@worker(source=Row)
def by_pk(row):
    """Claims in primary-key order (no eligible queryset: the default)."""
    return Finished()


@worker(source=Row, eligible=lambda: Row.objects.order_by("priority"))
def by_priority(row):
    """Claims in the order of another indexed column."""
    return Finished()


@worker(source=Job, concurrency=64)
def noop(job):
    """The throughput worker: as many units at once as runworkers has children."""
    return Finished()


@worker(source=Ping)
def ping(row):
    """The latency worker: notes when its handler started (update(): no save signals)."""
    Ping.objects.filter(pk=row.pk).update(started=time.time())
    return Finished()


@worker(source=Feed, concurrency=2)
def feed(row):
    """The row_feeds worker, declared as a user would: two units at a time."""
    return Finished()
