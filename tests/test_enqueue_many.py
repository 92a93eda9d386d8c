"""``enqueue_many``'s shortcuts do what the slow way does: ``task_enqueued`` once per task
as ``Signal.send`` would send it, ids, argument normalisation."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.tasks.signals import task_enqueued

from django_dbworker.backend import DBWorkerBackend, send_enqueued
from django_dbworker.claims import newtasks
from django_dbworker.models import TaskRecord
from django_dbworker.results import new_results
from tests.testapp import tasks

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
    from django_dbworker.claims.newtasks import plain

    for value, expected in (((1, "a", None, True, 1.5), [1, "a", None, True, 1.5]),
                            ([], []), ((), []), ({"a": 1, "b": None}, {"a": 1, "b": None}),
                            ({}, {}), ({"a": (1,)}, {"a": [1]}), ([(1,), {}], [[1], {}])):
        got = plain(value)
        assert got == expected and type(got) is type(expected)
        assert got is not value, "the caller's container is never stored as it is"
