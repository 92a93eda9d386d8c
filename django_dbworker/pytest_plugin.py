"""pytest fixtures for projects that use django-dbworker (with pytest-django).

Installed with the package as a pytest plugin (entry point ``django_dbworker``); its
fixtures do nothing until a test asks for them by name:

- ``dbworker_run``: ``run_until_idle`` (``dbworker_run()``, ``dbworker_run(["worker"])``,
  ``dbworker_run(tasks=True)``), with database access;
- ``enqueued``: an ``Enqueued`` recording every task enqueued during the test
  (``enqueued.assert_enqueued(send_email, "a@b.c")``, ``.of(task)``, ``.calls(task)``);
- ``dbworker_clock``: a ``Clock`` frozen at the test's start (``dbworker_clock.advance(3600)``),
  which run_after, retry delays, ``Unfinished(delay=...)`` and cron follow (needs
  time-machine: ``pip install "django-dbworker[testing]"``);
- ``dbworker_schedules``: ``Schedules`` (``.tick()`` enqueues the cron ticks due since the
  last one), best with ``dbworker_clock``.

See docs/testing.md. Nothing here is imported until a fixture is used, so the plugin costs
a project that does not use it nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from .testing import Clock, Enqueued, Schedules


@pytest.fixture
def dbworker_run(db: None) -> Callable[..., Any]:
    """``run_until_idle`` with database access (pytest-django's ``db``)."""
    from .testing import run_until_idle

    return run_until_idle


@pytest.fixture
def enqueued() -> Iterator[Enqueued]:
    """An ``Enqueued`` recording every task enqueued during the test."""
    from .testing import record

    with record() as recorded:
        yield recorded


@pytest.fixture
def dbworker_clock() -> Iterator[Clock]:
    """A ``Clock`` frozen at the test's start; ``advance()`` moves it (time-machine)."""
    from .testing import frozen_time

    try:
        with frozen_time() as clock:
            yield clock
    except ImportError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def dbworker_schedules(db: None) -> Schedules:
    """``Schedules``: ``tick()`` enqueues the cron ticks due since the last call."""
    from .testing import Schedules

    return Schedules()
