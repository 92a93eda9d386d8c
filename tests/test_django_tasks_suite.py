"""Django's own ``tests/tasks/`` suite, run against ``DBWorkerBackend`` (issue 38).

Django's tests are not copied into this repository: at collection, the sdist of the
installed Django is fetched with ``pip download`` into a cache directory
(``$DBWORKER_DJANGO_TESTS_CACHE``, default ``~/.cache/django-dbworker/django-tests``), its
``tests/tasks/`` is extracted beside it and imported as the package ``tasks``, as Django's
``runtests.py`` imports it (``test_module_path`` expects ``tasks.tasks.noop_task``). Without
network and without a cache the module is skipped with a banner; under ``CI=true`` that is
a failure.

The backend is swapped in where Django's tests name one (their class decorators and their
``with override_settings(...)`` blocks; ``_swap``): Django's ``ImmediateBackend`` becomes
``DBWorkerBackend`` with ``OPTIONS={"IMMEDIATE": True}`` (each enqueue runs its task in the
caller), Django's ``DummyBackend`` becomes ``DBWorkerBackend`` without it (tasks stay
READY in our table), with ``results`` and ``clear()``, DummyBackend's two test helpers, read
from and done to our table (``StoredBackend``). The custom backends of
``test_custom_backend.py`` stay as they are: those tests check that our ``@task`` tasks
work with a backend of someone else's. Django's ``SimpleTestCase`` classes become
``TestCase`` ones (our backend stores every task), and ``available_apps = []`` becomes
every app (ours holds the table).

``NOT_APPLICABLE`` lists each test that cannot pass against our backend, with its reason:
each asserts a property of Django's reference backends that ours does not have by design.
Everything else passes on SQLite, PostgreSQL and MariaDB.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import tarfile
import tempfile
import unittest
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import django
import django.test
import pytest
from django.test import TestCase, TransactionTestCase

from django_dbworker.backend import DBWorkerBackend
from django_dbworker.models import TaskRecord
from django_dbworker.tasks import registry as task_registry

if django.VERSION < (6, 0):
    pytest.skip("Django's tests/tasks/ exists from Django 6.0 on (5.2 uses the backport)",
                allow_module_level=True)

VERSION = django.get_version()
CACHE = Path(os.environ.get("DBWORKER_DJANGO_TESTS_CACHE")
             or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
             / "django-dbworker" / "django-tests")
IMMEDIATE = "django.tasks.backends.immediate.ImmediateBackend"
DUMMY = "django.tasks.backends.dummy.DummyBackend"
#: The Django whose tests NOT_APPLICABLE was written against (its names are checked there).
LISTED_FOR = (6, 1)

_ISINSTANCE = "asserts that the backend is an instance of Django's {0}"
_SYNC_IN_ASYNC = ("calls {0} synchronously inside an async test: DummyBackend answers from "
                  "memory, ours reads its table, and Django refuses a query from an event "
                  "loop (SynchronousOnlyOperation)")
_MUTATES = ("changes DummyBackend's in-memory result behind its back and expects refresh() "
            "to see it; our results are rows: a changed copy changes no row")
_STORES = ("asserts that ImmediateBackend cannot {0}; ours can (supports_{1} is True): our "
           "own tests cover it")

#: Django's tests that cannot apply to our backend, "module.Class.test": reason. Each
#: asserts a property of Django's reference backends that ours does not have by design.
NOT_APPLICABLE: dict[str, str] = {
    "test_tasks.TaskTestCase.test_using_correct_backend": _ISINSTANCE.format("DummyBackend"),
    "test_tasks.TaskTestCase.test_get_backend":
        _ISINSTANCE.format("DummyBackend and ImmediateBackend"),
    "test_immediate_backend.ImmediateBackendTestCase.test_using_correct_backend":
        _ISINSTANCE.format("ImmediateBackend") + " with empty OPTIONS (ours has IMMEDIATE)",
    "test_dummy_backend.DummyBackendTestCase.test_using_correct_backend":
        _ISINSTANCE.format("DummyBackend"),
    "test_tasks.TaskTestCase.test_enqueue_task_async":
        _SYNC_IN_ASYNC.format("backend.results (DummyBackend's helper)"),
    "test_dummy_backend.DummyBackendTestCase.test_enqueue_task_async":
        _SYNC_IN_ASYNC.format("backend.results (DummyBackend's helper)"),
    "test_tasks.TaskTestCase.test_refresh_result":
        _SYNC_IN_ASYNC.format("result.refresh()"),
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result": _MUTATES,
    "test_dummy_backend.DummyBackendTestCase.test_refresh_result_async": _MUTATES,
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_get_result":
        _STORES.format("return a result by id", "get_result"),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_refresh_result":
        _STORES.format("refresh a result", "get_result"),
    "test_immediate_backend.ImmediateBackendTestCase.test_cannot_pass_run_after":
        _STORES.format("take run_after", "defer"),
}


# ----- fetching Django's tests -------------------------------------------------------------

def _fetch(version: str) -> Path:
    """The folder holding Django ``version``'s ``tasks`` test package (from the cache, or
    fetched with pip into it); raises ``RuntimeError`` saying why it could not."""
    home = CACHE / f"django-{version}"
    if (home / "tasks" / "tasks.py").exists():
        return home
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                   ":all:", "--disable-pip-version-check", "--dest", tmp,
                   f"django=={version}"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{' '.join(command)} took more than 300 s") from exc
        sdists = list(Path(tmp).glob("*.tar.gz"))
        if done.returncode or not sdists:
            raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        staged = Path(tmp) / "staged"
        prefix = f"{sdists[0].name.removesuffix('.tar.gz')}/tests/tasks/"
        with tarfile.open(sdists[0]) as sdist:
            for member in sdist.getmembers():
                if member.name.startswith(prefix) and member.isfile():
                    member.name = "tasks/" + member.name.removeprefix(prefix)
                    sdist.extract(member, staged, filter="data")
        if not (staged / "tasks" / "tasks.py").exists():
            raise RuntimeError(f"{sdists[0].name} has no {prefix}tasks.py")
        try:  # another pytest worker may have put it there meanwhile: keep theirs
            staged.rename(home)
        except OSError:
            if not (home / "tasks" / "tasks.py").exists():
                raise
    return home


def _django_tests() -> Path:
    try:
        return _fetch(VERSION)
    except (RuntimeError, OSError) as exc:
        line = "!" * 78
        message = (f"\n{line}\nDjango {VERSION}'s tests/tasks/ could not be fetched, so "
                   f"Django's own task suite does NOT run against DBWorkerBackend:\n{exc}\n"
                   f"(cache: {CACHE}; set DBWORKER_DJANGO_TESTS_CACHE to use another)\n{line}")
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(message + "\nUnder CI this is a failure.", pytrace=False)
        print(message, file=sys.stderr)
        pytest.skip(message, allow_module_level=True)


# ----- swapping our backend in -------------------------------------------------------------

class StoredBackend(DBWorkerBackend):
    """``DBWorkerBackend`` where Django's tests use ``DummyBackend``: tasks are stored and
    stay READY; ``results`` and ``clear()``, DummyBackend's test helpers, read and empty
    our table."""

    @property
    def results(self) -> list[Any]:
        return [self.result(row) for row in TaskRecord.objects.order_by("pk")]

    def clear(self) -> None:
        TaskRecord.objects.all().delete()


STORED = f"{StoredBackend.__module__}.{StoredBackend.__qualname__}"


def _swap(tasks: Any) -> Any:
    """Django's ``TASKS`` setting with our backend where it names one of Django's."""
    if not isinstance(tasks, dict):
        return tasks
    swapped = {}
    for alias, params in tasks.items():
        params = dict(params)
        if params.get("BACKEND") == IMMEDIATE:
            params["BACKEND"] = "django_dbworker.backend.DBWorkerBackend"
            params["OPTIONS"] = {**params.get("OPTIONS", {}), "IMMEDIATE": True}
        elif params.get("BACKEND") == DUMMY:
            params["BACKEND"] = STORED
        swapped[alias] = params
    return swapped


class override_settings(django.test.override_settings):
    """Django's ``override_settings``, with our backend swapped into ``TASKS``."""

    def __init__(self, **kwargs: Any) -> None:
        if "TASKS" in kwargs:
            kwargs["TASKS"] = _swap(kwargs["TASKS"])
        super().__init__(**kwargs)


@contextmanager
def _swapped_override_settings() -> Iterator[None]:
    """While Django's test modules are imported, ``from django.test import
    override_settings`` gives ours (their decorators and ``with`` blocks use it)."""
    original = django.test.override_settings
    django.test.override_settings = override_settings  # type: ignore[misc]
    try:
        yield
    finally:
        django.test.override_settings = original  # type: ignore[misc]


class DjangosTasksRegistered:
    """Django's test tasks (``tasks.tasks.*``) are registered (``tasks.registry``: what a
    task row may run) while Django's tests run, and only then: the rest of our suite sees
    the registry its own apps made."""

    registered: ClassVar[dict[str, Any]] = {}

    @classmethod
    def setUpClass(cls) -> None:
        for task in cls.registered.values():
            task_registry.register(task)
        super().setUpClass()  # type: ignore[misc]

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()  # type: ignore[misc]
        _unregister()


def _unregister() -> dict[str, Any]:
    """Take Django's test tasks out of our registry; returns them by path."""
    ours = task_registry._tasks
    return {path: ours.pop(path) for path in list(ours) if path.startswith("tasks.")}


def _adapted(module: str, cls: type) -> type:
    """Django's test class, with database access, Django's test tasks registered, every
    app, and the listed tests skipped."""
    bases: tuple[type, ...] = (DjangosTasksRegistered, cls)
    if not issubclass(cls, TransactionTestCase):
        bases = (DjangosTasksRegistered, cls, TestCase)  # our backend stores the tasks
    namespace: dict[str, Any] = {"__module__": __name__, "__qualname__": cls.__qualname__}
    if issubclass(cls, TransactionTestCase):
        namespace["available_apps"] = None  # not []: the task table is ours
    for name in dir(cls):
        reason = NOT_APPLICABLE.get(f"{module}.{cls.__name__}.{name}")
        if reason:
            namespace[name] = unittest.skip(f"not applicable: {reason}")(getattr(cls, name))
    return type(cls.__name__, bases, namespace)


def _load() -> dict[str, type]:
    home = str(_django_tests())
    if home not in sys.path:
        sys.path.insert(0, home)
    found: dict[str, type] = {}
    modules = sorted(p.stem for p in (Path(home) / "tasks").glob("test_*.py"))
    with _swapped_override_settings():
        for module in modules:
            loaded = importlib.import_module(f"tasks.{module}")
            for name, value in vars(loaded).items():
                if (isinstance(value, type) and issubclass(value, unittest.TestCase)
                        and value.__module__ == loaded.__name__):
                    found[f"{module}.{name}"] = value
    return found


DJANGO_TESTS = _load()
DjangosTasksRegistered.registered = _unregister()
for _key, _cls in DJANGO_TESTS.items():
    globals()[_key.replace(".", "__")] = _adapted(_key.split(".")[0], _cls)
del _key, _cls


@pytest.mark.skipif(django.VERSION[:2] != LISTED_FOR, reason="the list is for Django 6.1")
def test_every_listed_exception_names_a_test_of_djangos() -> None:
    """The list of exceptions stays true: each names a test Django has."""
    known = {f"{key}.{name}" for key, cls in DJANGO_TESTS.items() for name in dir(cls)
             if name.startswith("test")}
    assert sorted(set(NOT_APPLICABLE) - known) == []


def test_djangos_test_tasks_are_registered_only_while_its_tests_run() -> None:
    assert DjangosTasksRegistered.registered, "Django's tasks.tasks registered none"
    assert not [p for p in task_registry.known() if p.startswith("tasks.")]
