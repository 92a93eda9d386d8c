import os

from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "tests.testapp"

    def ready(self) -> None:
        from . import faults, slow_sql

        faults.install()
        slow_sql.install()
        if os.environ.get("DBWORKER_TEST_PREFETCH_KEEP"):
            keep_units_ahead()


def keep_units_ahead() -> None:
    """The tests of units claimed ahead (``DBWORKER_TEST_PREFETCH_KEEP``) need units waiting
    while a slow one runs, whatever the machine's load: every unit counts as short (a
    loaded machine makes the quick ones look slow, and then nothing is claimed ahead), and a
    unit waits in the supervisor up to a third of the lease (not one second) before it is
    given back. What they test, giving back and reaping, does not depend on either."""
    from django_dbworker.supervisor import prefetch

    prefetch.WAIT = 3600.0
    prefetch.HOLD = 3600.0
