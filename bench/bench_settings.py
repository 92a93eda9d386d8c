"""Django settings for the benchmarks: BENCH_DB=postgres|sqlite|mariadb,
BENCH_DB_NAME=<name or path>.

The scripts set these variables for themselves and for the ``runworkers`` they start.
BENCH_DB_NAME_LARGE, if set, is a second database of the same kind, the alias ``large``.
"""

import os

SECRET_KEY = "bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["django_dbworker", "benchapp"]
if os.environ.get("BENCH_KEYED"):  # flow_control.py's keyed runs (benchkeyed/__init__.py)
    INSTALLED_APPS.append("benchkeyed")

DB = os.environ.get("BENCH_DB", "sqlite")
NAMES = {"default": os.environ.get("BENCH_DB_NAME", ""),
         "large": os.environ.get("BENCH_DB_NAME_LARGE", "")}
if DB == "postgres":
    DATABASES = {
        alias: {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": name,
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
        }
        for alias, name in NAMES.items() if name or alias == "default"
    }
elif DB == "sqlite":
    DATABASES = {
        alias: {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": name,
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
        for alias, name in NAMES.items() if name or alias == "default"
    }
elif DB == "mariadb":
    # As tests/settings.py: MariaDB at 127.0.0.1:3306, root, empty password; mysqlclient.
    DATABASES = {
        alias: {
            "ENGINE": "django.db.backends.mysql",
            "NAME": name,
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
        }
        for alias, name in NAMES.items() if name or alias == "default"
    }
else:
    raise RuntimeError(f"BENCH_DB={DB!r}: use 'postgres', 'sqlite' or 'mariadb'.")

#: The claim_cost benchmark switches DATABASE between "default" and "large".
DBWORKER = {"DATABASE": "default", "LEASE_SECONDS": 60.0}
#: BENCH_PREFETCH=<n>: DBWORKER["PREFETCH"] for the runworkers the benchmarks start.
if os.environ.get("BENCH_PREFETCH"):
    DBWORKER["PREFETCH"] = int(os.environ["BENCH_PREFETCH"])
#: BENCH_ASYNC_CONCURRENCY=<n>: DBWORKER["ASYNC_CONCURRENCY"] (async_io.py: 1 vs N).
if os.environ.get("BENCH_ASYNC_CONCURRENCY"):
    DBWORKER["ASYNC_CONCURRENCY"] = int(os.environ["BENCH_ASYNC_CONCURRENCY"])
#: BENCH_POLL=<seconds>: DBWORKER["POLL_INTERVAL"] (latency.py runs SQLite with several).
if os.environ.get("BENCH_POLL"):
    DBWORKER["POLL_INTERVAL"] = float(os.environ["BENCH_POLL"])
TASKS = {"default": {"BACKEND": "django_dbworker.backend.DBWorkerBackend",
                     "QUEUES": ["default", "paused"]}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_dbworker": {"handlers": ["stderr"], "level": "WARNING"}},
}
