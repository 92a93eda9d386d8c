"""A task row's ``task_path`` names a registered task, or nothing runs: no import, ever."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from django_dbworker.djtasks import default_task_backend
from django_dbworker.exceptions import UnknownTask
from django_dbworker.models import TaskRecord, TaskStatus
from django_dbworker.tasks import registry as task_registry
from django_dbworker.testing import run_until_idle
from tests.conftest import ROOT
from tests.testapp import tasks

pytestmark = pytest.mark.django_db(transaction=True)

HIDDEN = "tests.testapp.guard_sideeffect"
HIDDEN_TASK = f"{HIDDEN}.guard_hidden"


@pytest.fixture
def side_effect(tmp_path, monkeypatch):
    """The file the hidden module writes when imported; it must never exist."""
    path = tmp_path / "imported.txt"
    monkeypatch.setenv("DBWORKER_GUARD_SIDE_EFFECT", str(path))
    assert HIDDEN not in sys.modules
    yield path
    assert HIDDEN not in sys.modules, "a task row imported a module"
    assert not path.exists(), path.read_text()


def tampered(path: str) -> TaskRecord:
    result = tasks.add.enqueue(1, 2)
    TaskRecord.objects.filter(pk=result.id).update(task_path=path)
    return TaskRecord.objects.get(pk=result.id)


def test_a_tampered_path_is_not_imported_and_fails_saying_how_to_register(side_effect):
    row = tampered(HIDDEN_TASK)
    assert run_until_idle() == {"failed": 1}
    row.refresh_from_db()
    assert row.status == TaskStatus.FAILED
    message = row.errors[0]["message"]
    assert row.errors[0]["exception_class_path"] == "django_dbworker.exceptions.UnknownTask"
    assert message.startswith(f"'{HIDDEN_TASK}' is not a registered task; define it with "
                              "@task in the tasks.py module of an app in INSTALLED_APPS"), message
    assert "AppConfig.ready()" in message


@pytest.mark.parametrize("path", [
    "os.system", "tests.testapp.models.Item", "tests.testapp.tasks", "", "x." * 127,
    "tests.testapp.tasks.add.__globals__", f"{HIDDEN}.os",
])
def test_any_unregistered_path_fails_cleanly(side_effect, path):
    row = tampered(path)
    assert run_until_idle() == {"failed": 1}
    row.refresh_from_db()
    assert "is not a registered task" in row.errors[0]["message"]
    assert len(row.errors[0]["message"]) < 700


def test_reading_a_tampered_row_imports_nothing_and_gives_its_result(side_effect):
    """get_result() of a row whose function is unknown returns its stored result (issue
    21: it raised UnknownTask), with a stand-in task named by the row's path; once run, the
    failure's traceback says where the lookup failed (it was empty)."""
    row = tampered(HIDDEN_TASK)
    result = default_task_backend.get_result(str(row.pk))
    assert result.task.module_path == HIDDEN_TASK and result.status == "READY"
    with pytest.raises(UnknownTask, match=f"'{HIDDEN_TASK}' is not a registered task"):
        result.task.call()
    assert run_until_idle() == {"failed": 1}
    result = default_task_backend.get_result(str(row.pk))
    assert result.status == "FAILED"
    (error,) = result.errors
    assert error.exception_class_path == "django_dbworker.exceptions.UnknownTask"
    assert "UnknownTask" in error.traceback and "resolve" in error.traceback


def test_registered_tasks_still_run():
    result = tasks.add.enqueue(2, 3)
    assert task_registry.resolve("tests.testapp.tasks.add") is tasks.add
    assert run_until_idle() == {"successful": 1}
    result.refresh()
    assert result.return_value == 5


def test_every_apps_tasks_module_is_registered_at_start_up():
    """django.setup() alone (a web process reading results, a shell) knows every app's
    tasks: tasks.py modules are imported by DBWorkerConfig.ready(), nothing else."""
    code = ("import sys, django; django.setup(); "
            "from django_dbworker.tasks import registry as task_registry; "
            "print('tests.testapp.tasks.add' in task_registry.known(), "
            f"{HIDDEN!r} in sys.modules)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    assert out.split() == ["True", "False"], out


@pytest.mark.processes
def test_runworkers_never_imports_a_tampered_path(runworkers, side_effect):
    bad = tampered(HIDDEN_TASK)
    good = tasks.add.enqueue(4, 5)
    process = runworkers("--burst", extra_env={"DBWORKER_GUARD_SIDE_EFFECT": str(side_effect)})
    assert process.wait() == 0, process.output()
    bad.refresh_from_db()
    assert bad.status == TaskStatus.FAILED
    assert "is not a registered task" in bad.errors[0]["message"]
    good.refresh()
    assert good.return_value == 9


def test_a_stored_error_class_is_never_imported_when_read(side_effect):
    """Django's ``TaskError.exception_class`` imports its path; ours looks among the
    modules already imported, so a tampered ``errors`` row imports nothing when read."""
    result = tasks.always_fails.enqueue()
    run_until_idle()
    errors = default_task_backend.get_result(result.id).errors
    assert errors and errors[-1].exception_class is ValueError  # a real one still resolves
    TaskRecord.objects.filter(pk=result.id).update(errors=[
        {"exception_class_path": f"{HIDDEN}.Boom", "traceback": "", "message": "x"},
        {"exception_class_path": "tests.testapp.workers.Unprintable", "traceback": ""},
        {"exception_class_path": "os.path", "traceback": ""},
    ])
    hidden, nested, not_a_class = default_task_backend.get_result(result.id).errors
    assert hidden.exception_class_path == f"{HIDDEN}.Boom"
    # ImportError, as Django's raises for a path it cannot import; ValueError, as before.
    with pytest.raises(ImportError, match="a stored error never imports a module"):
        _ = hidden.exception_class
    with pytest.raises(ValueError, match="a stored error never imports a module"):
        _ = hidden.exception_class
    assert nested.exception_class is tasks.Unprintable
    with pytest.raises(ValueError, match=r"^'os.path' does not reference a valid exception\. "
                                         r"It names a module, not an exception class\.$"):
        _ = not_a_class.exception_class
