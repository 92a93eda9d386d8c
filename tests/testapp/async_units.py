"""Async tasks and row handlers for test_async_units.py and bench/async_io.py.

The tasks register on import (they run only when enqueued). The row workers over ``Item``
register only through ``register_workers()``: in runworkers processes started with
``DBWORKER_TEST_ASYNC=1`` (``tasks.py`` imports this module then), and in the test process
by a fixture that removes them afterwards, so no other test meets them."""

import asyncio
import os
import time

from asgiref.sync import sync_to_async

from django_dbworker import Finished, set_progress, worker
from django_dbworker.djtasks import task

from .models import Effect, Item

#: Units of this module running now in this process, and the most seen at once.
_now = 0
_peak = 0


class _Running:
    """Counts the units in flight in this process (one child: its peak is the bound)."""

    def __enter__(self) -> None:
        global _now, _peak
        _now += 1
        _peak = max(_peak, _now)

    def __exit__(self, *exc: object) -> None:
        global _now
        _now -= 1


@task
async def nap(seconds, label=""):
    """Waits ``seconds`` on the loop; returns the peak of units in flight in its process.
    With ``label`` "mark", notes first that it started."""
    if label == "mark":
        await Effect.objects.acreate(item_id=0, worker="nap_started", pid=os.getpid())
    with _Running():
        await asyncio.sleep(seconds)
    await Effect.objects.acreate(item_id=0, worker="nap", note=str(label), pid=os.getpid())
    return {"peak": _peak, "pid": os.getpid()}


@task
def sync_nap(seconds, label=""):
    """The same wait, in a plain function (runs alone in its child)."""
    with _Running():
        time.sleep(seconds)
    Effect.objects.create(item_id=0, worker="sync_nap", note=str(label), pid=os.getpid())
    return {"peak": _peak, "pid": os.getpid()}


@task(takes_context=True, retries=2, retry_delay=0, retry_for=(ValueError,))
async def async_flaky(context, succeed_on):
    await asyncio.sleep(0.05)
    if context.attempt < succeed_on:
        raise ValueError(f"attempt {context.attempt} failed")
    return context.attempt


@task(timeout=1)
async def async_hang(seconds):
    """Outlives its timeout while awaiting: cancelled on the loop."""
    await asyncio.sleep(seconds)
    return "woke"


@task
async def async_progress():
    await sync_to_async(set_progress)(50, "half way")
    await asyncio.sleep(0.05)
    return "done"


@task(timeout=1)
async def async_block(seconds):
    """Blocks its loop (a plain sleep in an async def): it cannot be cancelled there; its
    child is stopped past its timeout (``aio.STOP_GRACE``)."""
    time.sleep(seconds)
    return "woke"


@task(retries=3, retry_delay=0, retry_for=(Exception,))
async def async_orm(n):
    """Its ORM call runs in the thread shared by the child's async code (asgiref's)."""
    await Effect.objects.acreate(item_id=n, worker="async_orm", pid=os.getpid())
    return n


@task
def thread_names():
    """The names of its child's threads (the loop's and the units' appear lazily)."""
    import threading

    return sorted(t.name.split("_")[0] for t in threading.enumerate())


@task
async def async_snoozer(key):
    """Snoozes once (no attempt used), then returns."""
    from django_dbworker import Snooze

    if not await Effect.objects.filter(worker="snoozed", note=key).aexists():
        await Effect.objects.acreate(item_id=0, worker="snoozed", note=key)
        raise Snooze(0.1)
    return "awake"

def register_workers() -> list[str]:
    """Register the async row workers; returns their names."""

    @worker(source=Item, eligible=Item.objects.filter(kind="async_loose"),
            transactional=False, name="async_loose")
    async def async_loose(item):
        with _Running():
            await asyncio.sleep(0.3)
        if item.action == "boom":
            raise ValueError(f"item {item.pk} exploded")
        await Effect.objects.acreate(item_id=item.pk, worker="async_loose",
                                     note=str(_peak), pid=os.getpid())
        return Finished()

    @worker(source=Item, eligible=Item.objects.filter(kind="async_tx"), name="async_tx")
    async def async_tx(item):
        """Transactional: its ORM calls (``sync_to_async``) run in its transaction."""
        with _Running():
            await Effect.objects.acreate(item_id=item.pk, worker="async_tx",
                                         pid=os.getpid())
            await asyncio.sleep(0.1)
        if item.action == "boom":
            raise ValueError("rolled back with the Effect written before")
        return Finished()

    return ["async_loose", "async_tx"]


if os.environ.get("DBWORKER_TEST_ASYNC"):
    register_workers()

