"""Units sent to children in batches (``supervisor/handoff.py``) and successful tasks
recorded together (``completions.py``, ``taskstore.succeed_many``)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time

import pytest
from django.db import DatabaseError, transaction

import django_dbworker
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.supervisor.handoff import Handoff
from django_dbworker.supervisor.prefetch import Prefetch
from django_dbworker.tasks import completions
from django_dbworker.tasks import planner as taskplanner
from django_dbworker.tasks import store as taskstore
from django_dbworker.tasks.completions import Completions, Kept
from django_dbworker.units.claimant import Claimant
from tests.conftest import wait_for
from tests.testapp import tasks
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_unit_taken_back_never_starts_and_one_started_is_not_taken_back():
    handoff = Handoff(multiprocessing.get_context("fork"))
    assert handoff.running() is None and handoff.started() == -1
    assert handoff.start(0)
    seq, since = handoff.running()
    assert seq == 0 and since <= time.monotonic()
    # Units 1-3 were sent; the supervisor takes back what has not started.
    assert handoff.take_back(4) == 0, "unit 0 runs: 1, 2 and 3 are taken back"
    handoff.finish(0)
    assert handoff.running() is None
    assert not any(handoff.start(seq) for seq in (1, 2, 3)), "taken back: never started"
    assert handoff.start(4), "units sent after the take-back run"
    assert handoff.running()[0] == 4


def test_a_child_and_its_supervisor_never_both_have_a_unit():
    """Two processes race for 2,000 units: the child starts each unit once it was sent,
    the parent sends 5 at a time and every 20 takes back whatever has not started: every
    unit ends on exactly one side. Whatever the machine's load, both sides get some: the
    first take-back waits until the child started a unit, and the child holds before the
    last ten until the parent's last take-back is through."""
    context = multiprocessing.get_context("fork")
    handoff = Handoff(context)
    started = context.Array("b", 2000)
    sent = context.Value("i", 0)
    hold = context.Event()  # set: the child may go on past HOLD
    HOLD = 1990

    def child() -> None:
        for seq in range(2000):
            while sent.value <= seq:
                pass
            if seq == HOLD:
                hold.wait(60)
            if handoff.start(seq):
                started[seq] = 1
                handoff.finish(seq)

    process = context.Process(target=child)
    process.start()
    taken_back: set[int] = set()
    for upto in range(5, 2001, 5):
        sent.value = upto
        deadline = time.monotonic() + 0.01
        while handoff.started() < upto - 3 and time.monotonic() < deadline:
            pass  # let the child get close to the end of what it has
        if upto == 20:
            patience = time.monotonic() + 60
            while handoff.started() < 1 and time.monotonic() < patience:
                time.sleep(0.001)  # the child's first start, however loaded the machine
        if upto % 20 == 0:
            last = handoff.take_back(upto)
            taken_back |= set(range(last + 1, upto))
    hold.set()
    process.join(60)
    ran = {seq for seq in range(2000) if started[seq]}
    assert not ran & taken_back
    assert ran | taken_back == set(range(2000))
    assert ran and set(range(HOLD, 2000)) <= taken_back, "both sides got some"


def test_depth_follows_the_run_time_of_recent_units():
    p = Prefetch(per_child=4, concurrency=2, lease=30)
    assert p.depth() == 1, "nothing is known yet: one unit at a time"
    p.ran(0.001)
    assert p.depth() == 5, "short units: the running one and PREFETCH more"
    p.average = 0.02
    assert p.depth() == 1 + 2, "as many as run in about WAIT (50 ms)"
    p.average = 1.0
    assert p.depth() == 1
    assert Prefetch(per_child=0, concurrency=2, lease=30).depth() == 1
    assert p.patience() == 1.0, "at most HOLD"
    p.average = 0.0001
    assert p.patience() == pytest.approx(0.01), "at least 10 ms"


def test_a_slow_claim_tops_children_up_sooner_and_keeps_more_waiting():
    """A database far away: a claim takes as long as a child runs many units, and the
    supervisor feeds nobody meanwhile; so a child is topped up that many units sooner and
    as many more per child wait in the supervisor, beyond PREFETCH, up to 4x PREFETCH."""
    p = Prefetch(per_child=32, concurrency=2, lease=30)
    p.claimed(0.006)
    assert p.cover() == 0, "nothing known about the units yet"
    p.ran(0.0002)
    assert p.cover() == 30, "6 ms of claim at 0.2 ms per unit"
    assert p.ahead() == 2 * 32 + 2 * 30, "PREFETCH per child, and a claim's worth each"
    p.claimed(0.006)
    assert p.claim_time == pytest.approx(0.006)
    for _ in range(100):
        p.claimed(0.5)  # the claims got slow: smoothed towards half a second
    assert p.cover() == 4 * 32, "at most four times PREFETCH per child"
    p.average = 0.04
    assert p.cover() == 12 and p.ahead() == 2 + 2 * 12, "longer units: fewer of them"
    p.average = 10.0
    assert p.cover() == 0 and p.ahead() == 0, "slow units: nothing waits"
    p.average = 0.0002
    assert p.cover() == 4 * 32
    p.limited = True  # per-key limits: units claimed ahead hold their keys' places
    assert p.cover() == 0 and p.ahead() == 2 * 32, "no more than PREFETCH per child"
    none = Prefetch(per_child=0, concurrency=2, lease=30)
    none.ran(0.0002)
    none.claimed(0.5)
    assert none.cover() == 0 and none.ahead() == 0, "PREFETCH = 0: one unit at a time"


def claimed(n: int) -> list[taskstore.TaskClaim]:
    tasks.add.enqueue_many([((i, i), {}) for i in range(n)])
    return taskplanner.claim(None, n, Claimant(), 30)


def test_succeed_many_records_each_live_claim_and_only_those():
    one, two, three, four = claimed(4)
    TaskRecord.objects.filter(pk=two.task_id).update(token=None)  # taken over meanwhile
    django_dbworker.cancel(three.task_id)  # cancelling a running task: still RUNNING
    recorded = taskstore.succeed_many([
        (one, {"nested": [1, "é\t\\"]}, one.claimed_at),
        (two, 2, two.claimed_at),
        (three, None, three.claimed_at),
        (four, None, four.claimed_at),
    ])
    assert recorded == {one.task_id, three.task_id, four.task_id}
    rows = {r.pk: r for r in TaskRecord.objects.all()}
    assert rows[one.task_id].return_value == {"nested": [1, "é\t\\"]}
    assert rows[one.task_id].finished_at == one.claimed_at
    assert rows[one.task_id].token is None and rows[one.task_id].lease_expires_at is None
    assert rows[two.task_id].status == TaskStatus.RUNNING, "fenced: left alone"
    assert rows[four.task_id].status == TaskStatus.SUCCESSFUL
    assert rows[four.task_id].return_value is None
    assert taskstore.succeed_many([(one, 1, one.claimed_at)]) == set(), "only once"
    assert taskstore.succeed_many([]) == set()


def test_completions_record_together_and_report_in_order():
    claims = claimed(3)
    after: list[tuple[int, bool]] = []
    kept = Completions("default")
    TaskRecord.objects.filter(pk=claims[1].task_id).update(token=None)
    for i, c in enumerate(claims):
        kept.add(Kept(c, i * 10, c.claimed_at, lambda ok, i=i: after.append((i, ok)), tag=i))
    assert len(kept) == 3
    done = kept.flush()
    assert [(k.tag, ok) for k, ok in done] == [(0, True), (1, False), (2, True)]
    assert list(TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL)
                .order_by("return_value").values_list("return_value", flat=True)) == [0, 20]
    assert after == [], "what follows a record is the caller's to run"
    assert kept.flush() == []
    kept.close()


def test_a_long_task_does_not_hold_back_the_records_of_those_before_it():
    claims = claimed(2)
    kept = Completions("default")
    try:
        for c in claims:
            kept.add(Kept(c, "done", c.claimed_at, lambda ok: ok))
        kept.started()  # the next task starts and runs long
        wait_for(lambda: TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count() == 2,
                 timeout=60, what="the thread to record the tasks kept")
        kept.finished()
        assert [ok for _, ok in kept.flush()] == [True, True], "reported once, as recorded"
    finally:
        kept.close()
    assert not any(t.name == "dbworker-completions" for t in threading.enumerate())


def test_short_tasks_are_recorded_after_the_task_that_follows_them():
    (c,) = claimed(1)
    kept = Completions("default")
    kept.add(Kept(c, 1, c.claimed_at, lambda ok: ok))
    kept.started()
    kept.finished()  # the next task took less than PATIENCE
    time.sleep(completions.PATIENCE * 4)
    assert TaskRecord.objects.get(pk=c.task_id).status == TaskStatus.RUNNING, "kept"
    assert [ok for _, ok in kept.flush()] == [True]
    kept.close()


def test_a_batch_is_recorded_behind_and_collected_without_waiting():
    """``record_behind``: the thread records what is kept at once (the child meanwhile
    runs its next batch); ``fileno()`` turns readable, ``recorded()`` gives the outcomes
    once, in order, and a unit taken over meanwhile comes back False."""
    import select

    claims = claimed(3)
    TaskRecord.objects.filter(pk=claims[2].task_id).update(token=None)  # taken over
    kept = Completions("default")
    try:
        assert kept.record_behind() is False, "nothing kept: nothing to record"
        for i, c in enumerate(claims):
            kept.add(Kept(c, i, c.claimed_at, lambda ok: ok, tag=i))
        assert kept.record_behind() is True
        assert select.select([kept.fileno()], [], [], 10)[0], "the thread says it recorded"
        wait_for(lambda: not kept.behind, timeout=60, what="the record to end")
        done = kept.recorded()
        assert [(k.tag, ok) for k, ok in done] == [(0, True), (1, True), (2, False)]
        assert kept.recorded() == [] and kept.flush() == [], "each outcome once"
        assert TaskRecord.objects.filter(status=TaskStatus.SUCCESSFUL).count() == 2
    finally:
        kept.close()


def test_a_record_behind_that_fails_is_left_to_the_main_threads_flush():
    """The thread's record fails (the database refuses it): the kept tasks go back, the
    child is woken, ``record_behind`` declines, and ``flush`` records them (or contains
    the error) on the main thread."""
    import select

    (c,) = claimed(1)
    kept = Completions("default")
    real = taskstore.succeed_many
    calls = []

    def failing_once(done):
        calls.append(len(done))
        if len(calls) == 1:
            raise DatabaseError("refused on purpose")
        return real(done)

    try:
        kept.add(Kept(c, 7, c.claimed_at, lambda ok: ok))
        taskstore.succeed_many = failing_once
        assert kept.record_behind() is True
        assert select.select([kept.fileno()], [], [], 10)[0]
        wait_for(lambda: kept.failed_behind, timeout=60, what="the thread to give up")
        assert kept.recorded() == [] and len(kept) == 1, "kept again, not lost"
        assert kept.record_behind() is False, "the main thread records from now on"
        assert [ok for _, ok in kept.flush()] == [True]
        assert not kept.failed_behind
        assert TaskRecord.objects.get(pk=c.task_id).return_value == 7
    finally:
        taskstore.succeed_many = real
        kept.close()


@pytest.mark.processes
def test_records_behind_lose_and_repeat_nothing_in_a_long_drain(runworkers):
    """3,000 quick tasks through two children: each batch's successes recorded behind
    while the next batch runs (``("ran", seq)`` tops the child up meanwhile): every task
    SUCCESSFUL once, in one attempt, and the supervisor counts each once."""
    results = tasks.add.enqueue_many([((n, 1), {}) for n in range(3000)])
    p = runworkers("--burst", "--concurrency", "2", "--queue", "default")
    assert p.wait(240) == 0, p.output()[-3000:]
    rows = TaskRecord.objects.filter(pk__in=[r.id for r in results])
    assert rows.filter(status=TaskStatus.SUCCESSFUL, attempts=1).count() == 3000
    assert sorted(rows.values_list("return_value", flat=True)) == list(range(1, 3001))
    assert "3000 units: successful 3000" in p.output(), p.output()[-2000:]


@pytest.mark.processes
def test_cancelling_a_task_does_not_run_again_the_tasks_before_it(runworkers, tmp_path):
    """Quick tasks sent in one batch with a task that then runs until it is cancelled:
    its child is killed, and the quick ones it ran before are recorded once, never run
    again."""
    tasks.chaos_effect.enqueue_many([((n,), {}) for n in range(40)])  # short: batches
    p = runworkers("--concurrency", "1", "--queue", "default", "--verbosity", "2")
    wait_for(lambda: Effect.objects.filter(worker="chaos_task").count() == 40,
             what="the warm-up tasks")
    with transaction.atomic():  # seen at once: claimed and sent together
        quick = tasks.chaos_effect.enqueue_many([((n,), {}) for n in range(100, 103)])
        stuck = tasks.wait_file.enqueue(1, str(tmp_path / "never"))
        after = tasks.chaos_effect.enqueue_many([((n,), {}) for n in range(200, 203)])
    wait_for(lambda: Effect.objects.filter(worker="wait_file").exists(),
             what="the task that waits to start")
    assert django_dbworker.cancel(stuck.id)
    wait_for(lambda: TaskRecord.objects.get(pk=stuck.id).status == TaskStatus.CANCELLED,
             timeout=10, what="the cancel")
    ids = [r.id for r in [*quick, *after]]
    wait_for(lambda: TaskRecord.objects.filter(pk__in=ids, status=TaskStatus.SUCCESSFUL)
             .count() == 6, timeout=30, what="the quick tasks")
    p.signal(signal.SIGTERM)
    assert p.wait(30) == 0, p.output()
    runs = {n: Effect.objects.filter(worker="chaos_task", item_id=n).count()
            for n in [100, 101, 102, 200, 201, 202]}
    assert runs == dict.fromkeys(runs, 1), runs
    assert set(TaskRecord.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {1}


def test_a_cancel_stops_the_task_asked_for_not_the_one_its_child_ran_next():
    """Between the look at what runs and the cancel, the child finished the cancelled
    task and started the next one: nothing is stopped."""
    from django_dbworker import conf
    from django_dbworker.supervisor.taskwork import TaskWork

    first, second = claimed(2)
    assert django_dbworker.cancel(first.task_id)

    class Child:
        pid = 1
        seen = iter([(first, time.monotonic()), (second, time.monotonic())])

        def running(self):
            return next(self.seen, (second, time.monotonic()))

        def running_all(self):
            return [self.running()]

        def waiting(self):
            return []

    stopped = []
    work = TaskWork(None, conf.get(), Claimant(), schedule=False)
    work.maintain([Child()], lambda ch, c: stopped.append(c) or True,
                  Prefetch(per_child=4, concurrency=1, lease=30))
    assert stopped == []
    assert TaskRecord.objects.get(pk=second.task_id).status == TaskStatus.RUNNING


def test_a_child_killed_while_it_holds_the_lock_does_not_hang_its_supervisor():
    context = multiprocessing.get_context("fork")
    handoff = Handoff(context)
    assert handoff.start(0)
    handoff.finish(0)

    def die_holding_the_lock() -> None:
        handoff._lock.acquire()
        os.kill(os.getpid(), signal.SIGKILL)

    process = context.Process(target=die_holding_the_lock)
    process.start()
    process.join(10)
    answers: list[object] = []

    def read() -> None:  # each read waits LOCK_WAIT at most: a dead holder hangs none
        answers.extend([handoff.started(), handoff.running(), handoff.take_back(5)])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(120)
    assert not reader.is_alive(), "a read waited for the lock the dead child held"
    assert answers == [0, None, 0]


@pytest.mark.django_db
def test_a_supervisor_that_knows_limited_work_keeps_no_claims_ahead_for_slow_claims(
        monkeypatch):
    """Units claimed ahead hold their key's places (they count as running): a supervisor
    that knows a worker with ``concurrency_limit`` or a keyed task takes no cover
    (``Prefetch.limited``); a keyed drain fell from 90% to 35% of a plain one without."""
    import copy
    from types import SimpleNamespace

    from django_dbworker import conf
    from django_dbworker.rows.registry import workers
    from django_dbworker.supervisor.supervisor import Options, Supervisor
    from django_dbworker.tasks import registry as task_registry

    def limited(**options: object) -> bool:
        supervisor = Supervisor(Options(concurrency=2, **options), conf.get(), None)  # type: ignore[arg-type]
        supervisor._wake_r.close()
        supervisor._wake_w.close()
        return supervisor.prefetch.limited

    touch = workers["touch"]
    capped = copy.copy(touch)
    capped.concurrency_limit = 2
    assert not limited(workers=[touch])
    assert limited(workers=[touch, capped])
    plain = {path: t for path, t in task_registry.known().items() if not t.concurrency_limit}
    monkeypatch.setattr(task_registry, "known", lambda: plain)
    assert not limited(workers=[touch], tasks=True)
    keyed = SimpleNamespace(concurrency_limit=1, rate_limit=None, timeout_seconds=None)
    monkeypatch.setattr(task_registry, "known", lambda: {**plain, "tests.keyed": keyed})
    assert limited(workers=[touch], tasks=True)
