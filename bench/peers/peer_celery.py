"""Celery 5 with a local Redis as the broker: ``celery worker --pool prefork -c 2``.

Runs in bench/.peers/celery (driver.py imports it; so does the worker, as its app). Redis
is ``PEER_REDIS_URL`` (a database number of its own: bench/peers.py passes it), emptied with
FLUSHDB before and after, that database only.

Latency from the caller's side is timed from just before ``delay()`` (driver.py); the
other figure, from the commit, is taken from Celery's ``after_task_publish`` signal (the
message is in Redis), not from the return of ``delay()``, which goes on for a while after
the publish.

Left: the messages still in the queue list plus those the worker has fetched ahead but
not yet started (kombu's Redis transport keeps them in the ``unacked`` hash until the task
is acknowledged, which, with the default early acknowledgement, is when it starts).
"""

from __future__ import annotations

import os
import time
from importlib import metadata
from typing import Any

import driver
import redis
from celery import Celery
from celery.signals import after_task_publish

LABEL = "Celery + Redis"
SHAPE = "prefork pool, 2 processes"
NEEDS = "redis"
REQUIREMENTS = ["celery[redis]==5.7.0", "kombu==5.7.0", "redis==8.1.0"]
QUEUE = "celery"
UNACKED = "unacked"

BROKER = os.environ.get("PEER_REDIS_URL", "redis://127.0.0.1:6379/13")
# Celery's "Optimizing" guide, for many short tasks: no results when none are wanted, a
# high prefetch multiplier; and no rate limits when none are used.
TUNING = {
    "task_ignore_result": True,
    "worker_prefetch_multiplier": int(os.environ.get("PEER_CELERY_PREFETCH", "64")),
    "worker_disable_rate_limits": True,
}

app = Celery("peer_celery", broker=BROKER)
app.conf.update(broker_connection_retry_on_startup=True, **TUNING)


published: list[float] = []


@after_task_publish.connect
def note_publish(**kwargs: Any) -> None:
    """The moment the broker has the message (the enqueue call goes on after it)."""
    published.append(time.time())


@app.task(name="noop")
def noop() -> None:
    pass


@app.task(name="stamp")
def stamp(path: str) -> None:
    driver.write_stamp(path)


class Bench:
    def __init__(self, config: dict[str, Any]) -> None:
        self.redis = redis.Redis.from_url(BROKER)

    def setup(self) -> None:
        self.redis.flushdb()

    def tuning(self) -> dict[str, Any]:
        return {**TUNING, "worker flags": "--without-gossip --without-mingle "
                "--without-heartbeat (one worker: nothing to talk to)",
                "broker": BROKER}

    def versions(self) -> dict[str, Any]:
        server = self.redis.info("server")["redis_version"]
        return {**{p: metadata.version(p) for p in ("celery", "kombu", "redis", "billiard")},
                "redis-server": server}

    def fill(self, jobs: int) -> None:
        with app.producer_or_acquire() as producer:
            for _ in range(jobs):
                noop.apply_async(producer=producer)
        published.clear()

    def workers(self) -> list[list[str]]:
        return [[str(driver.BIN / "celery"), "-A", "peer_celery", "worker", "--pool=prefork",
                 "--concurrency=2", "--loglevel=WARNING", "--without-gossip",
                 "--without-mingle", "--without-heartbeat"]]

    def remaining(self) -> int:
        with self.redis.pipeline(transaction=False) as pipe:
            return sum(pipe.llen(QUEUE).hlen(UNACKED).execute())

    def pending(self) -> bool:
        return self.remaining() > 0

    def stamp(self, path: str) -> float:
        stamp.delay(path)  # first: the caller's side is timed from just before this call
        moment = published[-1]
        published.clear()
        return moment

    def check(self, jobs: int) -> dict[str, Any]:
        return {"left": self.remaining()}

    def teardown(self) -> None:
        self.redis.flushdb()
        self.redis.close()
