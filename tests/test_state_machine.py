"""The state machine is written down once, as data (``TRANSITIONS``: guards and targets), and
the tables in the stores' docstrings (copied into docs/state-machine.md) say the same."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from django_dbworker.models import State, TaskStatus, Transition
from django_dbworker.rows import store
from django_dbworker.tasks import store as taskstore

DOCS = Path(__file__).resolve().parent.parent / "docs" / "state-machine.md"
CREATED = {"(none)", "(enqueue)"}


def documented(text: str) -> set[tuple[str, str]]:
    """The (from, to) pairs of a table written ``FROM -> TO  what``."""
    pairs = set()
    for line in text.splitlines():
        words = line.split()
        if len(words) >= 3 and words[1] == "->" and words[0] not in CREATED:
            pairs.add((words[0], words[2]))
    return pairs


def as_data(transitions: dict[str, Transition]) -> set[tuple[str, str]]:
    return {(str(source), str(target) if target else "(deleted)")
            for t in transitions.values() for source in t for target in (t.to or {None})}


@pytest.mark.parametrize("module", [store, taskstore], ids=["executions", "tasks"])
def test_the_table_and_the_data_say_the_same(module):
    assert documented(module.__doc__) == as_data(module.TRANSITIONS)


@pytest.mark.parametrize("module", [store, taskstore], ids=["executions", "tasks"])
def test_the_docs_copy_the_table(module):
    text = DOCS.read_text()
    assert documented(module.__doc__) <= documented(text)


def test_every_state_is_reached_and_left_as_the_table_says():
    reached = {t for tr in store.TRANSITIONS.values() for t in tr.to}
    assert reached == set(State)
    task_reached = {t for tr in taskstore.TRANSITIONS.values() for t in tr.to}
    assert task_reached == set(TaskStatus)


def test_a_transition_is_its_guard():
    claim = store.TRANSITIONS["claim"]
    assert claim == frozenset({State.PENDING, State.UNFINISHED})
    assert claim.to == frozenset({State.WORKING})
    assert taskstore.TRANSITIONS["purge"].to == frozenset()
    assert "WORKING" in repr(claim)
    with pytest.raises(TypeError):
        Transition({State.FAILED})  # type: ignore[call-arg]  - the targets are required
    assert pickle.loads(pickle.dumps(frozenset(claim))) == claim
