"""Connections our processes rely on: set-up, liveness, and the transaction check of a
transactional handler. What differs between databases is asked of their engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.models import DateTimeField
from django.db.models.expressions import RawSQL

from .. import conf
from . import engine_for

#: No value given (None means something: the connection open now).
UNSET: Any = object()


def on_connection_created(sender: Any, connection: BaseDatabaseWrapper, **kwargs: Any) -> None:
    """What every new connection to our database needs (``connection_created``)."""
    if connection.alias == conf.get().DATABASE:
        # When this session began (``time.monotonic()``, shared by a supervisor and its
        # children): whether the supervisor's session lived through a child's that ended.
        connection._dbworker_opened_at = time.monotonic()  # type: ignore[attr-defined]
        engine_for(connection).on_connection_created(connection)


def know_features(using: str) -> None:
    """Answer Django's feature probes that would otherwise touch the database."""
    connection = connections[using]
    engine_for(connection).know_features(connection)


def own_process(using: str, *, runs_units: bool = False) -> None:
    """Set up ``using``'s connection in one of our own processes (``Engine.own_process``)."""
    connection = connections[using]
    if runs_units:
        # A child forked from its supervisor: the supervisor's bound on lock waits (on
        # SQLite, its loop's) is not the child's, whose records wait their full time.
        connection.__dict__.pop("_dbworker_lock_wait", None)
    engine_for(connection).own_process(connection, runs_units=runs_units)


def connected(using: str, raw: Any = None) -> bool:
    """Whether ``using``'s connection is open and answers (and, given ``raw``, is still
    the DB-API connection ``raw``: leaving ``transaction.atomic()`` after a lost
    connection makes Django open a new one at once). False tells an outage (a lost
    connection, a restarted server) from a database error caused by one unit's value."""
    connection = connections[using]
    try:
        return (connection.connection is not None
                and (raw is None or connection.connection is raw)
                and connection.is_usable())
    except DatabaseError:
        return False


def opened_at(using: str) -> float | None:
    """When this thread's session to ``using`` began (``time.monotonic()``, comparable
    between a supervisor and its children), if one was opened here (``connection_created``)."""
    return getattr(connections[using], "_dbworker_opened_at", None)


def bound_lock_waits(using: str, seconds: float) -> None:
    """This thread's connection to ``using`` waits at most ``seconds`` for a lock
    (``Engine.bound_lock_waits``)."""
    connection = connections[using]
    engine_for(connection).bound_lock_waits(connection, seconds)


def lock_wait_scope(using: str) -> Any:
    """What statements of this thread's connection to ``using`` bounded by
    ``bound_lock_waits`` run inside (``Engine.lock_wait_scope``): a context manager."""
    connection = connections[using]
    return engine_for(connection).lock_wait_scope(connection)


class TransactionCheck:
    """Was the transaction of a transactional handler ended behind our back?

    A handler that sends COMMIT or ROLLBACK through a cursor ends the transaction Django
    opened; what it wrote before is committed without the unit's status. We compare a
    marker of the transaction (``Engine.transaction_marker``) taken before the handler runs
    with one taken after, without round trips of their own where the engine can:

    - where the engine has ``marker_sql`` (PostgreSQL: the transaction's start time), it is
      selected with the source row (``annotations``) and returned by the fenced completion
      UPDATE. After a COMMIT through a cursor, psycopg opens a new transaction for that
      UPDATE, so a mismatch found after it is rolled back with everything else.
    - elsewhere (SQLite: whether a transaction is open; MariaDB/MySQL: a savepoint set at
      the start, released before the completion) it is read before the completion UPDATE
      (after a COMMIT, that UPDATE would run and commit on its own).
    """

    #: The annotation carrying the marker on the source row; removed before the handler runs.
    NAME = "_dbworker_transaction"

    def __init__(self, using: str) -> None:
        self.using = using
        self.engine = engine_for(connections[using])
        self.begun: Any = None

    def annotations(self) -> dict[str, Any]:
        """What to select with the source row (``QuerySet.annotate``)."""
        sql = self.engine.marker_sql
        if sql is None:
            return {}
        return {self.NAME: RawSQL(sql, (), output_field=DateTimeField())}

    def begin(self, instance: Any) -> None:
        """Take the marker at the start (from the annotated row where there is one)."""
        if self.NAME in vars(instance):
            self.begun = vars(instance).pop(self.NAME)
        else:
            self.begun = self.engine.mark_transaction(connections[self.using])

    def unchanged(self, marker: Any = UNSET) -> bool:
        """Whether the transaction is still the one begun; ``marker``: as the completion
        UPDATE returned it, else it is read now."""
        if marker is UNSET:
            marker = self.engine.transaction_marker(connections[self.using])
        return marker == self.begun


@contextmanager
def index_first(using: str, ordered: bool = False) -> Iterator[None]:
    """The block's statements in a transaction whose planner reads by index where one
    serves (the engine's ``prefer_index_scans``; PostgreSQL: sequential scans off, and
    bitmap scans too when ``ordered``: a read in the index's order), put back at its end
    when the block runs inside a request's transaction (ATOMIC_REQUESTS: ``SET LOCAL``
    would outlive it). Where the engine cannot steer its planner, the block runs as it is:
    no transaction (SQLite's would take the write lock for a read)."""
    connection = connections[using]
    engine = engine_for(connection)
    if not engine.steers_planner:
        yield
        return
    nested = connection.in_atomic_block
    with transaction.atomic(using=using), connection.cursor() as cursor:
        engine.prefer_index_scans(cursor, ordered=ordered)
        yield
        if nested:
            engine.prefer_index_scans(cursor, False, ordered=ordered)
