"""Tasks for the benchmarks: one that does nothing, one that says when it started."""

import time

from django.tasks import task


@task
def noop():
    """The throughput task."""


@task
def touch(item_id, *, note=""):
    """The enqueue benchmark's task with arguments: one id and a keyword, as most tasks."""


@task
def stamp():
    """The latency task: its return value is time.time() when it started."""
    return time.time()


@task(unique_key=lambda n: f"noop:{n}")
def unique_noop(n):
    """flow_control.py: a no-op whose calls are unique by their argument."""


@task
async def wait_io(seconds):
    """async_io.py: an I/O-bound task, an await of ``seconds`` standing for a call to
    another service."""
    import asyncio

    await asyncio.sleep(seconds)
