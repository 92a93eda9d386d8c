"""``enqueue_many``'s shortcuts do what the slow way does: ``task_enqueued`` once per task
as ``Signal.send`` would send it, ids, argument normalisation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import nullcontext
from datetime import timedelta
from typing import Any

import pytest
from django.db import IntegrityError, transaction

from django_dbworker.backend import DBWorkerBackend, send_enqueued
from django_dbworker.djtasks import task_enqueued
from django_dbworker.exceptions import InvalidTaskArguments
from django_dbworker.models import TaskRecord
from django_dbworker.tasks import newtasks
from django_dbworker.tasks.results import new_results
from tests.conftest import sent_to_postgres
from tests.testapp import tasks
from tests.testapp.models import Item

type Dispatch = Callable[[type, list[Any]], None]


def send_each(sender: type, results: list[Any]) -> None:
    """The reference: what ``send_enqueued`` replaces."""
    for result in results:
        task_enqueued.send(sender, task_result=result)


def some_results(count: int) -> list[Any]:
    shared = newtasks.Shared.of(tasks.add)
    rows = newtasks.build(shared, newtasks.ids(shared, count),
                          [((i, i), {}) for i in range(count)])
    return new_results(rows, "default", tasks.add)


class Scenario:
    """Receivers that note each call; ``run`` dispatches five results and returns the notes
    (and the exception, if one stopped it), disconnecting everything afterwards."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, Any]] = []
        self.alive: list[Callable[..., None]] = []  # what keeps weak receivers alive
        self.connected: list[tuple[Callable[..., Any], Any]] = []
        self.results = some_results(5)
        self.index = {r.id: i for i, r in enumerate(self.results)}

    def receiver(self, name: str, then: Callable[[int], None] | None = None, *,
                 keep: bool = True) -> Callable[..., None]:
        def receive(signal: Any, sender: Any, task_result: Any, **kwargs: Any) -> None:
            assert signal is task_enqueued and not kwargs
            i = self.index[task_result.id]
            self.seen.append((name, i, sender))
            if then is not None:
                then(i)

        if keep:
            self.alive.append(receive)
        return receive

    def connect(self, receiver: Callable[..., Any], **options: Any) -> None:
        task_enqueued.connect(receiver, **options)
        self.connected.append((receiver, options.get("sender")))

    def run(self, dispatch: Dispatch) -> tuple[list[Any], str | None]:
        error = None
        try:
            dispatch(DBWorkerBackend, self.results)
        except RuntimeError as exc:
            error = str(exc)
        finally:
            for receiver, sender in self.connected:
                task_enqueued.disconnect(receiver, sender=sender)
        return self.seen, error


def plain_receivers(s: Scenario) -> None:
    s.connect(s.receiver("weak"))
    s.connect(s.receiver("strong"), weak=False)
    s.connect(s.receiver("ours"), sender=DBWorkerBackend)
    s.connect(s.receiver("other sender"), sender=object, weak=False)


def connects_one_midway(s: Scenario) -> None:
    late = s.receiver("late")
    s.connect(s.receiver("first", then=lambda i: i == 1 and s.connect(late)), weak=False)


def disconnects_one_midway(s: Scenario) -> None:
    victim = s.receiver("victim")
    s.connect(s.receiver("first", then=lambda i: i == 2 and task_enqueued.disconnect(victim)),
              weak=False)
    s.connect(victim, weak=False)


def lets_one_die_midway(s: Scenario) -> None:
    holder = [s.receiver("mortal", keep=False)]  # the weak receiver's only reference
    task_enqueued.connect(holder[0])
    s.connect(s.receiver("first", then=lambda i: i == 2 and holder.clear()), weak=False)


def raises_midway(s: Scenario) -> None:
    def fail(i: int) -> None:
        if i == 3:
            raise RuntimeError(f"receiver failed at {i}")

    s.connect(s.receiver("before"), weak=False)
    s.connect(s.receiver("failing", then=fail), weak=False)
    s.connect(s.receiver("after"), weak=False)


@pytest.mark.parametrize("setup", [plain_receivers, connects_one_midway,
                                   disconnects_one_midway, lets_one_die_midway,
                                   raises_midway])
def test_send_enqueued_calls_what_send_calls(setup: Callable[[Scenario], None]) -> None:
    observed = []
    for dispatch in (send_each, send_enqueued):
        scenario = Scenario()
        setup(scenario)
        seen, error = scenario.run(dispatch)
        observed.append(([(name, i, sender) for name, i, sender in seen], error))
    assert observed[0] == observed[1]
    assert observed[1][0], "receivers were called"
    if setup is raises_midway:
        assert observed[1][1] == "receiver failed at 3"
        assert observed[1][0][-2:] == [("before", 3, DBWorkerBackend),
                                       ("failing", 3, DBWorkerBackend)]


def test_send_enqueued_runs_async_receivers_too() -> None:
    seen = []

    async def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append((sender, task_result.id))

    results = some_results(3)
    task_enqueued.connect(receive)
    try:
        send_enqueued(DBWorkerBackend, results)
    finally:
        task_enqueued.disconnect(receive)
    assert seen == [(DBWorkerBackend, r.id) for r in results]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("on_commit", [False, True])
def test_enqueue_many_signals_each_task_once_in_order(on_commit: bool) -> None:
    seen = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        assert TaskRecord.objects.filter(pk=task_result.id).exists(), "stored first"
        seen.append((sender, task_result.id, task_result.args))

    task_enqueued.connect(receive)
    try:
        results = tasks.add.using(enqueue_on_commit=on_commit).enqueue_many(
            [((i, i), {}) for i in range(20)])
        keyed = tasks.add.using(idempotency_key="k", enqueue_on_commit=on_commit)
        first = keyed.enqueue(1, 1)
    finally:
        task_enqueued.disconnect(receive)
    assert seen == [(DBWorkerBackend, r.id, r.args) for r in [*results, first]]
    again = keyed.enqueue(2, 2)
    assert again.id == first.id
    assert TaskRecord.objects.count() == 21


def test_new_ids_of_any_count() -> None:
    shared = newtasks.Shared.of(tasks.add)
    assert newtasks.ids(shared, 0) == []
    for count in (1, 2, 37):
        ids = newtasks.ids(shared, count)
        assert len(set(ids)) == count
        assert all(str(uuid.UUID(i)) == i and uuid.UUID(i).version == 4 for i in ids)


def test_plain_copies_flat_containers() -> None:
    from django_dbworker.tasks.newtasks import plain

    for value, expected in (((1, "a", None, True, 1.5), [1, "a", None, True, 1.5]),
                            ([], []), ((), []), ({"a": 1, "b": None}, {"a": 1, "b": None}),
                            ({}, {}), ({"a": (1,)}, {"a": [1]}), ([(1,), {}], [[1], {}])):
        got = plain(value)
        assert got == expected and type(got) is type(expected)
        assert got is not value, "the caller's container is never stored as it is"


# ----- batches -------------------------------------------------------------------------------


@pytest.fixture
def small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches of 4 calls: 10 calls make three statements (4, 4, 2)."""
    monkeypatch.setattr(newtasks, "BATCH", 4)


@pytest.fixture
def signalled() -> Any:
    seen: list[str] = []

    def receive(sender: Any, task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result.id)

    task_enqueued.connect(receive)
    yield seen
    task_enqueued.disconnect(receive)


@pytest.mark.django_db(transaction=True)
def test_batches_keep_the_calls_order_ids_and_arguments(small_batches, signalled) -> None:
    results = tasks.add.enqueue_many([((i, i), {"n": i}) for i in range(10)])
    assert [(r.args, r.kwargs) for r in results] == [([i, i], {"n": i}) for i in range(10)]
    stored = {str(r.pk): (r.args, r.kwargs, r.status) for r in TaskRecord.objects.all()}
    assert stored == {r.id: (r.args, r.kwargs, "READY") for r in results}
    assert signalled == [r.id for r in results], "each task signalled once, in order"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outer", [False, True], ids=["alone", "in-a-transaction"])
@pytest.mark.parametrize(("bad", "message"), [
    (((float("nan"), 1), {}), r"call 9 cannot be stored as JSON \(Out of range float"),
    ((1, 2, 3), r"call 9 is \(1, 2, 3\); give \(args, kwargs\) pairs"),
    (((object(),), {}), r"call 9 cannot be stored as JSON"),
], ids=["nan", "not-a-pair", "object"])
def test_a_bad_call_in_a_later_batch_stores_no_batch(small_batches, signalled, outer, bad,
                                                    message) -> None:
    """Call 9 is in the third batch: the first two were already sent when it is found."""
    calls: list[Any] = [((i, i), {}) for i in range(10)]
    calls[9] = bad
    with transaction.atomic() if outer else nullcontext():
        Item.objects.create(action="before")
        with pytest.raises(InvalidTaskArguments, match=message):
            tasks.add.enqueue_many(calls)
        assert not TaskRecord.objects.exists(), "no batch half-written"
    assert signalled == []
    assert Item.objects.filter(action="before").exists(), "the caller's transaction goes on"
    assert len(tasks.add.enqueue_many(calls[:9])) == 9
    assert TaskRecord.objects.count() == 9


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outer", [False, True], ids=["alone", "in-a-transaction"])
def test_a_batch_the_database_refuses_rolls_back_the_others(
        small_batches, signalled, monkeypatch: pytest.MonkeyPatch, outer: bool) -> None:
    """The second batch repeats an id of the first: a primary key violation, which on
    PostgreSQL the server reports after later batches were sent (pipeline)."""
    real_ids = newtasks.ids

    def one_id_twice(shared: newtasks.Shared, count: int) -> list[str]:
        ids = real_ids(shared, count)
        ids[6] = ids[1]
        return ids

    monkeypatch.setattr(newtasks, "ids", one_id_twice)
    with transaction.atomic() if outer else nullcontext():
        Item.objects.create(action="before")
        with pytest.raises(IntegrityError):
            tasks.add.enqueue_many([((i, i), {}) for i in range(10)])
        assert not TaskRecord.objects.exists(), "no batch half-written"
    assert signalled == []
    assert Item.objects.filter(action="before").exists(), "the caller's transaction goes on"
    monkeypatch.setattr(newtasks, "ids", real_ids)
    assert len(tasks.add.enqueue_many([((i, i), {}) for i in range(10)])) == 10


@pytest.mark.django_db(transaction=True)
def test_batches_go_to_postgres_in_one_pipeline(small_batches, vendor, tmp_path) -> None:
    """The batches' INSERTs and the NOTIFY are sent without waiting for each other's
    results: one Sync for all of them (psycopg's pipeline), and, outside a transaction, no
    BEGIN or COMMIT: the server runs what comes before the Sync as one transaction. One
    round trip in all."""
    if vendor != "postgresql":
        pytest.skip("psycopg's pipeline mode")
    _, messages = sent_to_postgres(
        lambda: tasks.add.enqueue_many([((i, i), {}) for i in range(10)]), tmp_path)
    sent = [(m[0], m[1] if len(m) > 1 else "") for m in messages]
    kinds = [kind for kind, _ in sent]
    inserts = [i for i, (kind, text) in enumerate(sent)
               if kind == "Parse" and "INSERT INTO" in text]
    assert len(inserts) == 3, sent
    syncs = [i for i, kind in enumerate(kinds) if kind == "Sync"]
    assert len(syncs) == 1 and syncs[0] > inserts[-1], sent
    assert any("pg_notify" in text for _, text in sent[inserts[-1]:syncs[0]]), sent
    assert not [text for _, text in sent if "BEGIN" in text or "COMMIT" in text], sent
    assert TaskRecord.objects.count() == 10


@pytest.mark.django_db(transaction=True)
def test_rows_are_stored_as_the_orm_stores_them() -> None:
    """Every column of a row from ``enqueue_many`` is what ``Model.save()`` stores for the
    same call (``NewTask.record()``: the model's defaults for what enqueue does not set),
    for calls of different options one after the other: the statement is made once per
    database and must not carry one call's values into the next."""
    from dataclasses import fields

    columns = [f.attname for f in TaskRecord._meta.concrete_fields if f.name != "id"]
    calls = [((1, 2), {"k": [3]}), ((), {})]
    for task in (tasks.add, tasks.add.using(priority=7, run_after=timedelta(hours=1)),
                 tasks.add):
        for result in task.enqueue_many(calls):
            stored = TaskRecord.objects.get(pk=result.id)
            shared = newtasks.Shared(**{f.name: getattr(stored, f.name)
                                        for f in fields(newtasks.Shared)})
            twin = newtasks.NewTask(str(uuid.uuid4()), stored.args, stored.kwargs,
                                    shared).record()
            twin.save(force_insert=True)
            twin = TaskRecord.objects.get(pk=twin.pk)
            assert {c: getattr(stored, c) for c in columns} == \
                {c: getattr(twin, c) for c in columns}
            assert stored.priority == task.priority
            assert (stored.run_after is None) == (task.run_after is None)
