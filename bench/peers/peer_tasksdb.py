"""django-tasks-db (the database backend for Django's own ``django.tasks``) on PostgreSQL:
two ``manage.py db_worker`` processes.

Runs in bench/.peers/tasksdb (driver.py imports it; the workers import its tasks by their
module path). Settings: django_settings.py. Left: results READY or RUNNING.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_settings")
os.environ["PEER_DJANGO_APP"] = "tasksdb"

import django

django.setup()

import driver  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from django.tasks import task  # noqa: E402
from django_tasks_db.models import DBTaskResult  # noqa: E402

LABEL = "django-tasks-db"
SHAPE = "2 db_worker processes"
NEEDS = "postgres"
REQUIREMENTS = ["django-tasks-db==0.13.0", "Django==6.1.3", "psycopg[binary]==3.3.9"]
LEFT = ("READY", "RUNNING")


@task
def noop() -> None:
    pass


@task
def stamp(path: str) -> None:
    driver.write_stamp(path)


class Bench:
    poll_s = 1.0  # idle polling: db_worker --interval (default 1 s)

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def setup(self) -> None:
        call_command("migrate", verbosity=0)

    def tuning(self) -> dict[str, Any]:
        return {"processes": 2, "interval": "1 s (default: polls when idle)",
                "startup_delay": "on (default: a random sleep of up to 1 s at start, so "
                                 "that the workers do not poll in step)",
                "CONN_MAX_AGE": 600,
                "enqueue": "task.enqueue() in one transaction"}

    def versions(self) -> dict[str, Any]:
        return {p: metadata.version(p) for p in ("django-tasks-db", "Django", "psycopg")}

    def fill(self, jobs: int) -> None:
        DBTaskResult.objects.all().delete()
        with transaction.atomic():
            for _ in range(jobs):
                noop.enqueue()

    def workers(self) -> list[list[str]]:
        command = [sys.executable, "-m", "django", "db_worker", "--no-reload",
                   "--verbosity=0"]
        return [command, command]

    def remaining(self) -> int:
        return DBTaskResult.objects.filter(status__in=LEFT).count()

    def pending(self) -> bool:
        return DBTaskResult.objects.filter(status__in=LEFT).exists()

    def stamp(self, path: str) -> None:
        stamp.enqueue(path)

    def check(self, jobs: int) -> dict[str, Any]:
        found = (DBTaskResult.objects.filter(task_path__endswith=".noop")
                 .values_list("status").order_by().annotate(n=django.db.models.Count("id")))
        return dict(found)

    def teardown(self) -> None:
        django.db.connections.close_all()
