"""Workers the tests drive through their source rows' fields."""

import os
import resource
import signal
import threading
import time

from django.db import connection, connections, transaction
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL

from django_dbworker import (
    ExecutionStatus,
    Finished,
    Unfinished,
    has_execution_status,
    has_task_status,
    worker,
    workers,
)

from .models import Awaiting, Document, Effect, Item, Ranked, Slow, Solo, Tag


def _act(item, name, context=None):
    Effect.objects.create(item_id=item.pk, worker=name, pid=os.getpid())
    action = item.action
    if action == "ok":
        return Finished()
    if action.startswith("sleep:"):
        time.sleep(float(action.split(":")[1]))
        return Finished()
    if action.startswith("sleep_first:"):
        # Sleep on the unit's first attempt only: a re-run (after a crash, a takeover or a
        # cut-off) finishes at once.
        if workers[name].state(item.pk)["attempts"] <= 1:
            time.sleep(float(action.split(":")[1]))
        return Finished()
    if action == "raise":
        raise ValueError(f"item {item.pk} is broken")
    if action == "return_str":
        return "done"
    if action == "commit":
        transaction.commit()
    if action == "raw_commit":
        with connection.cursor() as cursor:
            cursor.execute("COMMIT")
        return Finished()
    if action == "raw_rollback":
        with connection.cursor() as cursor:
            cursor.execute("ROLLBACK")
        return Finished()
    if action == "close":
        connection.close()
        return Finished()
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "exit":
        raise SystemExit(3)
    if action.startswith("steps:"):
        total = int(action.split(":")[1])
        Item.objects.filter(pk=item.pk).update(steps=item.steps + 1)
        return Finished() if item.steps + 1 >= total else Unfinished()
    if action == "wait":
        return Unfinished(delay=3600)
    if action == "abort":  # like a segfault: the process dies by a signal (SIGABRT)
        os.abort()
    if action == "memory":
        _exhaust_memory()
    if action == "interrupt":
        raise KeyboardInterrupt
    if action.startswith("sleep_pct:"):
        # Some units (this percentage, chosen by pk) take 0.2 s: used by
        # the chaos soak so that its kills land mid-handler.
        if item.pk % 100 < int(action.split(":")[1]):
            time.sleep(0.2)
        return Finished()
    if action.startswith("wait_file:"):
        # Wait until the test creates this file (a re-run finds it there and finishes).
        path = action.split(":", 1)[1]
        while not os.path.exists(path):
            time.sleep(0.02)
        return Finished()
    if action == "isolation":  # PostgreSQL: note the isolation level the handler runs at
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('transaction_isolation')")
            (level,) = cursor.fetchone()
        Effect.objects.filter(item_id=item.pk, worker=name).update(note=level)
        return Finished()
    if action == "deferred_violation":  # PostgreSQL: fails at COMMIT, not before
        with connection.cursor() as cursor:
            cursor.execute("CREATE TEMPORARY TABLE deferred_check (v integer UNIQUE "
                           "DEFERRABLE INITIALLY DEFERRED) ON COMMIT DROP")
            cursor.execute("INSERT INTO deferred_check VALUES (1), (1)")
        return Finished()
    if action == "on_commit":  # after the commit, in autocommit: an Effect of its own
        transaction.on_commit(lambda: Effect.objects.create(item_id=item.pk,
                                                            worker=f"{name}:on_commit"))
        return Finished()
    if action == "deallocate_first":  # PostgreSQL: the session loses its prepared
        # statements on the unit's first attempt, as behind a transaction-pooling PgBouncer
        if workers[name].state(item.pk)["attempts"] <= 1:
            with connection.cursor() as cursor:
                cursor.execute("DEALLOCATE ALL")
        return Finished()
    if action == "drop_session_first":  # the server ends the handler's session on the
        # unit's first attempt (an administrator, a failover, a pooler's restart)
        if workers[name].state(item.pk)["attempts"] <= 1:
            _drop_own_session()
        return Finished()
    if action == "idle_past_timeout":  # PostgreSQL ends the session of a transaction
        # idle longer than idle_in_transaction_session_timeout (a slow call in a handler)
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL idle_in_transaction_session_timeout = '100ms'")
        time.sleep(0.4)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")  # raises: the server ended the session
    if action == "drop_session_always":  # the handler ends its own session every time
        # (as one idling in its transaction past idle_in_transaction_session_timeout)
        _drop_own_session()
    if action == "protocol_confused_first":  # psycopg cannot make sense of the server's
        # answer to the handler's COMMIT (seen behind PgBouncer when the server connection
        # was ended mid-transaction), on the unit's first attempt
        if workers[name].state(item.pk)["attempts"] <= 1:
            raise protocol_confused()
        return Finished()
    if action == "delete_self":
        Item.objects.filter(pk=item.pk).delete()
        return Finished()
    if action == "deleted_meanwhile":  # another session deletes the row while this runs
        deleter = threading.Thread(target=_delete_elsewhere, args=(item.pk,))
        deleter.start()
        deleter.join()
        return Finished()
    raise AssertionError(f"unknown action {action!r}")


def _delete_elsewhere(pk):
    """Delete an item through Django on this thread's own connection, as another process
    would (its executions go with it: ``pending.on_delete``)."""
    try:
        Item.objects.filter(pk=pk).delete()
    finally:
        connections.close_all()  # this thread's


def protocol_confused() -> Exception:
    """What Django raises when psycopg got two results for a COMMIT: its own
    ``InternalError`` (no SQLSTATE), wrapped."""
    import psycopg
    from django.db import InternalError

    try:
        try:
            raise psycopg.InternalError("received 2 results from command 'COMMIT'")
        except psycopg.InternalError as cause:
            raise InternalError(*cause.args) from cause
    except InternalError as exc:
        return exc


def _drop_own_session():
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        else:
            cursor.execute("SELECT CONNECTION_ID()")
            (own,) = cursor.fetchone()
            cursor.execute(f"KILL CONNECTION {int(own)}")
        cursor.execute("SELECT 1")  # raises: the session is gone


class Unprintable(Exception):
    """An exception whose str() and repr() raise (the poison tests)."""

    def __str__(self):
        raise TypeError("str() of this exception is broken")

    def __repr__(self):
        raise TypeError("repr() of this exception is broken")


def _exhaust_memory():
    """Allocate until MemoryError, under an address-space limit set here (and lifted after),
    so the test machine's memory is never at risk."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * resource.getpagesize()
    resource.setrlimit(resource.RLIMIT_AS, (used + 256 * 1024 * 1024, hard))
    try:
        hog = []
        while True:
            hog.append(bytearray(32 * 1024 * 1024))
    finally:
        hog = None
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@worker(source=Item, eligible=lambda: Item.objects.filter(kind="touch", enabled=True),
        concurrency=4)
def touch(item):
    return _act(item, "touch")


@worker(
    source=Item,
    eligible=lambda: Item.objects.filter(kind="touch").filter(
        has_execution_status(worker="touch", statuses=[ExecutionStatus.FINISHED])
    ),
)
def after_touch(item, context):
    Effect.objects.create(item_id=item.pk, worker="after_touch", note=str(context.attempt))
    return Finished()


@worker(source=Item, eligible=lambda: Item.objects.filter(kind="ranked").order_by("-rank"))
def ranked(item):
    Effect.objects.create(item_id=item.pk, worker="ranked", note=str(item.rank))
    return Finished()


@worker(source=Item, eligible=Item.objects.filter(kind="loose"), transactional=False)
def loose(item):
    return _act(item, "loose")


@worker(source=Item, eligible=Item.objects.filter(kind="ahead"), transactional=False,
        concurrency=4)
def ahead(item):
    """Claimed ahead while a slow unit runs, on SQLite too (test_prefetch.py): it holds no
    transaction, so no write lock, while it sleeps."""
    return _act(item, "ahead")


@worker(source=Document)
def read_document(document):
    return Finished() if document.title != "bad" else Unfinished(delay=3600)


@worker(source=Tag, eligible=lambda: Tag.objects.order_by("-code"))
def tag(tag):
    return Finished()


@worker(source=Solo)
def solo(row):
    return _act(row, "solo")


@worker(source=Item, eligible=Item.objects.filter(kind="capped"), transactional=False,
        concurrency=1)
def capped(item):
    """One at a time per runworkers (test_caps.py): notes when it started and ended. Not
    transactional, so on SQLite two could overlap if the cap let them."""
    started = time.time()
    time.sleep(0.004)
    Effect.objects.create(item_id=item.pk, worker="capped", pid=os.getpid(),
                          note=f"{started:.6f} {time.time():.6f}")
    return Finished()


# ----- poison values, one per kind (tests/test_poison.py, test_poison_processes.py) -------


_poison_hoard = []


@worker(source=Item, eligible=lambda: Item.objects.filter(kind="poison").order_by("id"))
def poison_rows(item):
    """Innocent rows ("ok") write one Effect in their transaction; the others are one poison
    each; "hog:N" keeps N MiB allocated in its child (the per-child memory limit)."""
    Effect.objects.create(item_id=item.pk, worker="poison_rows", pid=os.getpid())
    action = item.action
    if action == "nul_raise":
        raise ValueError("a\x00b")
    if action == "unprintable":
        raise Unprintable()
    if action == "nul_progress":
        from django_dbworker import set_progress

        set_progress(10, "row\x00progress")
    if action == "return_str":
        return "done"
    if action == "exit":
        raise SystemExit(3)
    if action == "nan_delay":
        return Unfinished(delay=float("nan"))
    if action.startswith("hog:"):  # written, so resident (not calloc's untouched pages)
        _poison_hoard.append(b"x" * (int(action[4:]) * 1024 * 1024))
    return Finished()


def _ran(row, name):
    """One Effect per run: with one child, their ids are the order the handlers ran in."""
    Effect.objects.create(item_id=row.pk, worker=name, note=str(row.rank))
    return Finished()


@worker(source=Ranked)
def rank_pk(row):
    return _ran(row, "rank_pk")


@worker(source=Ranked, eligible=lambda: Ranked.objects.order_by("rank"))
def rank_up(row):
    return _ran(row, "rank_up")


@worker(source=Ranked, eligible=lambda: Ranked.objects.order_by("-rank"))
def rank_down(row):
    return _ran(row, "rank_down")


# ----- a claim that holds up the supervisor (tests/test_renewer.py) ------------------------


def _slow_rows():
    """Sleeps ``DBWORKER_TEST_SLOW_ELIGIBLE`` seconds in the database for each row it looks
    at, then finds it not eligible (``pg_sleep(s) IS NULL`` is false; SQLite's pg_sleep is
    tests/testapp/slow_sql.py): every claim of ``slow_eligible`` takes that long and claims
    nothing."""
    seconds = float(os.environ.get("DBWORKER_TEST_SLOW_ELIGIBLE", "0"))
    return Slow.objects.filter(
        RawSQL("pg_sleep(%s) IS NULL", [seconds], output_field=BooleanField()))


@worker(source=Slow, eligible=_slow_rows)
def slow_eligible(row):
    raise AssertionError("slow_eligible's rows are never eligible")


if os.environ.get("DBWORKER_TEST_CONCURRENCY"):  # the supervisors of test_concurrency_keys
    @worker(source=Item, eligible=Item.objects.filter(kind="conc_rows"), concurrency=4,
            concurrency_limit=2, concurrency_key="action", transactional=False)
    def conc_rows(item):
        """At most two at once per ``action``; writes when it started and ended (not
        transactional: on SQLite a transactional handler holds the only write lock, so
        they would run one at a time anyway)."""
        start = time.time()
        time.sleep(0.1)
        Effect.objects.create(item_id=item.pk, worker="conc_rows", pid=os.getpid(),
                              note=f"{item.action} {start!r} {time.time()!r}")
        return Finished()


@worker(source=Item, eligible=Item.objects.filter(kind="retried"), retries=2, retry_delay=0,
        retry_for=(ValueError,))
def retried(item, context):
    """``@worker(retries=...)`` (test_row_retries.py): action "fail:N" raises ValueError on
    its first N attempts, "type" a TypeError (not retried), "later" a ValueError whose
    retry would come an hour later (the retry_later worker)."""
    Effect.objects.create(item_id=item.pk, worker="retried", note=str(context.attempt))
    if item.action == "type":
        raise TypeError("not retried")
    if item.action.startswith("fail:") and context.attempt <= int(item.action[5:]):
        raise ValueError(f"attempt {context.attempt}")
    return Finished()


@worker(source=Item, eligible=Item.objects.filter(kind="retry_later"), retries=3,
        retry_delay=3600, retry_backoff=True)
def retry_later(item):
    raise ValueError("later")


@worker(source=Item, eligible=Item.objects.filter(kind="timed"), timeout=1, retries=1,
        retry_delay=0, retry_for=(TimeoutError,), transactional=False)
def timed(item):
    """``@worker(timeout=1)`` retrying a timeout once (test_row_retries.py): "sleep:N" runs
    too long every time, "sleep_first:N" only the first time."""
    return _act(item, "timed")


#: test_released.py sets it: called inside ``context.released()`` with what it yielded.
RELEASED_PROBE = None


@worker(source=Item, eligible=Item.objects.filter(kind="compute"))
def compute(item, context):
    """A long computation outside the transaction (``context.released()``), then a write
    that commits with the status (test_released.py)."""
    read = item.action
    if read == "nested":  # refused: inside an atomic block of the handler's own
        with transaction.atomic(), context.released():
            pass
    with context.released() as free:
        if RELEASED_PROBE is not None:
            RELEASED_PROBE(free, context)
    Effect.objects.create(item_id=item.pk, worker="compute", note=f"{read} {free}")
    return Finished()


@worker(source=Awaiting, eligible=lambda: Awaiting.objects.filter(
    has_task_status("task_text", "SUCCESSFUL")).order_by("id"))
def after_task(row):
    """Runs on a row once the task whose id its ``task_text`` holds ended SUCCESSFUL
    (tests/test_workflow_rows.py)."""
    Effect.objects.create(item_id=row.pk, worker="after_task", pid=os.getpid())
    return Finished()
