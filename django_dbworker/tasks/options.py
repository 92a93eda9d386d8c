"""The checks of a task's flow-control options, without a database: uniqueness
(``unique_key``, ``unique_while``, ``unique_for``, ``on_duplicate``) and concurrency
(``concurrency_limit``, ``concurrency_key``), for ``@task(...)``, ``.using()`` and
``@worker(...)``. The stores that act on them (``uniqueness``, ``concurrency``) import them
from here."""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .. import conf
from ..djtasks import InvalidTask
from ..exceptions import InvalidTaskArguments

if TYPE_CHECKING:
    from .task import DBWorkerTask

#: ``unique_while`` values (``uniqueness.HOLDING``: the statuses in which each holds a key).
UNIQUE_WHILE = ("active", "waiting")
ON_DUPLICATE = ("keep", "replace")
#: ``TaskRecord.unique_key``'s and ``ConcurrencySlot.key``'s max_length.
MAX_KEY_LENGTH = 255
#: A concurrency limit is at most this (``TaskRecord.concurrency_limit`` is a database
#: integer).
MAX_LIMIT = 1_000_000


# ----- uniqueness ---------------------------------------------------------------------------


def validate_uniqueness(where: str, task: DBWorkerTask) -> None:
    """``InvalidTask`` naming the value and the fix, for ``@task(...)`` and ``.using()``
    of a task with a uniqueness option set (``task.unique_wanted``)."""
    key = task.unique_key
    if key is not None and not callable(key):
        check_unique_key(where, key)
    if not isinstance(task.unique_while, str) or task.unique_while not in UNIQUE_WHILE:
        raise InvalidTask(
            f"{where}: unique_while={task.unique_while!r} must be 'active' (a READY, "
            "RETRYING or RUNNING task holds the key) or 'waiting' (only a READY or RETRYING "
            "one: a running task does not block a new enqueue).")
    if not isinstance(task.on_duplicate, str) or task.on_duplicate not in ON_DUPLICATE:
        raise InvalidTask(
            f"{where}: on_duplicate={task.on_duplicate!r} must be 'keep' (return the task "
            "holding the key as it is) or 'replace' (give it this call's arguments and "
            "run_after while it waits).")
    if task.unique_for is not None:
        period_seconds(where, task.unique_for)
        if task.unique_while != "active":
            raise InvalidTask(
                f"{where}: unique_while={task.unique_while!r} does not apply with "
                f"unique_for={task.unique_for!r}: a period's key is held for the whole "
                "period whatever the task's status. Remove one of the two.")
    if task.enqueue_on_commit is True:
        raise on_commit_error(where)


def check_unique_key(where: str, key: Any, *, source: str = "") -> str:
    if (not isinstance(key, str) or not key or len(key) > MAX_KEY_LENGTH
            or "\x00" in key):
        raise InvalidTask(
            f"{where}: unique_key{source}={key!r} must be a non-empty string of at most "
            f"{MAX_KEY_LENGTH} characters without NUL, or a function of the call's "
            "arguments that returns one, e.g. unique_key=lambda user_id: f'user:{user_id}'.")
    return key


def period_seconds(where: str, value: Any) -> float:
    """``unique_for`` in seconds, or ``InvalidTask``: a number or timedelta > 0, at most
    ten years."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if (isinstance(seconds, bool) or not isinstance(seconds, int | float)
            or not math.isfinite(seconds) or seconds <= 0):
        raise InvalidTask(
            f"{where}: unique_for={value!r} must be a duration: a number of seconds greater "
            "than 0 or a timedelta, e.g. unique_for=timedelta(hours=1).")
    if seconds > conf.MAX_DELAY:
        raise InvalidTask(f"{where}: unique_for={value!r} is more than ten years; give a "
                          "shorter period.")
    return float(seconds)


def on_commit_error(where: str) -> InvalidTask:
    return InvalidTask(
        f"{where}: unique_key cannot be used with enqueue_on_commit=True: which task holds "
        "the key is only known when the enqueue runs, and the result must name it. Enqueue "
        "in your transaction instead (.using(enqueue_on_commit=False)): the task and its key "
        "commit with your rows, or not at all.")


# ----- concurrency --------------------------------------------------------------------------


def bad_limit(limit: Any) -> bool:
    """Whether a ``concurrency_limit`` (of ``@task`` or ``@worker``) is not a whole number
    from 1 to ``MAX_LIMIT`` (None, no limit, is not bad)."""
    return limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or not 1 <= limit <= MAX_LIMIT)


def check_concurrency(where: str, limit: Any, key: Any) -> None:
    """``InvalidTask`` naming the value and the fix, for a bad ``concurrency_limit`` or
    ``concurrency_key`` (declared with ``@task`` or given to ``.using()``)."""
    if bad_limit(limit):
        raise InvalidTask(
            f"{where}: concurrency_limit={limit!r} must be a whole number from 1 to "
            f"{MAX_LIMIT:,} (how many tasks with one concurrency key may run at once); to "
            "stop these tasks for a while, pause their queue instead.")
    if key is None:
        return
    if limit is None:
        raise InvalidTask(
            f"{where}: concurrency_key={key!r} was given without concurrency_limit; give "
            "both, e.g. @task(concurrency_limit=2, concurrency_key=...).")
    if not callable(key):
        check_concurrency_key(where, key, "concurrency_key")


def bad_key(key: Any) -> bool:
    """Not a non-empty string of at most ``MAX_KEY_LENGTH`` characters without NUL (which
    PostgreSQL cannot store)."""
    return not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH or "\x00" in key


def check_concurrency_key(where: str, key: Any, what: str) -> None:
    if bad_key(key):
        raise InvalidTask(
            f"{where}: {what}={key!r} must be a non-empty string of at most "
            f"{MAX_KEY_LENGTH} characters without NUL (or, in @task, a function of the "
            "call's arguments returning one), e.g. f'account-{account_id}'.")


def concurrency_keys(task: Any, calls: Sequence[tuple[Any, Any]]) -> list[str]:
    """The concurrency key of each call of a task with ``concurrency_limit``: its
    ``concurrency_key`` (a string, or a function called with the call's arguments), else
    the task's path. Raises ``InvalidTaskArguments`` naming the call whose function fails
    or returns anything but a non-empty string of at most 255 characters."""
    key = task.concurrency_key
    if key is None:
        return [task.module_path] * len(calls)
    if not callable(key):
        return [key] * len(calls)
    found = []
    for index, (args, kwargs) in enumerate(calls):
        try:
            value = key(*args, **kwargs)
        except Exception as exc:
            raise InvalidTaskArguments(
                f"Task {task.name!r}: its concurrency_key function raised "
                f"{type(exc).__name__}: {exc} for call {index} (args={args!r}, "
                f"kwargs={kwargs!r}); make it accept every call of the task. Nothing was "
                "enqueued.") from exc
        if bad_key(value):
            raise InvalidTaskArguments(
                f"Task {task.name!r}: its concurrency_key function returned {value!r} for "
                f"call {index}; it must return a non-empty string of at most "
                f"{MAX_KEY_LENGTH} characters without NUL, e.g. f'account-{{account_id}}'. "
                "Nothing was enqueued.")
        found.append(value)
    return found
