"""Settings of the Django peers (django-tasks-db, django-q2), in their own virtualenvs.

``PEER_DJANGO_APP`` says which; the database is ``PEER_PG_NAME`` (bench/peers.py creates
and drops it).
"""

import json
import os

PEER = os.environ.get("PEER_DJANGO_APP", "tasksdb")
SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("PEER_PG_HOST", "127.0.0.1"),
        "PORT": os.environ.get("PEER_PG_PORT", "5432"),
        "USER": os.environ.get("PEER_PG_USER", "postgres"),
        "NAME": os.environ.get("PEER_PG_NAME", "postgres"),
        # Persistent connections, as Django's docs advise where connecting is a cost: both
        # workers call close_old_connections() around every task, which with the default
        # (0) means a new PostgreSQL connection per task.
        "CONN_MAX_AGE": 600,
    },
}
INSTALLED_APPS = ["django_tasks_db"] if PEER == "tasksdb" else ["django_q"]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
# django-q2: two workers on the ORM broker, its defaults otherwise (poll 0.2 s, bulk 1,
# queue_limit workers**2) but for save_limit: 0 keeps every result without pruning; the
# default, 250, prunes on every result by loading the kept results (O(250) per task).
# PEER_Q_CLUSTER (JSON) overrides, to try other settings.
Q_CLUSTER = {"name": "bench", "workers": 2, "orm": "default", "save_limit": 0,
             "timeout": 60, "retry": 120, "max_attempts": 1, "catch_up": False,
             "log_level": "WARNING", **json.loads(os.environ.get("PEER_Q_CLUSTER", "{}"))}
LOGGING = {"version": 1, "disable_existing_loggers": False,
           "root": {"level": "WARNING", "handlers": []}}
