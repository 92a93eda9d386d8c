from django.apps import AppConfig


class BenchAppConfig(AppConfig):
    name = "benchapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from benchapp import explain

        explain.install()
