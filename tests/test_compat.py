"""Django 5.2 (with the django-tasks backport), 6.0 and 6.1: ``django_dbworker.djtasks``
gives every module the framework of the Django installed, and what one version lacks is
refused by name (docs/compatibility.md). Each test runs on every version (noxfile.py) and
checks what that version must do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import django
import pytest
from django.core import checks
from django.test import override_settings

import django_dbworker
from django_dbworker import djtasks
from django_dbworker.backend import DBWorkerBackend, DBWorkerTask

ROOT = Path(__file__).resolve().parent.parent
BACKPORT = django.VERSION < (6, 0)
DJANGO_60 = (6, 0) <= django.VERSION < (6, 1)


def python(code: str, *, path: Path | None = None,
           settings: str = "tests.settings") -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter of this virtualenv, with ``path`` first on the
    import path."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": settings,
           "PYTHONPATH": os.pathsep.join(str(p) for p in (path, ROOT) if p)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_framework_is_djangos_own_from_6_0_and_the_backport_before():
    if BACKPORT:
        import django_tasks.exceptions

        assert djtasks.FRAMEWORK == djtasks.LOGGER_NAME == "django_tasks"
        assert djtasks.InvalidTask is django_tasks.exceptions.InvalidTaskError
        assert djtasks.InvalidTaskBackend is django_tasks.exceptions.InvalidTaskBackendError
        assert djtasks.task_backends is django_tasks.task_backends
    else:
        import django.tasks
        import django.tasks.exceptions

        assert djtasks.FRAMEWORK == djtasks.LOGGER_NAME == "django.tasks"
        assert djtasks.InvalidTask is django.tasks.exceptions.InvalidTask
        assert djtasks.task_backends is django.tasks.task_backends
    assert isinstance(djtasks.task_backends["default"], DBWorkerBackend)
    assert issubclass(DBWorkerBackend, djtasks.BaseTaskBackend)


def test_no_module_of_ours_imports_the_framework_but_djtasks():
    """The rule that keeps one place to change: ``from ..djtasks import X``."""
    direct = re.compile(r"^\s*(from|import)\s+(django\.tasks|django_tasks|django\.utils\.json)"
                        r"\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "django_dbworker").rglob("*.py")
                 if p.name != "djtasks.py" and direct.search(p.read_text())]
    assert offenders == []


def test_django_dbworker_task_takes_our_options_on_every_django():
    result = python("""
        import django; django.setup()
        from django_dbworker import task
        from django_dbworker.backend import DBWorkerTask
        import tests.testapp.tasks as module

        def retried(): pass
        retried.__module__ = module.__name__
        module.retried = retried
        t = task(retries=3, retry_backoff=True, queue_name="emails")(retried)
        assert isinstance(t, DBWorkerTask) and t.retries == 3 and t.retry_backoff, t
        assert task(retried).retries == 0
        print("ok")
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_a_django_tasks_task_given_our_options_is_refused_by_name_on_6_0(tmp_path):
    """Django 6.0's ``@task`` takes no options: the app's ``tasks`` module fails at start-up
    with an error naming ours. Django 6.1 and the backport pass the options on."""
    framework = "django_tasks" if BACKPORT else "django.tasks"
    app = tmp_path / "optionsapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "tasks.py").write_text(
        f"from {framework} import task\n\n\n@task(retries=2)\ndef send():\n    pass\n")
    (tmp_path / "options_settings.py").write_text(
        "from tests.settings import *  # noqa\n\nINSTALLED_APPS = [*INSTALLED_APPS, "
        "'optionsapp']\n")
    result = python("""
        import django; django.setup()
        from optionsapp.tasks import send
        print(type(send).__name__, send.retries)
    """, path=tmp_path, settings="options_settings")
    if DJANGO_60:
        assert result.returncode != 0
        assert ("optionsapp.tasks: Django 6.0" in result.stderr
                and "retries=... cannot be given to it" in result.stderr
                and "'from django_dbworker import task'" in result.stderr), result.stderr
    else:
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["DBWorkerTask", "2"]


def test_other_type_errors_of_a_tasks_module_are_not_touched():
    exc = TypeError("unsupported operand type(s) for +: 'int' and 'str'")
    assert djtasks.refuse_task_options(exc) is exc


@pytest.mark.skipif(not BACKPORT, reason="Django 6.0+ needs no backport")
def test_without_the_backport_django_5_2_says_what_to_install():
    result = python("""
        import sys
        sys.modules["django_tasks"] = None  # as if it were not installed
        import django_dbworker.djtasks
    """)
    assert result.returncode != 0
    assert "needs the django-tasks backport" in result.stderr
    assert 'pip install "django-dbworker[django52]"' in result.stderr


@pytest.mark.skipif(not BACKPORT, reason="Django 6.0+ needs no backport")
def test_an_old_backport_is_refused_with_the_version_to_install():
    result = python("""
        from importlib import metadata
        metadata.version = lambda name: "0.11.0"
        import django_dbworker.djtasks
    """)
    assert result.returncode != 0
    assert "needs django-tasks 0.12 or later" in result.stderr
    assert "this is django-tasks 0.11.0" in result.stderr


@pytest.mark.skipif(BACKPORT, reason="Django 5.2 needs the backport")
def test_django_6_needs_nothing_from_the_backport():
    result = python("""
        import sys
        sys.modules["django_tasks"] = None  # as if it were not installed
        import django; django.setup()
        from django_dbworker import djtasks, task
        print(djtasks.FRAMEWORK)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "django.tasks"


def test_the_backends_system_checks_run_on_every_django():
    """``django.tasks`` registers its check of the backends; so does djtasks, importing the
    backport's (whose app need not be installed)."""
    tasks_setting = {"default": {"BACKEND": "django_dbworker.backend.DBWorkerBackend",
                                 "OPTIONS": {"NOPE": 1}}}
    with override_settings(TASKS=tasks_setting):  # the setting_changed reset, too
        ids = [m.id for m in checks.run_checks()]
    assert "django_dbworker.E011" in ids
    assert "django_dbworker.E011" not in [m.id for m in checks.run_checks()]


def test_the_logger_name_is_the_one_the_frameworks_log_lines_use():
    """Django logs task events to ``django.tasks``, the backport to ``django_tasks``."""
    module = sys.modules[f"{djtasks.FRAMEWORK}.signals"]
    assert module.logger.name == djtasks.LOGGER_NAME


def test_the_public_task_is_the_compat_decorator():
    assert django_dbworker.task is djtasks.task
    assert "task" in django_dbworker.__all__
    assert DBWorkerTask.__mro__[1] is djtasks.Task


def test_the_supported_djangos_are_declared_tested_and_classified_alike():
    """pyproject's classifiers and dependency, the backport extra, and noxfile's matrix
    name the same Django series."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    classified = sorted(c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                        if re.fullmatch(r"Framework :: Django :: [\d.]+", c))
    noxfile = (ROOT / "noxfile.py").read_text()
    matrix = sorted(re.findall(r'^\s+"(\d\.\d)": \("Django', noxfile, re.M))
    assert classified == matrix == ["5.2", "6.0", "6.1"]
    assert f"Django>={classified[0]}" in project["dependencies"]
    assert project["optional-dependencies"]["django52"] == ["django-tasks>=0.12"]
    pythons = sorted(c.rsplit(" :: ", 1)[1] for c in project["classifiers"]
                     if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert pythons == sorted(re.findall(r'"(3\.\d+)"', noxfile.split("PYTHONS = ")[1]
                                        .split("\n")[0]))
