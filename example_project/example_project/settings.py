"""Settings of the example project: SQLite file by default, PostgreSQL or MariaDB/MySQL via
DATABASE_URL.

DATABASE_URL=postgres://user:password@host:5432/name uses PostgreSQL instead;
DATABASE_URL=mysql://user:password@host:3306/name MariaDB (>= 10.6) or MySQL (>= 8.0), through
mysqlclient (the `mysql` extra; scripts/demo installs it and creates the database);
DATABASE_URL=sqlite:////absolute/path.sqlite3 another SQLite file. MEDIA_ROOT=/path puts
the uploads somewhere else than example_project/media/.
"""

import os
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "example-project-only-not-a-secret"  # a demo, never deployed
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_dbworker",
    "images",
]

MIDDLEWARE = [
    "images.api_errors.ApiErrorsMiddleware",  # errors under /api/ as JSON, not HTML
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "example_project.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]


def database_from_url(url: str) -> dict:
    """A DATABASES entry for a postgres://, mysql:// or sqlite:/// URL (no extra dependency)."""
    parts = urlsplit(url)
    if parts.scheme in ("postgres", "postgresql"):
        return {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(parts.path.lstrip("/")) or "postgres",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
        }
    if parts.scheme == "mysql":
        return {
            "ENGINE": "django.db.backends.mysql",
            "NAME": unquote(parts.path.lstrip("/")) or "dbworker_example",
            "USER": unquote(parts.username or ""),
            "PASSWORD": unquote(parts.password or ""),
            "HOST": parts.hostname or "",
            "PORT": str(parts.port or ""),
            # Four-byte UTF-8 (emoji in file names); Django's default isolation level there,
            # READ COMMITTED, is the one django-dbworker needs (checks E014 and W004).
            "OPTIONS": {"charset": "utf8mb4"},
            "TEST": {"CHARSET": "utf8mb4", "COLLATION": "utf8mb4_unicode_ci"},
        }
    if parts.scheme == "sqlite":
        return {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": unquote(parts.path),
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    raise ImproperlyConfigured(
        f"DATABASE_URL={url!r}: use postgres://user:password@host:port/name, "
        "mysql://user:password@host:port/name or sqlite:////absolute/path.sqlite3."
    )


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": BASE_DIR / "db.sqlite3",
            # Writers queue for the lock instead of failing with "database is locked"
            # (see the django_dbworker.W001 check).
            "OPTIONS": {"transaction_mode": "IMMEDIATE"},
        }
    }

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
MEDIA_URL = "media/"
MEDIA_ROOT = os.environ.get("MEDIA_ROOT") or BASE_DIR / "media"

# Enqueued tasks (images/tasks.py) are stored in the database and run by runworkers too.
TASKS = {"default": {"BACKEND": "django_dbworker.backend.DBWorkerBackend"}}

# Mail is printed by the process that sends it: runworkers, for the tasks.
EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"
DEFAULT_FROM_EMAIL = "images@example.com"
IMAGES_NOTIFY_EMAIL = "admin@example.com"  # who gets duplicate notices and the digest

# Every key is optional; these are small values so the demo moves briskly.
DBWORKER = {
    "POLL_INTERVAL": 0.2,
    "SWEEP_INTERVAL": 5.0,
}

# Django logs every task start and finish at INFO; the demo shows its own progress instead.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "loggers": {"django.tasks": {"level": "WARNING"}},
}
