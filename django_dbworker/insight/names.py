"""Which workers and queues exist: registered or configured, plus any the tables hold."""

from __future__ import annotations

from .. import conf
from ..djtasks import task_backends
from ..models import Execution, TaskRecord
from ..registry import workers


def configured_queues() -> list[str]:
    from ..backend import DBWorkerBackend

    return sorted({q for b in task_backends.all() if isinstance(b, DBWorkerBackend)
                   for q in b.queues})


def worker_names(stored: bool = True) -> list[str]:
    names = set(workers)
    if stored:
        names |= set(Execution.objects.using(conf.get().DATABASE)
                     .values_list("worker", flat=True).distinct())
    return sorted(names)


def queue_names(stored: bool = True) -> list[str]:
    names = set(configured_queues())
    if stored:
        names |= set(TaskRecord.objects.using(conf.get().DATABASE)
                     .values_list("queue_name", flat=True).distinct())
    return sorted(names)


def unknown(given: list[str], known: list[str]) -> list[str]:
    return [name for name in dict.fromkeys(given) if name not in known]
