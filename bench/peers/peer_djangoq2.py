"""django-q2 with its ORM broker on PostgreSQL: ``manage.py qcluster`` with 2 workers.

Runs in bench/.peers/djangoq2 (driver.py imports it; the workers import its functions by
their dotted path). Settings, with the cluster's: django_settings.py. Left: messages still
in the broker table (a message is removed when its result is saved).
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_settings")
os.environ["PEER_DJANGO_APP"] = "djangoq2"

import django

django.setup()

import driver  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import transaction  # noqa: E402
from django_q.models import Failure, OrmQ, Success  # noqa: E402
from django_q.tasks import async_task  # noqa: E402

LABEL = "django-q2"
SHAPE = "qcluster, 2 workers"
NEEDS = "postgres"
REQUIREMENTS = ["django-q2==1.11.1", "Django==6.1.3", "psycopg[binary]==3.3.9"]


def noop() -> None:
    pass


def stamp(path: str) -> None:
    driver.write_stamp(path)


class Bench:
    poll_s = 0.2  # idle polling: the ORM broker's poll (default 0.2 s)

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def setup(self) -> None:
        call_command("migrate", verbosity=0)

    def tuning(self) -> dict[str, Any]:
        return {"Q_CLUSTER": settings.Q_CLUSTER, "CONN_MAX_AGE": 600,
                "enqueue": "async_task() in one transaction"}

    def versions(self) -> dict[str, Any]:
        return {p: metadata.version(p) for p in ("django-q2", "Django", "psycopg")}

    def fill(self, jobs: int) -> None:
        for model in (OrmQ, Success, Failure):
            model.objects.all().delete()
        with transaction.atomic():
            for _ in range(jobs):
                async_task("peer_djangoq2.noop")

    def workers(self) -> list[list[str]]:
        return [[sys.executable, "-m", "django", "qcluster", "--verbosity=0"]]

    def remaining(self) -> int:
        return OrmQ.objects.count()

    def pending(self) -> bool:
        return OrmQ.objects.exists()

    def stamp(self, path: str) -> None:
        async_task("peer_djangoq2.stamp", path)

    def check(self, jobs: int) -> dict[str, Any]:
        return {"left": OrmQ.objects.count(), "failed": Failure.objects.count(),
                "success_kept": Success.objects.count()}

    def teardown(self) -> None:
        django.db.connections.close_all()
