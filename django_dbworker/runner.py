"""Run one claimed unit in this process, then record what happened.

Running (calling the handler) and recording (the guarded state change) are separate: the
handler's return value or exception is turned into a ``Result``, and only ``claims.store``
writes the execution.
"""

from __future__ import annotations

import logging
import time
import traceback as tb
from dataclasses import dataclass
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.transaction import TransactionManagementError

from . import conf, keys, progress
from .claims import pending, store
from .claims.store import Claim, FailureInfo
from .context import Context
from .exceptions import HandlerTransactionError, InvalidOutcome, LeaseLost
from .logs import log_event
from .outcomes import Finished, Unfinished
from .registry import Worker, workers

logger = logging.getLogger("django_dbworker")

FINISHED, UNFINISHED, FAILED, LOST, GONE = "finished", "unfinished", "failed", "lease_lost", "gone"


@dataclass(frozen=True, slots=True)
class Result:
    unit_id: int | str
    worker: str
    outcome: str
    seconds: float
    error: str = ""


class _SourceGone(Exception):
    pass


def run(c: Claim) -> Result:
    """Run the handler for ``c`` and record its outcome; never raises for handler errors."""
    started = time.monotonic()
    worker = workers[c.worker]
    token = pending.running.set(pending.Running(c.execution_id, c.worker, c.source_key))
    unit = progress.current.set(progress.Unit("execution", str(c.execution_id)))
    try:
        if worker.transactional:
            outcome = _run_in_transaction(worker, c)
        else:
            outcome = _run_then_record(worker, c)
    except LeaseLost as exc:
        return _result(c, LOST, started, str(exc), level=logging.WARNING)
    except _SourceGone:
        store.forget(c)
        return _result(c, GONE, started, "source row deleted", level=logging.INFO)
    except (OperationalError, InterfaceError) as exc:
        if _connection_broken(exc):
            raise  # the database is unreachable: the caller reconnects; the lease expires
        return _record_failure(c, exc, started)
    except BaseException as exc:
        return _record_failure(c, exc, started)
    finally:
        pending.running.reset(token)
        progress.current.reset(unit)
    return _result(c, outcome, started)


def _context(worker: Worker, c: Claim) -> Context:
    return Context(
        worker=worker.name,
        execution_id=c.execution_id,
        source_id=keys.from_key(worker.source, c.source_key),
        attempt=c.attempt,
        lease_expires_at=c.lease_expires_at,
    )


def _call(worker: Worker, c: Claim, using: str) -> Finished | Unfinished:
    context = _context(worker, c)
    try:
        source = worker.source._default_manager.using(using).get(pk=context.source_id)
    except worker.source.DoesNotExist:
        raise _SourceGone from None
    try:
        outcome = worker(source, context) if worker.takes_context else worker(source)
    except TransactionManagementError as exc:
        raise HandlerTransactionError(
            f"worker {worker.name!r} tried to manage the transaction itself ({exc}). "
            "Transactional workers must not commit, roll back or close the connection; "
            "declare the worker with transactional=False to manage transactions yourself."
        ) from exc
    if not isinstance(outcome, Finished | Unfinished):
        raise InvalidOutcome(
            f"worker {worker.name!r} returned {outcome!r} ({type(outcome).__name__}); a "
            "handler must return Finished() or Unfinished()."
        )
    return outcome


def _run_in_transaction(worker: Worker, c: Claim) -> str:
    using = conf.get().DATABASE
    connection = connections[using]
    with transaction.atomic(using=using):
        marker = _marker(using)
        outcome = _call(worker, c, using)
        if connection.closed_in_transaction or connection.connection is None:
            raise HandlerTransactionError(
                f"worker {worker.name!r} closed the database connection inside its "
                "transaction; its writes are lost. Do not close the connection in a "
                "transactional worker."
            )
        if _marker(using) != marker:
            raise HandlerTransactionError(
                f"worker {worker.name!r} ended the transaction itself (COMMIT or ROLLBACK "
                "through a cursor); writes before that point were committed without the "
                "status. Use transactional=False to manage transactions yourself."
            )
        return _record(worker, c, outcome)


def _record(worker: Worker, c: Claim, outcome: Finished | Unfinished) -> str:
    """Write the outcome, guarded by the claim's token; raise LeaseLost if it is not ours."""
    current = pending.running.get()
    if current is not None and current.deleted:
        if not store.forget(c):
            raise LeaseLost(_lost(worker, c))
        return GONE
    if not store.complete(c, outcome):
        raise LeaseLost(_lost(worker, c))
    pending.add_siblings(worker, c.source_key, conf.get().DATABASE)
    return FINISHED if isinstance(outcome, Finished) else UNFINISHED


def _run_then_record(worker: Worker, c: Claim) -> str:
    using = conf.get().DATABASE
    outcome = _call(worker, c, using)
    with transaction.atomic(using=using):
        return _record(worker, c, outcome)


def _marker(using: str) -> Any:
    from .db import transaction_marker

    return transaction_marker(using)


def _lost(worker: Worker, c: Claim) -> str:
    return (
        f"worker {worker.name!r} lost the claim on execution {c.execution_id} (attempt "
        f"{c.attempt}): another process took the unit over after the lease expired; "
        "this attempt's writes were rolled back"
    )


def _connection_broken(exc: BaseException) -> bool:
    connection = connections[conf.get().DATABASE]
    try:
        return connection.connection is None or not connection.is_usable()
    except DatabaseError:
        return True


def _record_failure(c: Claim, exc: BaseException, started: float) -> Result:
    using = conf.get().DATABASE
    connection = connections[using]
    if connection.connection is not None and not connection.in_atomic_block:
        try:
            connection.is_usable() or connection.close()
        except DatabaseError:
            connection.close()
    info = FailureInfo.of(exc, "".join(tb.format_exception(exc)))
    worker = workers[c.worker]
    with transaction.atomic(using=using):
        if not store.fail(c, info):
            return _result(c, LOST, started, _lost(worker, c), level=logging.WARNING)
        pending.add_siblings(worker, c.source_key, using)
    return _result(c, FAILED, started, f"{info.exception_class}: {info.message}",
                   level=logging.ERROR)


def _result(c: Claim, outcome: str, started: float, error: str = "",
            level: int = logging.INFO) -> Result:
    seconds = time.monotonic() - started
    log_event(level, outcome, worker=c.worker, execution=c.execution_id,
              source=c.source_key, attempt=c.attempt, seconds=round(seconds, 4), error=error)
    return Result(c.execution_id, c.worker, outcome, seconds, error)
