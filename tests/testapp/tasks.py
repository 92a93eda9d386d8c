"""Tasks the tests enqueue; their behaviour is chosen by their arguments."""

import asyncio
import gc
import os
import time

from django_dbworker import set_progress
from django_dbworker.djtasks import task

from .models import Effect
from .workers import Unprintable, _exhaust_memory


def record_success(result, value):
    Effect.objects.create(item_id=0, worker="on_success", note=str(value))


def record_failure(result, exc):
    Effect.objects.create(item_id=0, worker="on_failure", note=type(exc).__name__)


def broken_callback(result, value):
    raise RuntimeError("callback is broken")


@task
def add(a, b):
    return a + b


@task(queue_name="emails", priority=10)
def send_email(address):
    Effect.objects.create(item_id=0, worker="send_email", note=address, pid=os.getpid())


@task(takes_context=True, retries=3, retry_delay=0, retry_for=(TimeoutError,))
def flaky(context, succeed_on):
    if context.attempt < succeed_on:
        raise TimeoutError(f"attempt {context.attempt} timed out")
    return context.attempt


@task(retries=2, retry_delay=0, on_failure=record_failure)
def always_fails():
    raise ValueError("always")


@task(retries=2)
def interrupted():
    """Stands for a Ctrl-C while it runs (test_immediate)."""
    raise KeyboardInterrupt("Ctrl-C")


@task(transactional=True)
def interrupted_in_transaction(item_id):
    Effect.objects.create(item_id=item_id, worker="interrupted")
    raise KeyboardInterrupt("Ctrl-C")


@task(retries=3, retry_for=(TimeoutError,), retry_delay=0)
def wrong_exception():
    raise KeyError("not retried")


@task(timeout=1, retries=1, retry_delay=0, retry_for=(TimeoutError,))
def sleeper(seconds):
    Effect.objects.create(item_id=0, worker="sleeper", pid=os.getpid())
    time.sleep(seconds)
    return "woke"


@task(queue_name="slow")
def long_running(seconds):
    Effect.objects.create(item_id=0, worker="long_running", pid=os.getpid())
    time.sleep(seconds)


@task
def gc_frozen():
    """How many objects the garbage collector leaves alone here (``gc.freeze()``)."""
    return gc.get_freeze_count()


@task
def returns_object():
    return object()


@task
def big_result(size):
    return "x" * size


@task
def with_progress(seconds):
    set_progress(50, "half way")
    time.sleep(seconds)
    return "done"


@task(rate_limit="2/s")
def limited(n):
    Effect.objects.create(item_id=n, worker="limited", pid=os.getpid())


@task(on_success=record_success)
def succeeds_with_callback():
    return 7


@task(on_success="tests.testapp.tasks.broken_callback")
def broken_callback_task():
    return 1


@task
async def async_add(a, b):
    await asyncio.sleep(0)
    return a + b


@task
def tick():
    Effect.objects.create(item_id=0, worker="tick", pid=os.getpid())


@task(backend="on_commit")
def committed(n):
    return n


@task(retries=1, retry_delay=3600)
def slow_retry():
    raise ValueError("later")


@task(retries=1, retry_delay=0, retry_for=(BaseException,), timeout=2)
def poison(action):
    """Misbehaves as ``action`` says; retried once whatever it raises."""
    Effect.objects.create(item_id=0, worker="poison", note=action, pid=os.getpid())
    if action == "abort":
        os.abort()
    if action == "memory":
        _exhaust_memory()
    if action == "exit":
        raise SystemExit(3)
    if action == "interrupt":
        raise KeyboardInterrupt
    if action == "hang":
        while True:
            time.sleep(1)
    return action


@task
def chaos_effect(n, seconds=0.0):
    """One Effect per run (the soak counts them against the attempts)."""
    Effect.objects.create(item_id=n, worker="chaos_task", pid=os.getpid())
    if seconds:
        time.sleep(seconds)
    return n


@task
def outside_effect(n, path, gate="", seconds=0.0):
    """A plain task that never touches the database: appends ``n`` to the file ``path`` (one
    line per run: its runs are counted there), then sleeps ``seconds``. A child running
    these keeps their successes to record together (tasks/completions.py).

    Given a ``gate``, it stands for a handler that runs through a database outage: when the
    server has closed a connection of this process (``_server_closed_ours``), it waits until
    the ``gate`` file exists (tests/restarts.py creates it once the server is back). The
    first statement its child sends after the outage is then the record of the successes
    it kept, on a connection that died."""
    with open(path, "a") as f:
        f.write(f"{n}\n")
    if gate and _server_closed_ours():
        while not os.path.exists(gate):
            time.sleep(0.02)
    if seconds:
        time.sleep(seconds)
    return n


def _server_closed_ours() -> bool:
    """Whether the database server closed a TCP connection of this process, seen without a
    statement: a socket of ours to the database's port waits in CLOSE_WAIT (Linux's /proc)."""
    from django.db import connection

    port = int(connection.settings_dict.get("PORT") or 0)
    ours = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            ours.add(target[8:-1])
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                lines = f.readlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "08" and inode in ours and int(remote.rsplit(":", 1)[1], 16) == port:
                return True
    return False


@task(timeout=30, takes_context=True)
def slow_first(context, n, seconds):
    """Sleeps on its first attempt only; a re-run returns at once. Returns who ran it."""
    Effect.objects.create(item_id=n, worker="slow_first", pid=os.getpid())
    if context.attempt == 1:
        time.sleep(seconds)
    return {"n": n, "pid": os.getpid(), "attempt": context.attempt}


@task(takes_context=True)
def wait_file(context, n, path):
    """Waits until the test creates ``path`` (a re-run finds it there). Returns who ran it."""
    Effect.objects.create(item_id=n, worker="wait_file", pid=os.getpid())
    while not os.path.exists(path):
        time.sleep(0.02)
    return {"n": n, "pid": os.getpid(), "attempt": context.attempt}


# ----- poison values, one per kind (tests/test_poison.py, test_poison_processes.py) -------


@task
def poison_innocent(n):
    Effect.objects.create(item_id=n, worker="poison_innocent", pid=os.getpid())
    return n


@task
def poison_return_nul(nested):
    return {"outer": ["ok", "a\x00b"]} if nested else "a\x00b"


@task
def poison_raise_nul():
    raise ValueError("a\x00b")


@task
def poison_exit():
    raise SystemExit(3)


@task
def poison_fails():
    raise ValueError("failed for real")


@task
def poison_unprintable():
    raise Unprintable()


@task
def poison_progress_nul():
    set_progress(50, "half\x00way")
    return "done"


@task(retries=1_000_000, retry_backoff=True, retry_backoff_factor=1000, retry_delay=1,
      retry_max_delay=600, retry_for=(ValueError,))
def poison_retry_overflow():
    raise ValueError("poison: fails again")


@task
def guard_spawn_orphan(pidfile):
    """Starts a process in a session of its own and never waits for it (tests/test_orphans)."""
    import subprocess
    from pathlib import Path

    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(pidfile).write_text(str(process.pid))
    return process.pid


@task(timeout=1.5)
def guard_spawn_and_hang(pidfile):
    """The same, then runs past its timeout: its child is killed, and the process with it."""
    import subprocess
    from pathlib import Path

    process = subprocess.Popen(["sleep", "300"], start_new_session=True)
    Path(pidfile).write_text(str(process.pid))
    time.sleep(60)


@task
def guard_subprocess_status():
    """A task's own subprocess gets its own exit status (SIGCHLD is the default in a child)."""
    import subprocess

    return subprocess.run(["sh", "-c", "exit 3"]).returncode


# ----- snooze (tests/test_snooze.py) ---------------------------------------------------------


@task(takes_context=True)
def snooze_then_succeed(context, times, delay=0):
    """Snoozes until it has snoozed ``times`` times, then returns what it saw."""
    from django_dbworker import Snooze

    result = context.task_result
    Effect.objects.create(item_id=result.snoozes, worker="snooze_then_succeed",
                          pid=os.getpid())
    if result.snoozes < times:
        set_progress(10 * (result.snoozes + 1), "waiting")
        raise Snooze(delay)
    return {"attempt": context.attempt, "snoozes": result.snoozes}


@task(max_snoozes=2, retries=1, retry_delay=0, on_failure=record_failure)
def snooze_forever(delay=0):
    from django_dbworker import Snooze

    raise Snooze(delay)


@task(max_snoozes=0, retries=2, retry_delay=0, retry_for=(TimeoutError,))
def snooze_never_allowed():
    from django_dbworker import Snooze

    raise Snooze(10)


@task(retries=1, retry_delay=0)
def snooze_bad(delay):
    from datetime import timedelta

    from django_dbworker import Snooze

    raise Snooze(timedelta(seconds=delay["seconds"]) if isinstance(delay, dict) else delay)


@task(retries=3, retry_delay=0)
def drop_session_in_atomic():
    """test_lost_session: the server ends the task's session inside its own atomic()."""
    from django.db import transaction

    from .workers import _drop_own_session

    with transaction.atomic():
        Effect.objects.create(item_id=0, worker="drop_session_in_atomic")
        _drop_own_session()


@task(retries=3, retry_delay=0)
def drop_session_always():
    """test_lost_session: the task ends its own session every time it runs."""
    from .workers import _drop_own_session

    Effect.objects.create(item_id=0, worker="drop_session_always")
    _drop_own_session()


@task(retries=3, retry_delay=0)
def protocol_confused_in_atomic():
    """test_lost_session: psycopg cannot make sense of the answer to the task's COMMIT."""
    from django.db import transaction

    from .workers import protocol_confused

    with transaction.atomic():
        Effect.objects.create(item_id=0, worker="protocol_confused_in_atomic")
        raise protocol_confused()


@task(retries=3, retry_delay=0, transactional=True)
def protocol_confused_transactional():
    """The same in a transactional task: the error at its COMMIT, ours."""
    from .workers import protocol_confused

    Effect.objects.create(item_id=0, worker="protocol_confused_in_atomic")
    raise protocol_confused()


# ----- uniqueness (tests/test_uniqueness.py) ------------------------------------------------


@task(unique_key="report")
def unique_report(day):
    return day


@task(unique_key=lambda user_id, **kwargs: f"user:{user_id}", on_duplicate="replace",
      unique_while="waiting")
def unique_debounced(user_id, note=""):
    Effect.objects.create(item_id=user_id, worker="unique_debounced", note=note)


@task(unique_key="hourly", unique_for=3600)
def unique_hourly(n):
    return n


@task(unique_for=60)
def unique_keyless(n):
    return n


@task
def pausing_mark(label, seconds=0.0):
    """test_pausing: enqueued into several queues (``.using(queue_name=...)``)."""
    time.sleep(seconds)
    Effect.objects.create(item_id=0, worker="pausing_mark", note=label, pid=os.getpid())
    return label


if os.environ.get("DBWORKER_TEST_CONCURRENCY"):  # the supervisors of test_concurrency_keys
    from . import concurrency_tasks  # noqa: F401


@task(unique_key=lambda account, n: f"sync:{account}:{n}", concurrency_limit=1,
      concurrency_key=lambda account, n: f"account:{account}")
def unique_and_limited(account, n):
    """test_uniqueness: unique per call and one running per account."""
    return n


# ----- transactional tasks (tests/test_transactional_tasks.py) ---------------------------------


def _effect(context, item_id, sleep_first, name):
    Effect.objects.create(item_id=item_id, worker=name, pid=os.getpid(),
                          note=str(context.attempt))
    if sleep_first and context.attempt == 1:
        time.sleep(sleep_first)
    return item_id


@task(transactional=True, takes_context=True)
def effect_once(context, item_id, sleep_first=0):
    """Writes an Effect, on its first attempt then sleeps: exactly once with transactional."""
    return _effect(context, item_id, sleep_first, "effect_once")


@task(takes_context=True)
def effect_plain(context, item_id, sleep_first=0):
    """The same without transactional=True: at least once."""
    return _effect(context, item_id, sleep_first, "effect_plain")


@task(transactional=True)
def effect_then_raise(item_id):
    Effect.objects.create(item_id=item_id, worker="effect_then_raise")
    raise ValueError("after writing")


@task(transactional=True, takes_context=True)
def effect_then_stolen(context, item_id):
    """Writes an Effect, then its claim is taken over (its token changed by another
    connection, as a reaper and a new claim would): the record is refused."""
    import threading

    from django.db import connections

    from django_dbworker.models import TaskRecord

    Effect.objects.create(item_id=item_id, worker="effect_then_stolen")

    def steal():
        try:
            import uuid

            TaskRecord.objects.filter(pk=context.task_result.id).update(token=uuid.uuid4())
        finally:
            connections.close_all()

    thread = threading.Thread(target=steal)
    thread.start()
    thread.join(30)
    return item_id


# ----- workflows (tests/test_workflow_groups.py, test_workflow_browser.py) --------------


@task
def wf_step(n, fail=False):
    """One Effect per run; returns n (or raises, with ``fail``)."""
    Effect.objects.create(item_id=n, worker="wf_step", pid=os.getpid())
    if fail:
        raise ValueError(f"step {n} failed")
    return n


@task
def wf_callback(workflow_id, label=""):
    """A completion callback: one Effect per run, noting the workflow it was called for."""
    Effect.objects.create(item_id=0, worker="wf_callback", note=workflow_id, pid=os.getpid())
    return label


@task
def wf_wait(n, path):
    """Waits until ``path`` exists, so that many end at about the same instant."""
    while not os.path.exists(path):
        time.sleep(0.005)
    Effect.objects.create(item_id=n, worker="wf_wait", pid=os.getpid())
    return n


# ----- workflows (tests/test_dependencies.py, test_dependency_races.py) -----------------


@task
def until(at, fail=False):
    """Returns (or raises, with ``fail``) at the wall-clock instant ``at`` (``time.time()``):
    two of these end at the same instant in two supervisors. Returns the pid of the
    process that ran it."""
    delay = at - time.time()
    if delay > 0:
        time.sleep(delay)
    if fail:
        raise ValueError("failed on purpose")
    return os.getpid()


@task
def join_effect(n):
    """One Effect per run; returns its dependencies' results."""
    from django_dbworker import dependency_results

    Effect.objects.create(item_id=n, worker="join", pid=os.getpid())
    return dependency_results()


if os.environ.get("DBWORKER_TEST_ASYNC"):  # test_async_units: async tasks and row workers
    from . import async_units  # noqa: F401
