"""Settings for our own test suite: DBWORKER_TEST_DB=sqlite (default), postgres or mariadb."""

import os
import tempfile
from pathlib import Path

BASE = Path(__file__).resolve().parent
SECRET_KEY = "tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbworker",
    "tests.testapp",
]
# The admin and the health/metrics views, for the admin, browser and view tests.
ROOT_URLCONF = "tests.urls"
STATIC_URL = "/static/"
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DB = os.environ.get("DBWORKER_TEST_DB", "sqlite")
# Subprocesses started by the tests use the test database the suite created.
TEST_DB_NAME = os.environ.get("DBWORKER_TEST_DB_NAME")

if DB == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": TEST_DB_NAME or "dbworker",
            "USER": os.environ.get("PGUSER", "postgres"),
            "HOST": os.environ.get("PGHOST", "127.0.0.1"),
            "PORT": os.environ.get("PGPORT", "5432"),
            "TEST": {"NAME": f"test_dbworker_{os.getpid()}"},
        }
    }
elif DB == "sqlite":
    folder = Path(os.environ.get("DBWORKER_TEST_DIR") or tempfile.gettempdir())
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": TEST_DB_NAME or str(folder / "dbworker.sqlite3"),
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
            "TEST": {"NAME": str(folder / f"test_dbworker_{os.getpid()}.sqlite3")},
        }
    }
elif DB == "mariadb":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.mysql",
            "NAME": TEST_DB_NAME or "dbworker",
            "USER": os.environ.get("MYSQL_USER", "root"),
            "PASSWORD": os.environ.get("MYSQL_PASSWORD", ""),
            "HOST": os.environ.get("MYSQL_HOST", "127.0.0.1"),
            "PORT": os.environ.get("MYSQL_PORT", "3306"),
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"NAME": f"test_dbworker_{os.getpid()}", "CHARSET": "utf8mb4",
                     "COLLATION": "utf8mb4_unicode_ci"},
        }
    }
elif DB == "memory":  # only for the tests that prove an in-memory database is refused
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}}
else:
    raise RuntimeError(f"DBWORKER_TEST_DB={DB!r}: use 'sqlite', 'postgres' or 'mariadb'.")

DBWORKER = {
    "LEASE_SECONDS": float(os.environ.get("DBWORKER_TEST_LEASE", "30")),
    "POLL_INTERVAL": float(os.environ.get("DBWORKER_TEST_POLL", "0.1")),
    "GRACE_PERIOD": 10.0,
    "SWEEP_INTERVAL": 2.0,
    "CONCURRENCY": 2,
    # The chaos soak raises it: its random kills may hit one unit more than three times.
    "MAX_CRASHES": int(os.environ.get("DBWORKER_TEST_MAX_CRASHES", "3")),
}
if os.environ.get("DBWORKER_TEST_FULL_SWEEP"):  # test_discovery_processes: full passes
    DBWORKER["FULL_SWEEP_INTERVAL"] = float(os.environ["DBWORKER_TEST_FULL_SWEEP"])
if os.environ.get("DBWORKER_TEST_PREFETCH"):  # the prefetch process tests set it
    DBWORKER["PREFETCH"] = int(os.environ["DBWORKER_TEST_PREFETCH"])
if os.environ.get("DBWORKER_TEST_CHILD_MAX_MEMORY_MB"):  # test_poison_processes: the limit
    DBWORKER["CHILD_MAX_MEMORY_MB"] = int(os.environ["DBWORKER_TEST_CHILD_MAX_MEMORY_MB"])
if os.environ.get("DBWORKER_TEST_ASYNC_CONCURRENCY"):  # test_async_units: the bound
    DBWORKER["ASYNC_CONCURRENCY"] = int(os.environ["DBWORKER_TEST_ASYNC_CONCURRENCY"])
if os.environ.get("DBWORKER_TEST_STARTUP_WAIT"):  # test_startup_wait: how long it tries
    DBWORKER["STARTUP_WAIT"] = float(os.environ["DBWORKER_TEST_STARTUP_WAIT"])
if os.environ.get("DBWORKER_TEST_CRON"):  # the cron process test turns this schedule on
    DBWORKER["SCHEDULES"] = {
        "every_second": {"task": "tests.testapp.tasks.tick", "cron": "* * * * * */1"},
    }
if os.environ.get("DBWORKER_TEST_CRON_BROKEN"):  # test_declarations: one schedule fails
    DBWORKER["SCHEDULES"] = {  # at run time (its enqueue raises: the unique_key function
        **DBWORKER.get("SCHEDULES", {}),  # wants user_id); the others go on
        "decl_raises": {"task": "tests.testapp.tasks.unique_debounced",
                        "cron": "* * * * * */1"},
    }
if os.environ.get("DBWORKER_TEST_POOLER_SETTINGS"):  # test_pgbouncer: what docs/operations.md
    DBWORKER["NOTIFY"] = False  # advises behind a transaction-pooling PgBouncer
    DBWORKER["PREPARED_STATEMENTS"] = False
    DATABASES["default"]["DISABLE_SERVER_SIDE_CURSORS"] = True
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"django_dbworker": {"handlers": ["stderr"], "level": "INFO"}},
}
TASKS = {
    "default": {
        "BACKEND": "django_dbworker.backend.DBWorkerBackend",
        "QUEUES": ["default", "emails", "slow"],
    },
    "on_commit": {
        "BACKEND": "django_dbworker.backend.DBWorkerBackend",
        "OPTIONS": {"ENQUEUE_ON_COMMIT": True},
    },
    "immediate": {  # test_immediate: each enqueue runs its tasks in the caller
        "BACKEND": "django_dbworker.backend.DBWorkerBackend",
        "QUEUES": ["default", "emails", "slow"],
        "OPTIONS": {"IMMEDIATE": True},
    },
}
