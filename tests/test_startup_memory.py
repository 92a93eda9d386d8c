"""What a supervisor imports, and so what every child it forks holds (issue #24, memory).

A child is forked from the supervisor: whatever the supervisor imported before the fork is
in each child's memory too (counted again in each one's RSS). So the supervisor's start-up
keeps out what neither it nor a child uses: the modules Django's system checks and the
unapplied-migrations check import (they run in a short-lived fork, ``management/forked.py``),
Django's migration operations, the engines of the databases not in use, croniter where no
schedule exists. ``bench/latency.py`` measures what the idle tree holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.core.management.base import CommandError

from django_dbworker.management.forked import CheckProcessKilled, run_forked

ROOT = Path(__file__).resolve().parent.parent

#: Never in a supervisor after its start-up and a burst, on any database.
NEVER = (
    "django.core.management.commands.makemigrations",  # the system checks' autodetector check
    "django.core.management.commands.migrate",
    "django.db.migrations.autodetector",
    "django.db.migrations.writer",
    "django.db.migrations.loader",  # the unapplied-migrations check
    "django_dbworker.migrations.0001_initial",
    "django_dbworker.db.flag_migrations",
    "croniter",  # the test settings declare no schedule
    "django_dbworker.workflows.builder",  # makes workflows; workflows.rows needs it not
    "tests.urls",  # the URLconf the system checks import
)
#: Our engines (and their drivers' modules) by the vendor that needs them.
ENGINE_MODULES = {"sqlite": ("django_dbworker.db.sqlite", "sqlite3"),
                  "mysql": ("django_dbworker.db.mysql",),
                  "postgresql": ("django_dbworker.db.postgresql",)}

STARTUP = """
import json, sys
import django
django.setup()
from django.core.management import call_command
call_command("runworkers", "--burst", "--worker", "touch", "--concurrency", "1",
             "--verbosity", "0", skip_checks=False)
print(json.dumps(sorted(sys.modules)))
"""


@pytest.mark.processes
@pytest.mark.django_db(transaction=True)
def test_a_supervisor_never_imports_what_it_and_its_children_do_not_use(vendor):
    from django.db import connection

    env = {**os.environ, "DBWORKER_TEST_DB_NAME": connection.settings_dict["NAME"],
           "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    connection.close()
    done = subprocess.run([sys.executable, "-c", STARTUP], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "django_dbworker.supervisor.supervisor" in modules  # it did start
    unused = [m for v, names in ENGINE_MODULES.items() if v != vendor for m in names]
    assert sorted(modules.intersection(NEVER + tuple(unused))) == []
    assert ENGINE_MODULES[vendor][0] in modules


ONLY_OURS = """
import json, sys
from django.conf import settings
settings.configure(INSTALLED_APPS=["django_dbworker"], DATABASES={"default": {
    "ENGINE": "django.db.backends.sqlite3", "NAME": "unused.sqlite3"}})
import django
django.setup()
import django_dbworker.management.commands.runworkers
print(json.dumps(sorted(sys.modules)))
"""


def test_without_djangos_admin_and_contrib_apps_runworkers_imports_none_of_their_kind():
    """``db.partial``'s migration operation is in ``db.flag_migrations``, imported by the
    migration that uses it (Django's contenttypes and auth apps import the operations in
    their ``ready()`` anyway; a project without them does not). Our admin is imported by
    the admin's autodiscover only, where ``django.contrib.admin`` is installed; the CLI's,
    the metrics' and the dashboard's modules by what uses them."""
    done = subprocess.run([sys.executable, "-c", ONLY_OURS], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout.splitlines()[-1]))
    assert "django_dbworker.models" in modules
    assert "django_dbworker.supervisor.supervisor" in modules
    assert sorted(modules & {
        "django.db.migrations", "django_dbworker.db.flag_migrations", "django_dbworker.admin",
        "django.contrib.admin", "django_dbworker.cli", "django_dbworker.insight.metrics",
        "django_dbworker.insight.snapshot", "croniter",
        "django_dbworker.workflows.builder"}) == []
    from django_dbworker.workflows import chain
    from django_dbworker.workflows.builder import chain as built

    assert chain is built  # imported on first use
    from django_dbworker.db import partial
    from django_dbworker.db.flag_migrations import WherePartialIndexesLack

    assert partial.WherePartialIndexesLack is WherePartialIndexesLack  # migration 0007's path
    with pytest.raises(AttributeError, match="has no attribute 'Nope'"):
        partial.Nope  # noqa: B018


def test_run_forked_leaves_the_checks_imports_in_the_fork():
    name = "colorsys"  # nothing of ours, Django's or pytest's imports it
    assert name not in sys.modules
    run_forked(lambda: __import__(name))
    assert name not in sys.modules


def test_run_forked_raises_what_the_check_raised():
    def check() -> None:
        raise CommandError("Database 'default' has 1 unapplied migration(s)", returncode=3)

    with pytest.raises(CommandError, match="1 unapplied migration") as raised:
        run_forked(check)
    assert raised.value.returncode == 3


def test_run_forked_names_an_exception_that_does_not_pickle():
    class Local(Exception):  # a local class: pickle cannot find it by name
        pass

    def check() -> None:
        raise Local("the check's own words")

    with pytest.raises(CommandError, match="Local: the check's own words"):
        run_forked(check)


def test_run_forked_says_so_when_the_check_process_dies():
    with pytest.raises(CommandError, match=r"ended without an answer .*manage.py check"):
        run_forked(lambda: os._exit(3))


def _command(stdout=None):
    from django.core.management.base import OutputWrapper

    from django_dbworker.management.commands.runworkers import Command

    command = Command()
    command.stdout = OutputWrapper(stdout or sys.stdout)
    command.stderr = OutputWrapper(sys.stderr)
    return command


def test_checks_run_here_when_the_output_goes_to_a_buffer_or_threads_run():
    """A fork would lose what it writes to a call_command(stdout=StringIO) buffer, and may
    deadlock a process with threads: the checks then run in this process, as Django's."""
    import io
    import threading

    ran: list[int] = []
    _command(io.StringIO())._checked(lambda: ran.append(os.getpid()))
    assert ran == [os.getpid()]
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        _command()._checked(lambda: ran.append(os.getpid()))
    finally:
        stop.set()
        thread.join()
    assert ran == [os.getpid(), os.getpid()]


IN_A_FORK = """
import os, sys, django
django.setup()
from django.core.management.base import OutputWrapper
from django_dbworker.management.commands.runworkers import Command
command = Command()
command.stdout, command.stderr = OutputWrapper(sys.stdout), OutputWrapper(sys.stderr)
command._checked(lambda: print("check ran in", os.getpid(), flush=True))
print("command in", os.getpid(), flush=True)
"""


def test_checks_run_in_a_fork_in_a_process_of_one_thread_writing_to_its_own_streams():
    # A fresh process (this one runs threads by now): one thread, its own streams.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DJANGO_SETTINGS_MODULE": "tests.settings"}
    done = subprocess.run([sys.executable, "-c", IN_A_FORK], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    pids = dict(line.rsplit(" in ", 1) for line in done.stdout.split("\n") if " in " in line)
    assert set(pids) == {"check ran", "command"}, done.stdout
    assert pids["check ran"] != pids["command"], "the check ran in a fork of its own"


def test_run_forked_tells_a_killed_check_process_apart():
    """Killed by a signal before it answered (the OOM killer, a kill -9 of the supervisor's
    children): nothing is known of the checks, so it is not a check failure."""
    with pytest.raises(CheckProcessKilled, match=r"killed by SIGKILL .*manage.py check") as e:
        run_forked(lambda: os.kill(os.getpid(), signal.SIGKILL))
    assert e.value.signal_name == "SIGKILL"


@pytest.mark.processes
def test_runworkers_comes_up_when_its_check_process_is_killed(runworkers):
    """A kill -9 of every child of a starting supervisor hits the checks' process: the
    checks then run in the supervisor itself, which comes up and serves as ever."""
    from django_dbworker.models import Execution, State
    from tests.conftest import wait_for
    from tests.testapp.models import Item

    message = "checks' process was killed by SIGKILL; running the checks in this process"
    for _ in range(5):  # a loaded machine may run the checks between two looks: again
        rw = runworkers("--worker", "touch")
        killed: list[int] = []
        deadline = time.monotonic() + 60
        while (not killed and rw.process.poll() is None and time.monotonic() < deadline
               and "runworkers:" not in rw.output()):
            for pid in rw.children():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:  # its check was through already
                    continue
                killed.append(pid)
            time.sleep(0.005)
        wait_for(lambda rw=rw: "runworkers:" in rw.output() or rw.process.poll() is not None,
                 what="runworkers to come up")
        if message in rw.output():
            break
        rw.stop()  # the kill hit a worker child, or came too late: not the case tested
    else:
        pytest.fail(f"no kill hit the checks' process in 5 starts: {rw.output()[-2000:]}")
    item = Item.objects.create()
    wait_for(lambda: Execution.objects.filter(worker="touch", source_id=str(item.pk),
                                              state=State.FINISHED).exists(),
             what="the row processed")
    assert rw.process.poll() is None
    assert message in rw.output(), rw.output()
