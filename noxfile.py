"""The test matrix: (Python, Django, database), run by nox (docs/compatibility.md).

    nox -l                                         # the sessions
    nox -s "tests(py3.12-dj5.2)"                   # the whole suite, on every database
    DBWORKER_TEST_DBS="sqlite postgres" nox -s "tests(py3.12-dj6.0)" -- -m compat
    nox -t compat                                  # scripts/test's quick pass

One session per (Python, Django): a virtualenv each, in .venv-nox/ (kept between runs), with
Django of that series, the ``django52`` extra on 5.2 (the django-tasks backport), and the
``test`` extra. It runs pytest once per database of ``DBWORKER_TEST_DBS`` (default
"sqlite postgres mariadb"; MariaDB needs the ``mysql`` extra, installed when it is asked for).
Arguments after ``--`` go to pytest. scripts/test runs the newest Python and Django itself
(its main run, in .venv) and then the sessions tagged ``compat`` with ``-m compat`` on
SQLite and PostgreSQL.

Interpreters: ``python3.12``/``python3.13`` on PATH, else pyenv's installs (3.12.* and 3.13.*
under $(pyenv root)/versions); none is downloaded.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox
from nox.command import CommandFailed

ROOT = Path(__file__).resolve().parent
PYTHONS = ["3.12", "3.13"]
#: Django series -> (requirement, extras of ours it needs).
DJANGOS = {
    "5.2": ("Django>=5.2,<5.3", ["django52"]),
    "6.0": ("Django>=6.0,<6.1", []),
    "6.1": ("Django>=6.1,<6.2", []),
}
#: scripts/test's quick pass (tag ``compat``, ``DBWORKER_QUICK=1``): these (Python, Django)
#: run the ``compat`` subset on these databases only. Django 6.0 differs from 6.1 in its
#: ``@task`` and its admin, not in what the databases do: SQLite is enough there.
COMPAT = {("3.12", "5.2"): ("sqlite", "postgres"), ("3.12", "6.0"): ("sqlite",)}
DATABASES = ("sqlite", "postgres", "mariadb")

nox.options.envdir = ".venv-nox"
# uv (the dev extra has it) makes and fills a session's virtualenv in seconds; virtualenv
# (nox's own dependency) where uv is missing.
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.download_python = "never"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = []  # nothing by default: name a session (-s) or a tag (-t)


def _runs(path: str) -> bool:
    try:
        return subprocess.run([path, "-c", "pass"], capture_output=True,
                              timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _find_interpreters() -> None:
    """Put pyenv's 3.12/3.13 first on PATH where ``python3.X`` does not run by itself
    (pyenv's shims of versions that are not selected are on PATH and fail when run)."""
    root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    for version in PYTHONS:
        found = shutil.which(f"python{version}")
        if found and _runs(found):
            continue
        installs = sorted(
            (p for p in Path(root, "versions").glob(f"{version}.*")
             if re.fullmatch(rf"{re.escape(version)}\.\d+", p.name)),
            key=lambda p: [int(n) for n in p.name.split(".")], reverse=True)
        for install in installs:
            if _runs(str(install / "bin" / f"python{version}")):
                os.environ["PATH"] = f"{install / 'bin'}{os.pathsep}{os.environ['PATH']}"
                break


_find_interpreters()


def _databases() -> list[str]:
    dbs = os.environ.get("DBWORKER_TEST_DBS", " ".join(DATABASES)).split()
    unknown = sorted(set(dbs) - set(DATABASES))
    if unknown:
        raise SystemExit(f"DBWORKER_TEST_DBS names {unknown}; use {' '.join(DATABASES)}.")
    return dbs


def _param(python: str, django: str) -> object:
    tags = ["matrix", *(["compat"] if (python, django) in COMPAT else [])]
    return nox.param(python, django, id=f"py{python}-dj{django}", tags=tags)


@nox.session
@nox.parametrize(("python", "django"), [_param(p, d) for p in PYTHONS for d in DJANGOS])
def tests(session: nox.Session, django: str) -> None:
    """The suite on the databases of DBWORKER_TEST_DBS; pytest arguments after --."""
    requirement, extras = DJANGOS[django]
    dbs = _databases()
    if os.environ.get("DBWORKER_QUICK"):
        dbs = [db for db in dbs if db in COMPAT.get((str(session.python), django), ())]
    wanted = ["test", *extras, *(["mysql"] if "mariadb" in dbs else [])]
    # pip too: uv's virtualenvs have none, and test_django_tasks_suite fetches with it.
    session.install("pip", "-e", f".[{','.join(wanted)}]", requirement)
    session.run("python", "-c", "import django, sys; print('Python', sys.version.split()[0], "
                "'/ Django', django.get_version())")
    # scripts/test passes its own pytest arguments on (e.g. -k claim); with those, a pair
    # may hold none of the tests they select (pytest's exit 5), which is not a failure.
    codes = [0, 5] if int(os.environ.get("DBWORKER_NO_TESTS_OK") or 0) else [0]
    failed = []
    for db in dbs:  # every database, even after one failed
        session.log(f"pytest on {db}")
        try:
            session.run("python", "-m", "pytest", *session.posargs, success_codes=codes,
                        env={"PYTHONPATH": str(ROOT), "DBWORKER_TEST_DB": db})
        except CommandFailed:
            failed.append(db)
    if failed:
        session.error(f"pytest failed on {', '.join(failed)}")
