"""Run one claimed unit in this process, then record what happened.

Running (calling the handler) and recording (the guarded state change) are separate: the
handler's return value or exception is turned into a ``Result``, and only ``rows.store``
writes the execution.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connections, transaction
from django.db.transaction import TransactionManagementError
from django.utils import timezone

from .. import conf, signals
from ..context import Context
from ..db import TransactionEnded, engine, errors, keys, sources
from ..db.connections import TransactionCheck
from ..exceptions import HandlerTransactionError, InvalidOutcome, LeaseLost
from ..logs import log_event
from ..outcomes import Finished, Result, RunOutcome, Snooze, Unfinished
from ..tasks import retry
from ..units import aio, progress
from ..units.failures import FailureInfo, recording
from . import chain, pending, released, store
from .registry import Worker, workers
from .store import Claim

logger = logging.getLogger("django_dbworker")

FINISHED, UNFINISHED, FAILED = RunOutcome.FINISHED, RunOutcome.UNFINISHED, RunOutcome.FAILED
RETRYING = RunOutcome.RETRYING
LOST, GONE = RunOutcome.LEASE_LOST, RunOutcome.GONE


class _SourceGone(Exception):
    pass


def run(c: Claim) -> Result:
    """Run the handler for ``c`` and record its outcome; never raises for handler errors."""
    started = time.monotonic()
    worker = workers[c.worker]
    carried = chain.carried_for(c, conf.get().DATABASE)  # begun with the last completion
    raw = _raw_connection()
    token = pending.running.set(pending.Running(c.execution_id, c.worker, c.source_key))
    unit = progress.current.set(progress.Unit("execution", str(c.execution_id)))
    _signal(signals.execution_started, worker, c)
    try:
        try:
            if worker.transactional:
                outcome = _run_in_transaction(worker, c, carried)
            else:
                outcome = _run_then_record(worker, c)
        except Snooze as exc:
            outcome = _snoozed(worker, c, exc)
    except LeaseLost as exc:
        return _lost_or_gone(worker, c, started, str(exc))
    except _SourceGone:
        store.forget(c)
        return _result(c, GONE, started, "source row deleted", level=logging.INFO)
    except (OperationalError, InterfaceError) as exc:
        if errors.gone(exc, raw=raw):
            raise  # the database is unreachable: the caller reconnects; the lease expires
        if _transient(exc):
            raise  # a deadlock rolled it all back: not the unit's fault; it goes back
        return _record_failure(c, exc, started)
    except BaseException as exc:
        if engine().session_lost(exc) or errors.gone(exc):
            raise  # not the unit's fault: the caller opens a new session; the unit goes back
        return _record_failure(c, exc, started)
    finally:
        pending.running.reset(token)
        progress.current.reset(unit)
    if outcome in (FINISHED, UNFINISHED):
        _signal(signals.execution_finished, worker, c, outcome=outcome)
    return _result(c, outcome, started)


def _signal(signal: Any, worker: Worker, c: Claim, **kwargs: Any) -> None:
    signals.send(signal, worker, execution_id=c.execution_id,
                 source_id=keys.from_key(worker.source, c.source_key), attempt=c.attempt,
                 **kwargs)


def _transient(exc: BaseException) -> bool:
    """A deadlock or lock wait timeout that the engine says may simply run again
    (MariaDB/MySQL: ``db.mysql.RETRYABLE``); the child gives the unit back."""
    return engine().transient(exc)


def _context(worker: Worker, c: Claim) -> Context:
    return Context(
        worker=worker.name,
        execution_id=c.execution_id,
        source_id=keys.from_key(worker.source, c.source_key),
        attempt=c.attempt,
        lease_expires_at=c.lease_expires_at,
    )


def _source(worker: Worker, c: Claim, using: str, check: TransactionCheck | None = None,
            carried: chain.Carried | None = None) -> Any:
    """The unit's source row; with ``check`` (in the transaction of a transactional
    handler, as its first statement), its transaction marker is read alongside. With
    ``carried``, both were read when the previous unit's completion began the transaction
    (``rows.chain``)."""
    if carried is not None:
        source = carried.reader.instance(worker.source, carried.begin.rows or [], using)
        if source is None:
            raise _SourceGone
        if check is not None:
            check.begin(source)
        return source
    extra = check.annotations() if check is not None else None
    try:
        source = sources.get(worker.source, keys.from_key(worker.source, c.source_key), using,
                             extra, first=check is not None)
    except sources.does_not_exist(worker.source):
        raise _SourceGone from None
    if check is not None:
        check.begin(source)
    return source


def _call(worker: Worker, c: Claim, source: Any) -> Finished | Unfinished:
    context = _context(worker, c)
    try:
        outcome = worker(source, context) if worker.takes_context else worker(source)
        outcome = aio.resolve(outcome)  # an async def handler's coroutine
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


def _run_in_transaction(worker: Worker, c: Claim,
                        carried: chain.Carried | None = None) -> RunOutcome:
    using = conf.get().DATABASE
    connection = connections[using]
    check = TransactionCheck(using)
    atomic = chain.UnitAtomic(using, carried)
    with atomic:
        source = _source(worker, c, using, check, atomic.carried)
        token = released.point.set(released.Point(using, check,
                                                  len(connection.atomic_blocks)))
        try:
            outcome = _call(worker, c, source)
        finally:
            released.point.reset(token)
        if connection.closed_in_transaction or connection.connection is None:
            raise HandlerTransactionError(
                f"worker {worker.name!r} closed the database connection inside its "
                "transaction; its writes are lost. Do not close the connection in a "
                "transactional worker."
            )
        return _record(worker, c, outcome, check, atomic)


def _snoozed(worker: Worker, c: Claim, exc: Snooze) -> RunOutcome:
    """The handler raised ``Snooze``: recorded as ``Unfinished(delay=...)``, in a
    transaction of its own (a transactional handler's writes rolled back with the raise)."""
    with transaction.atomic(using=conf.get().DATABASE):
        return _record(worker, c, Unfinished(delay=exc.seconds))


def _ended_itself(worker: Worker) -> HandlerTransactionError:
    return HandlerTransactionError(
        f"worker {worker.name!r} ended the transaction itself (COMMIT or ROLLBACK "
        "through a cursor); writes before that point were committed without the "
        "status. Use transactional=False to manage transactions yourself."
    )


def _record(worker: Worker, c: Claim, outcome: Finished | Unfinished,
            check: TransactionCheck | None = None,
            atomic: chain.UnitAtomic | None = None) -> RunOutcome:
    """Have the store write the outcome (``store.record``, guarded by the claim's token);
    raise LeaseLost if the claim is not ours, HandlerTransactionError if a transactional
    handler (``check``) ended its transaction itself. A final completion in the unit's
    ``atomic`` may begin the next unit's transaction (``rows.chain``)."""
    final = _final(worker, check)
    try:
        current = pending.running.get()
        if current is not None and current.deleted:
            if not store.forget_checked(c, check):
                raise LeaseLost(_lost(worker, c))
            return GONE
        using = conf.get().DATABASE
        plan = chain.begin_next(worker, using) if final and atomic is not None else None
        begin = plan[0] if plan is not None else None
        if not store.record(c, outcome, check, final=final, then=begin):
            raise LeaseLost(_lost(worker, c))
        if plan is not None and atomic is not None and chain.carry(plan[0], plan[1], using):
            atomic.chained = True
    except TransactionEnded:
        raise _ended_itself(worker) from None
    if not final:  # else there are none
        pending.add_siblings(worker, c.source_key, conf.get().DATABASE)
    return FINISHED if isinstance(outcome, Finished) else UNFINISHED


def _final(worker: Worker, check: TransactionCheck | None) -> bool:
    """Whether the completion is the last statement of its transaction, which the store's
    engine may then COMMIT with it: a transactional handler's, the outermost transaction
    (not a savepoint, as under ``run_until_idle`` in a test's transaction), and nothing to
    write after it (no sibling workers to make the row pending for)."""
    if check is None or check.begun is None or not check.engine.commits_with_completion:
        return False
    connection = connections[check.using]
    return (len(connection.atomic_blocks) == 1 and connection.commit_on_exit
            and not connection.needs_rollback and not connection.savepoint_ids
            and not any(w.name != worker.name for w in workers.for_model(worker.source)))


def _run_then_record(worker: Worker, c: Claim) -> RunOutcome:
    """A handler that manages its own transactions (``transactional=False``), then its
    record. A record of one statement (no sibling worker to make the row pending for, the
    row not deleted by the handler) needs no transaction of its own: it autocommits, a
    round trip instead of three (BEGIN, the UPDATE, COMMIT)."""
    using = conf.get().DATABASE
    outcome = _call(worker, c, _source(worker, c, using))
    current = pending.running.get()
    alone = ((current is None or not current.deleted)
             and not any(w.name != worker.name for w in workers.for_model(worker.source)))
    if alone and not connections[using].in_atomic_block:
        return _record(worker, c, outcome)
    with transaction.atomic(using=using):
        return _record(worker, c, outcome)


def _lost(worker: Worker, c: Claim) -> str:
    return (
        f"worker {worker.name!r} lost the claim on execution {c.execution_id} (attempt "
        f"{c.attempt}): its lease expired (its supervisor could not renew it) or another "
        "process took the unit over after that; this attempt's writes were rolled back"
    )


def _lost_or_gone(worker: Worker, c: Claim, started: float, lost: str) -> Result:
    """A record that changed nothing: ``gone`` (INFO) when the source row was deleted while
    the handler ran, which removed its execution (a transactional handler's writes were
    rolled back with the record); else ``lease_lost`` (WARNING), the unit runs again."""
    if store.deleted_meanwhile(c, worker.source):
        return _result(c, GONE, started, "source row deleted while its handler ran; its "
                       "execution went with it", level=logging.INFO)
    return _result(c, LOST, started, lost, level=logging.WARNING)


def _raw_connection() -> Any:
    """The DB-API connection the unit starts on (opened now if needed)."""
    connection = connections[conf.get().DATABASE]
    connection.ensure_connection()
    return connection.connection


def _record_failure(c: Claim, exc: BaseException, started: float) -> Result:
    using = conf.get().DATABASE
    connection = connections[using]
    if connection.connection is not None and not connection.in_atomic_block:
        try:
            if not connection.is_usable():
                connection.close()
        except DatabaseError:
            connection.close()
    info = FailureInfo.caught(exc)
    worker = workers[c.worker]
    message = f"{info.exception_class}: {info.message}"
    if retry.should_retry(worker, c.attempt, exc):  # @worker(retries=...)
        at = retry.at(timezone.now(), retry.delay(worker, c.attempt))
        with recording("its failure"), transaction.atomic(using=using):
            recorded = store.retry_later(c, info, at)
            if recorded:
                pending.add_siblings(worker, c.source_key, using)
        if not recorded:
            return _lost_or_gone(worker, c, started, _lost(worker, c))
        _signal(signals.execution_failed, worker, c, error=_error(info), will_retry=True)
        return _result(c, RETRYING, started, message, level=logging.WARNING,
                       retry_at=at.isoformat())
    with recording("its failure"), transaction.atomic(using=using):
        recorded = store.fail(c, info)
        if recorded:
            pending.add_siblings(worker, c.source_key, using)
    if not recorded:
        return _lost_or_gone(worker, c, started, _lost(worker, c))
    _signal(signals.execution_failed, worker, c, error=_error(info), will_retry=False)
    return _result(c, FAILED, started, message, level=logging.ERROR)


def _error(info: FailureInfo) -> dict[str, str]:
    return {"exception_class": info.exception_class, "message": info.message,
            "traceback": info.traceback}


def _result(c: Claim, outcome: RunOutcome, started: float, error: str = "",
            level: int = logging.INFO, **extra: Any) -> Result:
    seconds = time.monotonic() - started
    log_event(level, outcome, worker=c.worker, execution=c.execution_id,
              source=c.source_key, attempt=c.attempt, seconds=round(seconds, 4), error=error,
              **extra)
    return Result(c.execution_id, c.worker, outcome, seconds, error)
