from __future__ import annotations

from django.apps import AppConfig
from django.db.backends.signals import connection_created
from django.db.models.signals import post_delete, post_save
from django.utils.module_loading import autodiscover_modules


class DBWorkerConfig(AppConfig):
    name = "django_dbworker"
    verbose_name = "DB worker"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401 - registers the system checks
            conf,
        )
        from .db.connections import know_features, on_connection_created
        from .djtasks import refuse_task_options
        from .rows import pending

        config = conf.load()  # bad settings fail at start-up, naming the key
        know_features(config.DATABASE)
        connection_created.connect(on_connection_created, dispatch_uid="dbworker-connection")
        post_save.connect(pending.on_save, dispatch_uid="dbworker-pending-save")
        post_delete.connect(pending.on_delete, dispatch_uid="dbworker-pending-delete")
        autodiscover_modules("workers")
        # Task rows name registered tasks only (task_registry): their modules are imported
        # here, in every process that runs or reads tasks, never because a row names one.
        try:
            autodiscover_modules("tasks")
        except TypeError as exc:  # Django 6.0's @task(retries=...): say what to use instead
            refused = refuse_task_options(exc)
            if refused is exc:
                raise
            raise refused from exc
