"""What holds the database's cleanup back (issue 39, ``insight/horizon.py``): another
connection's transaction left open is named by the health view (a warning past
``HEALTH_MAX_TRANSACTION_AGE``, not a 503), and the metrics carry its age, the dead rows
of the units' tables (PostgreSQL) and InnoDB's history list length (MariaDB).

The holder is a real second connection with an open snapshot; the tests wait for the
database to report it (its age passes the limit), never for a time of their own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings
from django.urls import reverse
from prometheus_client.parser import text_string_to_metric_families

from django_dbworker import conf
from django_dbworker.insight import health, horizon
from tests.conftest import wait_for as wait_quickly

pytestmark = pytest.mark.django_db(transaction=True)

HOLDER = "dbw-horizon-holder"


def wait_for(predicate: Any, timeout: float = 60, what: str = "") -> Any:
    """``conftest.wait_for``, polling every 0.3 s: MariaDB refreshes what
    ``information_schema.INNODB_TRX`` shows only when it was not read in the last 100 ms,
    so a faster poll would see the transactions of its first read forever (CI saw the
    holder stay after its ROLLBACK for 30 s)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value if value else wait_quickly(predicate, timeout=0, what=what)
        time.sleep(0.3)


@pytest.fixture
def holder() -> Iterator[Any]:
    """A second connection inside a transaction that holds a snapshot (PostgreSQL:
    REPEATABLE READ after its first statement; InnoDB: a consistent snapshot)."""
    params = dict(connection.get_connection_params())
    if connection.vendor == "postgresql":
        params["application_name"] = HOLDER
    raw = connection.get_new_connection(params)
    cursor = raw.cursor()
    if connection.vendor == "postgresql":
        cursor.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        cursor.execute("SELECT 1")
    elif connection.vendor == "mysql":
        cursor.execute("START TRANSACTION WITH CONSISTENT SNAPSHOT")
        cursor.execute("SELECT COUNT(*) FROM django_dbworker_execution")
    else:
        pytest.skip("SQLite keeps no other connection's snapshot visible to report")
    cursor.fetchall()
    yield raw
    raw.close()


def holder_id(raw: Any) -> int:
    if connection.vendor == "postgresql":
        return raw.info.backend_pid
    return raw.thread_id()


def warned() -> list[str]:
    return health.verdict()["warnings"]


def oldest_is(raw: Any) -> bool:
    """The holder is the oldest transaction reported. On PostgreSQL only this database's
    sessions count (VACUUM's horizon for its tables); InnoDB's purge waits for every
    transaction of the server, where other clients' may be older for a while (the shared
    server of a CI run): wait until ours is the oldest."""
    oldest = horizon.read()["oldest_transaction"]
    return oldest is not None and oldest["pid"] == holder_id(raw)


@override_settings(DBWORKER={"HEALTH_MAX_TRANSACTION_AGE": 0.2})
def test_an_open_transaction_is_named_by_a_warning(holder, client):
    wait_for(lambda: oldest_is(holder), timeout=120, what="the holder to be the oldest")
    (warning,) = wait_for(warned, what="the holder's transaction to pass 0.2 s")
    assert f"pid {holder_id(holder)}" in warning
    if connection.vendor == "postgresql":
        assert repr(HOLDER) in warning  # its application_name
    assert "HEALTH_MAX_TRANSACTION_AGE" in warning and "docs/operating.md" in warning

    oldest = horizon.read()["oldest_transaction"]
    assert oldest["pid"] == holder_id(holder) and oldest["seconds"] > 0.2
    body = client.get(reverse("django_dbworker:health")).json()
    assert body["warnings"] and str(holder_id(holder)) in body["warnings"][0]
    assert body["database"]["oldest_transaction"]["pid"] == holder_id(holder)
    assert not any("transaction" in p for p in body["problems"]), "a warning, not a problem"

    holder.rollback()
    wait_for(lambda: not oldest_is(holder), what="the holder to be gone once it ended")


def test_no_warning_below_the_limit_or_without_one(holder):
    wait_for(lambda: oldest_is(holder), timeout=120, what="the holder to be the oldest")
    found = horizon.read()["oldest_transaction"]
    assert horizon.warnings({"oldest_transaction": found}, limit=found["seconds"] + 3600) == []
    with override_settings(DBWORKER={"HEALTH_MAX_TRANSACTION_AGE": None}):
        assert warned() == []


def test_the_metrics_carry_the_horizon(holder, client):
    wait_for(lambda: horizon.read()["oldest_transaction"], what="the holder to be seen")
    text = client.get(reverse("django_dbworker:metrics")).content.decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples[("dbworker_oldest_transaction_seconds", ())] > 0
    if connection.vendor == "postgresql":
        tables = {dict(labels)["table"] for name, labels in samples
                  if name == "dbworker_dead_rows"}
        assert tables == set(horizon.UNITS)
    else:
        assert samples[("dbworker_history_list_length", ())] >= 0


@pytest.mark.skipif(connection.vendor != "sqlite", reason="SQLite: nothing to report")
def test_sqlite_reports_no_horizon(client):
    assert horizon.read() == {"oldest_transaction": None, "dead_rows": None,
                              "history_length": None}
    body = client.get(reverse("django_dbworker:health")).json()
    assert body["warnings"] == []
    text = client.get(reverse("django_dbworker:metrics")).content.decode()
    assert "dbworker_oldest_transaction_seconds 0.0" in text


@pytest.mark.parametrize("value", [0, -1, "300", float("inf")])
def test_a_bad_limit_is_refused_naming_the_setting(value):
    with override_settings(DBWORKER={"HEALTH_MAX_TRANSACTION_AGE": value}), \
            pytest.raises(ImproperlyConfigured, match="HEALTH_MAX_TRANSACTION_AGE"):
        conf.get()


@override_settings(DBWORKER={"HEALTH_MAX_TRANSACTION_AGE": 0.2})
def test_the_dashboard_names_the_holder_and_warns(holder, admin_client):
    wait_for(lambda: oldest_is(holder), timeout=120, what="the holder to be the oldest")
    wait_for(warned, what="the holder's transaction to pass 0.2 s")
    page = admin_client.get(reverse("admin:django_dbworker_dashboard_changelist"))
    html = page.content.decode()
    assert page.status_code == 200
    assert "<h2>Database</h2>" in html and "Oldest open transaction" in html
    assert f"pid {holder_id(holder)}" in html
    assert "dbw-horizon-warning" in html and "HEALTH_MAX_TRANSACTION_AGE" in html
    if connection.vendor == "postgresql":
        assert HOLDER in html and "Dead rows" in html
    else:
        assert "InnoDB history list length" in html
    holder.rollback()


def test_the_dashboard_says_when_nothing_holds_the_horizon(admin_client, vendor):
    html = admin_client.get(reverse("admin:django_dbworker_dashboard_changelist")) \
        .content.decode()
    assert "<h2>Database</h2>" in html and "dbw-horizon-warning" not in html
    if vendor == "sqlite":
        assert "No other connection holds a transaction open" in html
