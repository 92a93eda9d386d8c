from django.apps import AppConfig


class TestappConfig(AppConfig):
    name = "tests.testapp"

    def ready(self) -> None:
        from . import faults, slow_sql

        faults.install()
        slow_sql.install()
