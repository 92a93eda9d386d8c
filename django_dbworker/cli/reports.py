"""The read-only commands: inspect, stats, failed, dead, supervisors."""

from __future__ import annotations

from typing import Any

from django.db.models import Exists, OuterRef, Q

from .. import conf
from ..insight import snapshot
from ..models import Execution, Failure, Supervisor, TaskRecord, TaskStatus
from ..rows.registry import workers
from ..tasks import names
from . import OperationError, units


def _using() -> str:
    return conf.get().DATABASE


def check_names(worker_names: list[str] | None, queue_names: list[str] | None) -> None:
    """OperationError naming workers and queues that are neither declared nor stored."""
    problems = []
    if worker_names:
        known = names.worker_names()
        if bad := names.unknown(worker_names, known):
            problems.append(f"unknown worker(s) {', '.join(map(repr, bad))} (known: "
                            f"{', '.join(known) or 'none'})")
    if queue_names:
        known = names.queue_names()
        if bad := names.unknown(queue_names, known):
            problems.append(f"unknown queue(s) {', '.join(map(repr, bad))} (known: "
                            f"{', '.join(known) or 'none'})")
    if problems:
        raise OperationError("; ".join(problems).capitalize() + ".")


def supervisor(s: Supervisor) -> dict[str, Any]:
    """One supervisor as JSON; its state by the database's clock where it was read with it
    (``judged()``)."""
    return {
        "id": str(s.pk), "host": s.host, "pid": s.pid, "state": s.state(),
        "started_at": s.started_at, "last_heartbeat": s.last_heartbeat,
        "stopped_at": s.stopped_at, "exit_code": s.exit_code, "concurrency": s.concurrency,
        "workers": s.workers, "queues": s.queues, "burst": s.burst,
        "units_done": s.units_done, "running": s.running,
    }


def inspect(ids: list[str]) -> dict[str, Any]:
    """With ids: those executions and tasks in full. Without: who runs what, right now."""
    if ids:
        executions, tasks = units.find(ids)
        return {"units": [units.execution(e) for e in executions]
                + [units.task(t) for t in tasks]}
    rows = Supervisor.objects.using(_using()).recent().judged()
    return {
        "supervisors": [supervisor(s) for s in rows if s.state() != "stopped"],
        "workers": [
            {"name": w.name, "source": w.source._meta.label, "concurrency": w.concurrency,
             "transactional": w.transactional}
            for w in sorted(workers.values(), key=lambda w: w.name)
        ],
        "queues": names.configured_queues(),
    }


#: The version of ``stats``' JSON document (docs/cli.md), by ``--exact``: version 2's
#: counts stop at ``insight.counts.CAP`` (a line's ``at_least`` names those statuses);
#: version 1 counted every row.
STATS_VERSIONS = {False: 2, True: 1}


def stats(worker_names: list[str] | None, queue_names: list[str] | None, *,
          exact: bool = False) -> dict[str, Any]:
    check_names(worker_names, queue_names)
    if worker_names or queue_names:  # only what was named
        return snapshot.take(worker_names or [], queue_names or [], exact=exact).as_dict()
    return snapshot.take(exact=exact).as_dict()


#: The listings of failures and the version of each one's JSON document (docs/cli.md):
#: ``failed`` both kinds below (version 2: version 1 listed only what will be tried
#: again, which ``failed --retrying`` still writes); ``retrying`` what failed an attempt
#: and will be tried again; ``dead`` what FAILED for good.
LISTINGS = {"failed": 2, "retrying": 1, "dead": 1}


def failures(worker_names: list[str] | None, queue_names: list[str] | None, *, limit: int,
             traceback: bool, listing: str) -> dict[str, Any]:
    """Executions and tasks that failed, at most ``limit`` of each; every one says whether
    it ``will_retry``. ``retrying``: those that failed an attempt and will be tried again,
    the next try first: tasks RETRYING, and tasks and executions given back after a crash
    (a lost lease, a killed child). ``dead``: those FAILED for good, newest first.
    ``failed``: the first, then the second."""
    check_names(worker_names, queue_names)
    parts = {"retrying": [_retrying(worker_names, queue_names)],
             "dead": [_dead(worker_names, queue_names)]}
    parts["failed"] = parts["retrying"] + parts["dead"]
    doc: dict[str, Any] = {"executions": [], "tasks": [], "counts": {"executions": 0,
                                                                     "tasks": 0}}
    retrying = {"executions": 0, "tasks": 0}
    for will_retry, executions, tasks in parts[listing]:
        for key, rows, as_dict in (("executions", executions, units.execution),
                                   ("tasks", tasks, units.task)):
            room = limit - len(doc[key])
            found = [as_dict(r, traceback=traceback) for r in rows[:room]] if room else []
            doc[key] += [{**d, "will_retry": will_retry} for d in found]
            count = rows.count()
            doc["counts"][key] += count
            retrying[key] += count if will_retry else 0
    if listing == "failed":
        doc["counts"]["will_retry"] = retrying
    return doc


def _retrying(worker_names: list[str] | None,
              queue_names: list[str] | None) -> tuple[bool, Any, Any]:
    using = _using()
    had_failure = Exists(Failure.objects.filter(execution=OuterRef("pk")))
    executions = (Execution.objects.using(using).claimable().filter(had_failure)
                  .order_by("available_at", "id"))
    tasks = (TaskRecord.objects.using(using).ready()
             .filter(Q(status=TaskStatus.RETRYING) | Q(crashes__gt=0))
             .order_by("available_at", "id"))
    return True, *_named(executions, tasks, worker_names, queue_names)


def _dead(worker_names: list[str] | None,
          queue_names: list[str] | None) -> tuple[bool, Any, Any]:
    using = _using()
    executions = Execution.objects.using(using).failed().order_by("-finished_at", "-id")
    tasks = TaskRecord.objects.using(using).failed().order_by("-finished_at", "-id")
    return False, *_named(executions, tasks, worker_names, queue_names)


def _named(executions: Any, tasks: Any, worker_names: list[str] | None,
           queue_names: list[str] | None) -> tuple[Any, Any]:
    """Only the workers' and queues' named, if any were (naming only workers lists no
    task, and the other way round)."""
    if worker_names is not None or queue_names is not None:
        executions = executions.filter(worker__in=worker_names or [])
        tasks = tasks.filter(queue_name__in=queue_names or [])
    return executions.prefetch_related("failures"), tasks


def supervisors(*, dead: bool) -> dict[str, Any]:
    """The supervisors of the last day and what they run; ``dead``: only those that
    stopped beating without stopping, and what became of their units."""
    using = _using()
    rows = (Supervisor.objects.using(using).dead() if dead
            else Supervisor.objects.using(using).recent().order_by("-started_at"))
    found = []
    for s in rows.judged():
        doc = supervisor(s)
        if dead:
            for unit in doc["running"]:
                unit["status_now"] = _status_now(unit, using)
        found.append(doc)
    return {"supervisors": found}


def _status_now(unit: dict[str, Any], using: str) -> str | None:
    if "task" in unit:
        return TaskRecord.objects.using(using).filter(pk=unit["id"]).values_list(
            "status", flat=True).first()
    execution: Any = unit.get("execution")  # None (no such row) if missing
    return Execution.objects.using(using).filter(pk=execution).values_list(
        "state", flat=True).first()
