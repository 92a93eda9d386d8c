"""``pg_sleep(seconds)`` on SQLite too, so one eligible queryset sleeps inside the database
on both (``slow_eligible`` in workers.py). It returns 0, as ``pg_sleep`` returns a void
that is not NULL: ``pg_sleep(s) IS NULL`` sleeps, then is false on both databases."""

import os
import time
from pathlib import Path

from django.db.backends.signals import connection_created

#: A file touched each time the function sleeps (SQLite): the test's proof that it did.
SLEPT = "DBWORKER_TEST_SLEPT"


def pg_sleep(seconds: float) -> int:
    mark = os.environ.get(SLEPT)
    if mark:
        Path(mark).touch()
    time.sleep(seconds)
    return 0


def register(sender, connection, **kwargs) -> None:
    if connection.vendor == "sqlite":
        connection.connection.create_function("pg_sleep", 1, pg_sleep)


def install() -> None:
    connection_created.connect(register, weak=False, dispatch_uid="testapp.slow_sql")
