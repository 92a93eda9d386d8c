"""A drain under two supervisors through a database restart (issue 36, item 3).

Shared by tests/test_restart.py (a private PostgreSQL: ``pg_ctl -m fast`` and
``-m immediate``) and tests/test_restart_mariadb.py (a private ``mariadbd``: killed, and
shut down cleanly): what an operator's restart, failover or maintenance window does to a
queue in use. The work is four kinds at once, enqueued interleaved in ``ROUNDS`` rounds so
that every kind is in flight when the server goes away:

* ``ROWS`` source rows of the transactional ``touch`` worker (one ``Effect`` in its
  transaction, then 10 ms), then of ``after_touch`` (one ``Effect`` too): rows run
  exactly once;
* ``PLAIN`` plain tasks that write to the database (``chaos_effect``: one ``Effect`` per
  run, in autocommit) and ``OUTSIDE`` plain tasks that never touch it (``outside_effect``:
  one line per run in a file, then 2 ms): many short tasks, so children keep successes to
  record in batches (tasks/completions.py). Plain tasks run at least once: how many ran
  twice is counted and printed, not limited;
* ``TRANSACTIONAL`` transactional tasks (``effect_once``: one ``Effect`` in the task's
  transaction, 5 ms on the first attempt): exactly once.

An outside task that starts after the server closed its child's connection waits until the
test creates a gate file, once the server is back (``outside_effect``): as a handler that
runs through the outage would, it keeps its child from sending a statement meanwhile, so
what that child sends first afterwards, on the connection that died, is the batched record
of the successes it kept (the case of issue 36: a whole batch recorded FAILED, "the
database refused recording its outcome").

The stop comes when every kind is under way, at a moment a child is amid a batch of outside
tasks (``Drain.batch_running``). Two ``runworkers --concurrency 2`` run it. After the
restart, once every unit has ended, ``check`` says what went wrong: a unit FAILED (a
failure row, a FAILED task or execution), a plain task not SUCCESSFUL, a transactional
task's or a row's ``Effect`` missing or there twice, a crash counted (for an outage shorter
than the lease), a supervisor gone, a child replaced. Nothing here bounds wall-clock time:
the waits are for counts and statuses, with generous timeouts.
"""

from __future__ import annotations

import json
import math
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from tests.conftest import ROOT, Runworkers

ROWS, PLAIN, OUTSIDE, TRANSACTIONAL = 80, 60, 300, 60
SUPERVISORS = 2
#: Enqueued in this many rounds, each with a share of every kind.
ROUNDS = 16
#: Seconds every unit has to end after the restart (a stuck one is taken back within a
#: lease, 30 s by default).
SETTLE = 120
#: Seconds the stop waits, at most, for a child to be amid a batch of outside tasks.
MOMENT = 10
#: Seconds the work has to get under way.
UNDER_WAY = 120

PLAIN_PATH = "tests.testapp.tasks.chaos_effect"
OUTSIDE_PATH = "tests.testapp.tasks.outside_effect"
TRANSACTIONAL_PATH = "tests.testapp.tasks.effect_once"
TASKS = {PLAIN_PATH: PLAIN, OUTSIDE_PATH: OUTSIDE, TRANSACTIONAL_PATH: TRANSACTIONAL}
ROW_WORKERS = ("touch", "after_touch")

#: Log events counted per supervisor in the summary.
EVENTS = ("database_error", "reconnected", "child_database_error", "unit_error",
          "unit_session_ended", "unit_unrecordable", "child_died", "child_exited", "reaped")

Query = Callable[[str], list[tuple]]


def _share(total: int, r: int) -> range:
    each = math.ceil(total / ROUNDS)
    return range(r * each, min((r + 1) * each, total))


class Drain:
    """The work of one test: its files (the outside tasks' runs, the gate), its seed."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.runs = folder / "outside-runs.txt"
        self.gate = folder / "gate"

    def seed(self, env: dict[str, str]) -> None:
        """Migrate the (empty, created) database ``env`` names and enqueue the work, every
        kind a share of it in each round (rows saved one by one: their units are there at
        once, not at the next sweep)."""
        script = f"""
import django
django.setup()
from tests.testapp.models import Item
from tests.testapp.tasks import chaos_effect, effect_once, outside_effect
from tests.restarts import ROUNDS, ROWS, PLAIN, OUTSIDE, TRANSACTIONAL, _share
runs, gate = {str(self.runs)!r}, {str(self.gate)!r}
for r in range(ROUNDS):
    for _ in _share(ROWS, r):
        Item.objects.create(action="sleep:0.01")  # its executions PENDING at once
    chaos_effect.enqueue_many([((n,), {{}}) for n in _share(PLAIN, r)])
    effect_once.enqueue_many([((n, 0.005), {{}}) for n in _share(TRANSACTIONAL, r)])
    outside_effect.enqueue_many([((n, runs, gate, 0.002), {{}}) for n in _share(OUTSIDE, r)])
"""
        for command in ([sys.executable, "-m", "django", "migrate", "-v", "0"],
                        [sys.executable, "-c", script]):
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]

    def batch_running(self, timeout: float) -> bool:
        """Wait until outside tasks run one after the other (their file grew by two lines
        or more in 5 ms): a child is amid a batch of them, keeping their successes, the
        moment to stop the server. False after ``timeout`` seconds without one."""
        deadline = time.monotonic() + timeout
        last = self._lines()
        while time.monotonic() < deadline:
            time.sleep(0.005)
            now = self._lines()
            if now - last >= 2:
                return True
            last = now
        return False

    def _lines(self) -> int:
        try:
            with open(self.runs, "rb") as f:
                return f.read().count(b"\n")
        except FileNotFoundError:
            return 0

    def outside_runs(self) -> Counter[int]:
        try:
            return Counter(int(line) for line in self.runs.read_text().split())
        except FileNotFoundError:
            return Counter()



def _effects(query: Query) -> dict[str, Counter[int]]:
    """Effects per worker name, counted per item id."""
    per: dict[str, Counter[int]] = {}
    for worker, item_id, n in query("SELECT worker, item_id, count(*) FROM testapp_effect "
                                    "GROUP BY worker, item_id"):
        per.setdefault(worker, Counter())[int(item_id)] = int(n)
    return per


def _tasks(query: Query) -> Counter[tuple[str, str]]:
    return Counter({(path, status): int(n) for path, status, n in query(
        "SELECT task_path, status, count(*) FROM django_dbworker_taskrecord "
        "GROUP BY task_path, status")})


def _executions(query: Query) -> Counter[tuple[str, str]]:
    return Counter({(worker, state): int(n) for worker, state, n in query(
        "SELECT worker, state, count(*) FROM django_dbworker_execution "
        "GROUP BY worker, state")})


def _under_way(query: Query) -> bool:
    """A fifth of the plain tasks and of the rows' runs are done, a tenth of the
    transactional tasks: whichever kind the supervisors took first, every kind still has
    work left (the rows' second worker, ``after_touch``, comes after the first)."""
    try:
        done = Counter({w: int(n) for w, n in query(
            "SELECT worker, count(*) FROM testapp_effect GROUP BY worker")})
    except Exception:
        return False
    return (done["chaos_task"] >= PLAIN // 5 and done["effect_once"] >= TRANSACTIONAL // 10
            and done["touch"] + done["after_touch"] >= ROWS // 5)


def _in_flight(query: Query) -> str:
    """What is claimed and not ended right now, and what is done (said in the summary)."""
    tasks, executions = _tasks(query), _executions(query)
    running = ", ".join(f"{tasks[path, 'RUNNING']} {path.rsplit('.', 1)[1]}"
                        for path in TASKS)
    done = ", ".join(f"{tasks[path, 'SUCCESSFUL']}/{total} {path.rsplit('.', 1)[1]}"
                     for path, total in TASKS.items())
    return (f"running {running}, "
            f"{executions['touch', 'WORKING'] + executions['after_touch', 'WORKING']} rows; "
            f"done {done}, {executions['touch', 'FINISHED']}/{ROWS} touch, "
            f"{executions['after_touch', 'FINISHED']}/{ROWS} after_touch")


def _settled(query: Query) -> bool:
    """Every unit has ended, whatever its status (so a FAILED one is reported at once)."""
    try:
        tasks, executions = _tasks(query), _executions(query)
    except Exception:  # the server is still starting
        return False
    ended_tasks = sum(n for (_, status), n in tasks.items()
                      if status in ("SUCCESSFUL", "FAILED", "CANCELLED"))
    ended_rows = sum(n for (worker, state), n in executions.items()
                     if worker in ROW_WORKERS and state in ("FINISHED", "FAILED"))
    return ended_tasks == sum(TASKS.values()) and ended_rows == ROWS * len(ROW_WORKERS)


def _last_error(errors: object) -> str:
    """A task's last error (its ``errors``, JSON as text on MariaDB): its message and the
    end of its traceback, where the statement that failed is."""
    if isinstance(errors, bytes | str):
        errors = json.loads(errors)
    if not isinstance(errors, list) or not errors:
        return repr(errors)[:1500]
    last = errors[-1]
    return (f"{last.get('exception_class_path')}: {last.get('message')}\n"
            f"...{str(last.get('traceback'))[-2500:]}")


def _wait(predicate: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def _lines(log: str, event: str) -> list[str]:
    return [line for line in log.splitlines() if re.search(rf"\b{event}\b", line)]


def _kind(line: str) -> str:
    for kind, mark in (("chaos_effect", "chaos_effect"), ("outside_effect", "outside_effect"),
                       ("effect_once", "effect_once"), ("touch", "'touch'"),
                       ("after_touch", "'after_touch'")):
        if mark in line:
            return kind
    return "other"


def check(query: Query, drain: Drain, supervisors: list[Runworkers],
          children: list[list[int]], crashes_allowed: bool) -> tuple[list[str], str]:
    """What went wrong (empty: nothing), and a summary of what happened. A crash counted
    (``crashes``: what MAX_CRASHES ends) is wrong too unless ``crashes_allowed``: an outage
    shorter than the lease is nobody's fault; past the lease, a reaper takes the units back
    and counts that as a crash by design."""
    problems: list[str] = []
    tasks, executions, effects = _tasks(query), _executions(query), _effects(query)
    failures = query("SELECT exception_class, message FROM django_dbworker_failure")
    if failures:
        problems.append(f"{len(failures)} failure rows, e.g. {failures[:3]}")
    failed_tasks = query("SELECT task_path, errors FROM django_dbworker_taskrecord "
                         "WHERE status = 'FAILED'")
    if failed_tasks:
        by_path = Counter(path for path, _ in failed_tasks)
        problems.append(f"{len(failed_tasks)} tasks FAILED ({dict(by_path)}), the first's "
                        f"last error: {_last_error(failed_tasks[0][1])}")
    failed_rows = sum(n for (_, state), n in executions.items() if state == "FAILED")
    if failed_rows:
        problems.append(f"{failed_rows} executions FAILED: {dict(executions)}")

    # Every task SUCCESSFUL; plain ones ran at least once, transactional ones exactly once.
    for path, total in TASKS.items():
        if tasks[path, "SUCCESSFUL"] != total:
            problems.append(f"{tasks[path, 'SUCCESSFUL']} of {total} {path} SUCCESSFUL: "
                            f"{ {s: n for (p, s), n in tasks.items() if p == path} }")
    runs = {PLAIN_PATH: effects.get("chaos_task", Counter()),
            OUTSIDE_PATH: drain.outside_runs(),
            TRANSACTIONAL_PATH: effects.get("effect_once", Counter())}
    for path, total in TASKS.items():
        never = sorted(set(range(total)) - set(runs[path]))
        if never:
            problems.append(f"{len(never)} {path} never ran (no Effect), e.g. {never[:10]}")
    repeated = {n: c for n, c in runs[TRANSACTIONAL_PATH].items() if c != 1}
    if repeated:
        problems.append(f"transactional tasks' Effects not exactly once: {repeated}")
    twice = {path: sum(1 for c in runs[path].values() if c > 1)
             for path in (PLAIN_PATH, OUTSIDE_PATH)}

    # Rows: every one FINISHED by both workers, each Effect there exactly once.
    items = {int(pk) for (pk,) in query("SELECT id FROM testapp_item")}
    for worker in ROW_WORKERS:
        finished = {int(pk) for (pk,) in query(
            "SELECT source_id FROM django_dbworker_execution "
            f"WHERE worker = '{worker}' AND state = 'FINISHED'")}
        ran = effects.get(worker, Counter())
        if finished != items or len(items) != ROWS:
            problems.append(f"{worker}: {len(finished)} of {len(items)} rows FINISHED")
        if set(ran) != items or any(c != 1 for c in ran.values()):
            problems.append(f"{worker}: Effects of {len(set(ran) & items)} of {len(items)} "
                            f"rows, {sum(1 for c in ran.values() if c != 1)} not exactly "
                            f"once")

    # The supervisors: both still up, their children the same processes.
    logs = [rw.output() for rw in supervisors]
    for i, (rw, before, log) in enumerate(zip(supervisors, children, logs, strict=True)):
        if rw.process.poll() is not None:
            problems.append(f"supervisor {i} exited ({rw.process.returncode}):\n"
                            f"{log[-2000:]}")
            continue
        if sorted(rw.children()) != before:
            problems.append(f"supervisor {i}: children {before} replaced by "
                            f"{sorted(rw.children())}")
        for event in ("child_died", "child_exited"):
            if found := _lines(log, event):
                problems.append(f"supervisor {i}: {len(found)} {event} lines, e.g. {found[0]}")
    given_back = Counter(_kind(line) for log in logs
                         for line in _lines(log, "child_database_error"))
    ended = Counter(_kind(line) for log in logs
                    for line in _lines(log, "unit_session_ended"))
    crashes = sum(int(n or 0) for (n,) in query(
        "SELECT sum(crashes) FROM django_dbworker_taskrecord UNION ALL "
        "SELECT sum(crashes) FROM django_dbworker_execution"))
    if crashes and not crashes_allowed:
        counted = query("SELECT task_path, crashes, errors FROM django_dbworker_taskrecord "
                        "WHERE crashes > 0")
        counted += query("SELECT worker, crashes, source_id FROM django_dbworker_execution "
                         "WHERE crashes > 0")
        problems.append(f"{crashes} crashes counted for a restart shorter than the lease "
                        f"(unit_session_ended lines by kind: {dict(ended)}), e.g. "
                        f"{str(counted[:2])[:1500]}")
    unit_errors = [line for log in logs for line in _lines(log, "unit_error")]
    if problems and unit_errors:
        problems.append(f"{len(unit_errors)} unit_error lines, e.g.:\n"
                        + "\n".join(line[:700] for line in unit_errors[:4]))

    attempts = dict(query("SELECT task_path, sum(attempts) FROM django_dbworker_taskrecord "
                          "GROUP BY task_path"))
    events = "; ".join(
        f"supervisor {i}: " + ", ".join(f"{e} {len(_lines(log, e))}" for e in EVENTS
                                        if _lines(log, e))
        for i, log in enumerate(logs))
    ran = ", ".join(f"{path.rsplit('.', 1)[1]} {twice.get(path, 0)} of {total} ran twice "
                    f"or more ({sum(runs[path].values())} runs, "
                    f"{int(attempts.get(path) or 0)} attempts)"
                    for path, total in TASKS.items())
    summary = (f"{ran}; rows: {executions['touch', 'FINISHED']} touch, "
               f"{executions['after_touch', 'FINISHED']} after_touch FINISHED; "
               f"crashes counted: {crashes}; given back by children for a database error: "
               f"{dict(given_back)}; session ended (a crash): {dict(ended)}; log: {events}")
    return problems, summary


def restart_during_drain(label: str, query: Query, drain: Drain, env: dict[str, str],
                         outage: Callable[[], None], *, past_lease: bool,
                         diagnose: Callable[[], str] | None = None,
                         repair: Callable[[], list[str]] | None = None) -> None:
    """Two supervisors drain the seeded work; ``outage`` stops the server and starts it
    again once every kind of unit is under way; the gate opens once it is back; then every
    unit must end well (``check``; ``past_lease``: the server was down longer than the
    lease). Where something went wrong, ``diagnose()`` adds what the server says. Where
    the work did not settle, ``repair()`` may apply a documented remedy for a server fault
    (it returns what it did; nothing: no such fault), and the work must then settle."""
    supervisors: list[Runworkers] = []
    try:
        for i in range(SUPERVISORS):
            supervisors.append(Runworkers(["--concurrency", "2"], env,
                                          drain.folder / f"runworkers-{i}.log"))
        assert _wait(lambda: _under_way(query), UNDER_WAY), (
            f"the work did not get under way: {_in_flight(query)}\n"
            + supervisors[0].output()[-3000:])
        children = [sorted(rw.children()) for rw in supervisors]
        before = _in_flight(query)
        moment = drain.batch_running(MOMENT)
        started = time.monotonic()
        outage()
        back = time.monotonic()
        drain.gate.touch()
        settled = _wait(lambda: _settled(query), SETTLE)
        repaired = repair() if not settled and repair is not None else []
        if repaired:
            print(f"\n{label}: the server's fault, repaired as documented: {repaired}")
            settled = _wait(lambda: _settled(query), SETTLE)
        ended = time.monotonic()
        problems, summary = check(query, drain, supervisors, children, past_lease)
        if not settled:
            problems.insert(0, f"not every unit ended within {SETTLE}s of the restart: "
                               f"{_in_flight(query)}")
        print(f"\n{label}: before the stop, {before}; stopped "
              f"{'amid' if moment else 'not seen amid'} a batch of outside tasks; outage "
              f"{back - started:.1f}s, every unit ended {ended - back:.1f}s after the start; "
              f"{summary}")
        if problems and diagnose is not None:
            problems.append(diagnose())
        assert not problems, "\n".join(problems)

        for rw in supervisors:
            rw.signal(signal.SIGTERM)
        for rw in supervisors:
            assert rw.wait(60) == 0, rw.output()[-3000:]
    finally:
        for rw in supervisors:
            rw.stop()
