"""Which workers and queues exist: registered or configured, plus any the tables hold
(``pause()`` checks names against them; the admin and the CLI list them)."""

from __future__ import annotations

from .. import conf
from ..djtasks import task_backends
from ..models import Execution, TaskRecord
from ..rows.registry import workers

#: The backend class whose queues are django-dbworker's (by path, as ``TASKS`` names it).
BACKEND = "django_dbworker.backend.DBWorkerBackend"


def _ours(backend: object) -> bool:
    """Whether ``backend`` is a ``DBWorkerBackend`` (or a subclass)."""
    return any(f"{k.__module__}.{k.__qualname__}" == BACKEND for k in type(backend).__mro__)


def configured_queues() -> list[str]:
    """The queues of every ``DBWorkerBackend`` in ``TASKS``."""
    return sorted({q for b in task_backends.all() if _ours(b) for q in b.queues})


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
