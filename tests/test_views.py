"""The health and metrics views with the database unreachable: anonymous responses name
the failing component, never its address; the driver's message goes to the log."""

from __future__ import annotations

import logging
import socket
import warnings
from collections.abc import Iterator

import pytest
from django.db import connections
from django.db.utils import load_backend
from django.urls import reverse

ALIAS = "guard_unreachable"
SECRET_DB = "guard_secret_dbname"
SECRET_USER = "guard_secret_user"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def unreachable_settings(engine: str, port: int, tmp_path) -> dict:
    if engine == "postgresql":
        return {"ENGINE": "django.db.backends.postgresql", "NAME": SECRET_DB,
                "USER": SECRET_USER, "HOST": "127.0.0.1", "PORT": str(port),
                "OPTIONS": {"connect_timeout": 3}}
    return {"ENGINE": "django.db.backends.sqlite3",
            "NAME": str(tmp_path / "guard_missing_dir" / f"{SECRET_DB}.sqlite3")}


@pytest.fixture(params=["postgresql", "sqlite3"])
def unreachable(request, settings, tmp_path) -> Iterator[dict]:
    """DBWORKER['DATABASE'] is a database that does not answer (a real driver error)."""
    port = free_port()
    db = unreachable_settings(request.param, port, tmp_path)
    configured = connections.configure_settings({"default": {}, ALIAS: dict(db)})[ALIAS]
    # A connection made here, not one of settings.DATABASES (the test case refuses those
    # it was not told about): Django allows dynamically created connections.
    connections[ALIAS] = load_backend(db["ENGINE"]).DatabaseWrapper(configured, ALIAS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding setting DATABASES can lead to ..."
        settings.DATABASES = {**settings.DATABASES, ALIAS: db}
    settings.DBWORKER = {**settings.DBWORKER, "DATABASE": ALIAS}
    yield {"port": str(port), "engine": request.param}
    connections[ALIAS].close()
    del connections[ALIAS]


def assert_nothing_told(text: str, info: dict) -> None:
    for secret in (SECRET_DB, SECRET_USER, "127.0.0.1", info["port"], "guard_missing_dir",
                   "connection", "Connection refused", "unable to open"):
        assert secret not in text, (secret, text)


@pytest.mark.django_db
def test_health_names_the_failing_database_not_its_address(client, unreachable, caplog):
    with caplog.at_level(logging.ERROR, logger="django_dbworker"):
        response = client.get(reverse("django_dbworker:health"))
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable" and body["failing"] == ["database"]
    assert body["healthy"] is False
    assert_nothing_told(response.content.decode(), unreachable)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "health_database_error" in logged and f"database={ALIAS}" in logged
    if unreachable["engine"] == "postgresql":
        assert "127.0.0.1" in logged and unreachable["port"] in logged, logged
    else:
        assert "unable to open database file" in logged, logged


@pytest.mark.django_db
def test_metrics_answers_503_with_a_short_text_when_the_database_is_down(
        client, unreachable, caplog):
    with caplog.at_level(logging.ERROR, logger="django_dbworker"):
        response = client.get(reverse("django_dbworker:metrics"))
    assert response.status_code == 503
    assert response["Content-Type"].startswith("text/plain")
    text = response.content.decode()
    assert text == "database unavailable (see the django_dbworker log)\n"
    assert_nothing_told(text, unreachable)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "metrics_database_error" in logged
    if unreachable["engine"] == "postgresql":
        assert unreachable["port"] in logged, logged


@pytest.mark.django_db
def test_staff_see_no_more_than_anonymous_users(admin_client, unreachable):
    response = admin_client.get(reverse("django_dbworker:health"))
    assert response.status_code == 503
    assert_nothing_told(response.content.decode(), unreachable)


@pytest.mark.django_db
def test_a_healthy_answer_says_ok(client):
    from tests.test_operating import beating

    beating()
    response = client.get(reverse("django_dbworker:health"))
    assert response.status_code == 200
    assert response.json()["status"] == "ok"
