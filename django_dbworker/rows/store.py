"""Every change of an execution's state, each a guarded UPDATE that reports its row count.

The state machine, written down once::

    (none)      -> PENDING      a source row is saved, or the sweep finds it
    PENDING     -> WORKING      claim
    UNFINISHED  -> WORKING      claim (once available_at has passed)
    WORKING     -> FINISHED     complete with the claim's token
    WORKING     -> UNFINISHED   complete with the token (Unfinished), release, reap
    WORKING     -> FAILED       fail with the token; release or reap after MAX_CRASHES
    WORKING     -> PENDING      unclaim: claimed ahead, given back before it ran (the
    WORKING     -> UNFINISHED     attempt is taken back; PENDING if it was its first)
    FAILED      -> UNFINISHED   reset_failed (a person asks for another attempt)
    FINISHED    -> UNFINISHED   reprocess (a person asks to run a finished unit again)

A change whose guard does not match (wrong state, or a token that is no longer current)
changes nothing and returns 0: that is how a process learns it lost its lease. What a
child records (complete, fail) also needs its lease unexpired (``lease_live``): a
supervisor that cannot renew stops its children's commits once the lease is gone, before
any reaper took the unit back.
"""

from __future__ import annotations

import functools
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connections, transaction
from django.db.models import Case, F, Q, Value, When
from django.utils import timezone

from .. import conf
from ..db import TransactionEnded, compiled, engine, engine_for, keys
from ..db.engine import Begin, CompletionUncertain
from ..db.engine import Claim as EngineClaim
from ..models import Execution, Failure, State, Transition
from ..outcomes import Finished, Outcome, Unfinished
from ..units.claimant import Claimant
from ..units.failures import FailureInfo
from ..units.leases import Leases, lease_live, one_statement
from .queries import candidates
from .registry import Worker

#: The partial index the claim reads (``Execution.Meta.indexes``).
CLAIM_INDEX = "dbworker_execution_claimable"

#: The state machine as data: each change's guard (the states it starts from) and the
#: states it leads to (``Transition.to``); the table above, checked by tests/test_state_machine.py.
TRANSITIONS: dict[str, Transition] = {
    "claim": Transition({State.PENDING, State.UNFINISHED}, to={State.WORKING}),
    "complete": Transition({State.WORKING}, to={State.FINISHED, State.UNFINISHED}),
    "fail": Transition({State.WORKING}, to={State.FAILED}),
    "release": Transition({State.WORKING}, to={State.UNFINISHED, State.FAILED}),
    "reap": Transition({State.WORKING}, to={State.UNFINISHED, State.FAILED}),
    "unclaim": Transition({State.WORKING}, to={State.PENDING, State.UNFINISHED}),
    "reset_failed": Transition({State.FAILED}, to={State.UNFINISHED}),
    "reprocess": Transition({State.FAILED, State.FINISHED}, to={State.UNFINISHED}),
}


@dataclass(frozen=True, slots=True)
class Claim:
    """A claimed execution as its store knows it: what the fence and the records need
    (``rows.unit.RowUnit`` is the unit the supervisor runs)."""

    execution_id: int
    worker: str
    source_key: str
    token: uuid.UUID
    attempt: int
    lease_expires_at: datetime

    @property
    def unit_pk(self) -> int:
        return self.execution_id


def _alias() -> str:
    return conf.get().DATABASE


def _prep(name: str, value: Any, using: str) -> Any:
    return keys.column_field(Execution, name).get_db_prep_save(value, connections[using])


def claim_parts(
    worker: Worker,
    limit: int,
    claimant: Claimant,
    *,
    token: uuid.UUID,
    now: datetime,
    expires: datetime,
) -> EngineClaim:
    """The claim of up to ``limit`` units of ``worker``, as the engine runs it (``Engine.claim``):
    its candidate query (``SELECT ... FOR UPDATE SKIP LOCKED`` in eligible's order, compiled
    once per worker and claim size when its SQL cannot change: ``compiled``) and the state
    it writes."""
    using = _alias()
    connection = connections[using]

    def build(at: datetime) -> Any:
        inner = candidates(worker, at, using).values("id")[:limit]
        if connection.features.has_select_for_update_skip_locked:
            inner = inner.select_for_update(
                skip_locked=True,
                of=("self",) if connection.features.has_select_for_update_of else ())
        return inner

    inner_sql, inner_params = compiled.sql_with_now(
        ("execution", worker.name, limit), worker, build, now, using,
        cacheable=worker.static_eligible)
    field = functools.partial(keys.column_field, Execution)
    return EngineClaim(
        table=connection.ops.quote_name(Execution._meta.db_table),
        sets=("state = %s, token = %s, supervisor_id = %s, claimed_host = %s, "
              "claimed_pid = %s, attempts = attempts + 1, started_at = %s, "
              "finished_at = NULL, lease_expires_at = %s"),
        set_params=[
            State.WORKING,
            field("token").get_db_prep_save(token, connection),
            field("supervisor_id").get_db_prep_save(claimant.supervisor_id, connection),
            claimant.host,
            claimant.pid,
            field("started_at").get_db_prep_save(now, connection),
            field("lease_expires_at").get_db_prep_save(expires, connection),
        ],
        candidates=inner_sql,
        candidate_params=inner_params,
        returning="id, source_id, attempts",
        index=connection.ops.quote_name(CLAIM_INDEX),
    )


def claim_sql(
    worker: Worker,
    limit: int,
    claimant: Claimant,
    *,
    token: uuid.UUID,
    now: datetime,
    expires: datetime,
) -> tuple[str, list[Any]]:
    """The first statement of the claim and its parameters, without running it (``EXPLAIN``
    it in tests: it finds the candidates)."""
    parts = claim_parts(worker, limit, claimant, token=token, now=now, expires=expires)
    return engine().claim_statement(parts)


def claim(worker: Worker, limit: int, claimant: Claimant, lease: float) -> list[Claim]:
    """Claim up to ``limit`` units of ``worker``, in eligible's order; committed on return.
    The plain claim, one statement: a worker with a ``concurrency_limit`` is claimed by
    ``concurrency.claim`` (``planner.claim`` chooses)."""
    assert getattr(worker, "concurrency_limit", None) is None, "rows.planner.claim"
    using = _alias()
    now = timezone.now()
    expires = now + timedelta(seconds=lease)
    token = uuid.uuid4()
    parts = claim_parts(worker, limit, claimant, token=token, now=now, expires=expires)
    with one_statement(using), connections[using].cursor() as cursor:
        rows = engine(using).claim(cursor, parts)
    return [Claim(row[0], worker.name, row[1], token, row[2], expires) for row in rows]


def _fenced(c: Claim, using: str) -> Any:
    return EXECUTIONS.fenced(c, using)


def _live(c: Claim, using: str, now: datetime) -> Any:
    qs = _fenced(c, using)
    return qs.filter(lease_expires_at__gt=now) if lease_live(using) else qs


def _completion(c: Claim, outcome: Outcome, connection: Any,
                ) -> tuple[str, list[Any], datetime]:
    """``complete``'s guarded UPDATE as SQL: it runs once per unit, so it is written out
    rather than built with the ORM (the same guard as ``_live``). What is the same for
    every unit (the states, NULLs, zero) is written into the statement; the parameters
    are the unit's and the time's."""
    now = timezone.now()
    finished = isinstance(outcome, Finished)
    live = lease_live(connection.alias)
    tail = engine_for(connection).completion_tail(connection)
    key = (connection.alias, connection.settings_dict["ENGINE"], live, finished, tail)
    sql = _completion_sql.get(key)
    if sql is None:
        sql = _completion_sql[key] = _completion_statement(connection, live, finished) + tail
    field = functools.partial(keys.column_field, Execution)
    at = field("finished_at").get_db_prep_save(now, connection)  # once: two columns use it
    params = [at]
    if not finished:
        assert isinstance(outcome, Unfinished)
        later = now + timedelta(seconds=outcome.seconds)
        params.insert(0, field("available_at").get_db_prep_save(later, connection))
    (from_state,) = TRANSITIONS["complete"]
    params += [c.execution_id, field("token").get_db_prep_save(c.token, connection), from_state]
    if live:
        params.append(at)
    return sql, params, now


def _completion_statement(connection: Any, live: bool, finished: bool) -> str:
    """The UPDATE of ``_completion``; its parameters: [available_at], finished_at, id,
    token, the state it completes from[, now]. That state is a parameter, not written in:
    a plan made once for every unit (a prepared statement's) could then be proven to fit
    the partial index of WORKING units, and read it by lease instead of the primary key."""
    quote = connection.ops.quote_name

    def column(name: str) -> str:
        return quote(keys.column_name(Execution, name))

    def state(value: str) -> str:
        if not value.isalpha():  # only our State names come here
            raise ValueError(f"not a state name: {value!r}")
        return f"'{value}'"

    to = State.FINISHED if finished else State.UNFINISHED
    sets = [f"{column('state')} = {state(to)}", f"{column('token')} = NULL",
            f"{column('lease_expires_at')} = NULL"]
    if not finished:
        sets += [f"{column('available_at')} = %s", f"{column('crashes')} = 0"]
    sets.append(f"{column('finished_at')} = %s")
    return (
        f"UPDATE {quote(Execution._meta.db_table)} SET {', '.join(sets)} "
        "WHERE id = %s AND token = %s AND state = %s"
        + (" AND lease_expires_at > %s" if live else "")
    )


_completion_sql: dict[tuple[str, str, bool, bool, str], str] = {}


def complete(c: Claim, outcome: Outcome) -> int:
    """Write the handler's outcome, only while ``c`` is still the current claim and its
    lease has not expired; the rows changed (0 or 1)."""
    return record(c, outcome)


def record(c: Claim, outcome: Outcome, check: Any = None, *, final: bool = False,
           then: Begin | None = None) -> int:
    """Write ``outcome`` for ``c``, fenced by its token (and lease): the rows changed (0:
    the claim is no longer current). Which statement does it is the engine's business
    (``Engine.complete``).

    ``check``: the ``TransactionCheck`` of a transactional handler; ``TransactionEnded``
    is raised if the handler ended its transaction. ``final``: the completion is the last
    statement of the outermost transaction, so the engine may COMMIT with it (then 1 means
    committed). ``then``: the next unit's transaction, begun in the same query where the
    engine can (``rows/chain.py``); if that query fails where the engine cannot tell
    whether the completion committed, the execution row tells (``_landed``).
    """
    connection = connections[_alias()]
    sql, params, now = _completion(c, outcome, connection)
    try:
        return engine_for(connection).complete(connection, sql, params, check=check,
                                               final=final, then=then)
    except CompletionUncertain as exc:
        if _landed(c, now, connection.alias):
            return 1  # committed; the error was the next unit's, which did not begin
        raise exc.error from exc.error.__cause__  # its cause: what the database said


def _landed(c: Claim, now: datetime, using: str) -> bool:
    """Whether the completion of ``c`` written at ``now`` committed: the row's token is
    gone and its ``finished_at`` is that completion's (a token is never reused)."""
    return Execution.objects.using(using).filter(
        id=c.execution_id, token__isnull=True, finished_at=now).exists()


def forget_checked(c: Claim, check: Any = None) -> int:
    """``forget``, after making sure a transactional handler's transaction (``check``) is
    still the one begun (``TransactionEnded`` if not)."""
    if check is not None and not check.unchanged():
        raise TransactionEnded
    return forget(c)


def fail(c: Claim, failure: FailureInfo) -> int:
    """Record a failed attempt and mark the execution FAILED (fenced by the token and the
    lease)."""
    return _failed_attempt(c, failure, state=State.FAILED, finished_at=timezone.now())


def retry_later(c: Claim, failure: FailureInfo, at: datetime) -> int:
    """Record a failed attempt of a worker with retries left: UNFINISHED until ``at``
    (its next claim), the failure kept with the others (fenced as ``fail``)."""
    return _failed_attempt(c, failure, state=State.UNFINISHED, available_at=at)


def _failed_attempt(c: Claim, failure: FailureInfo, **changes: Any) -> int:
    """The claim ends (fenced by its token and lease) with ``changes``, and the attempt's
    failure is kept, in one transaction."""
    using = _alias()
    now = timezone.now()
    with transaction.atomic(using=using):
        changed = _live(c, using, now).update(token=None, lease_expires_at=None, **changes)
        if changed:
            _record(c.execution_id, c.attempt, failure, now, using)
    return changed


def forget(c: Claim) -> int:
    """Remove the execution of a unit whose source row is gone (fenced by the token)."""
    return _fenced(c, _alias()).delete()[0]


def deleted_meanwhile(c: Claim, source: Any) -> bool:
    """Whether ``c``'s execution and its source row (of the model ``source``) are both
    gone: the row was deleted while its unit ran (a delete through Django removes the row's
    executions with it, ``pending.on_delete``), so a record that changed nothing lost no
    lease. Read outside the unit's transaction, after its rollback."""
    using = _alias()
    if Execution.objects.using(using).filter(pk=c.execution_id).exists():
        return False
    pk = keys.from_key(source, c.source_key)
    return not source._base_manager.using(using).filter(pk=pk).exists()


def _record(execution_id: int, attempt: int, failure: FailureInfo, now: datetime,
            using: str) -> None:
    Failure.objects.using(using).create(
        execution_id=execution_id,
        attempt=attempt,
        exception_class=failure.exception_class,
        message=failure.message,
        traceback=failure.traceback,
        occurred_at=now,
    )


class Executions(Leases):
    """The executions' table of leased units (the kind ``execution``)."""

    name = "execution"
    model = Execution
    status = "state"
    held_status = State.WORKING
    back_status = State.UNFINISHED

    def held(self, using: str) -> Any:
        assert TRANSITIONS["reap"] == {State.WORKING}  # the index of ``working()``
        return Execution.objects.using(using).working()

    def claim_of(self, pk: Any, attempt: int, token: uuid.UUID, now: datetime) -> Claim:
        return Claim(pk, "", "", token, attempt, now)

    def crashed_too_often(self, c: Any, fenced: Any, info: FailureInfo, now: datetime,
                          back: dict[str, Any]) -> int:
        failed = fenced.update(state=State.FAILED, crashes=F("crashes") + 1, finished_at=now,
                               **back)
        if failed:
            _record(c.unit_pk, c.attempt, info, now, fenced.db)
        return int(failed)

    def unclaimed(self, using: str, first: Q) -> dict[str, Any]:
        """Back to where the claim took it from: PENDING if this was to be its first
        attempt, else UNFINISHED."""
        return {"state": Case(When(first, then=Value(State.PENDING)),
                              default=Value(State.UNFINISHED))}


#: The executions' lease life cycle (``units.leases``), and its roads by name.
EXECUTIONS = Executions()
release = EXECUTIONS.release
unclaim = EXECUTIONS.unclaim
renew = EXECUTIONS.renew
expired = EXECUTIONS.expired
reap = EXECUTIONS.reap
held_by = EXECUTIONS.held_by
reap_held = EXECUTIONS.reap_held
release_untracked = EXECUTIONS.release_untracked


def reset_failed(worker: Worker, pk: Any) -> bool:
    using = _alias()
    return bool(
        Execution.objects.using(using)
        .filter(
            worker=worker.name,
            source_id=keys.to_key(worker.source, pk, using),
            state__in=TRANSITIONS["reset_failed"],
        )
        .update(state=State.UNFINISHED, crashes=0, available_at=timezone.now(),
                finished_at=None)
    )


def waiting(worker: Worker) -> int:
    """Units of ``worker`` waiting to be claimed (eligible or not)."""
    return Execution.objects.using(_alias()).claimable().filter(
        worker=worker.name  # counted in the claim index
    ).count()


def _back_to_unfinished(qs: Any) -> int:
    return qs.update(state=State.UNFINISHED, crashes=0, available_at=timezone.now(),
                     finished_at=None)


def reset_failed_ids(execution_ids: list[int]) -> int:
    """Put the FAILED executions among ``execution_ids`` back to UNFINISHED; how many."""
    return _back_to_unfinished(Execution.objects.using(_alias()).filter(
        id__in=execution_ids, state__in=TRANSITIONS["reset_failed"]
    ))


def reprocess_ids(execution_ids: list[int]) -> int:
    """Run FINISHED or FAILED executions again (back to UNFINISHED); how many changed."""
    return _back_to_unfinished(Execution.objects.using(_alias()).filter(
        id__in=execution_ids, state__in=TRANSITIONS["reprocess"]
    ))


def reprocess(worker: Worker, pks: list[Any]) -> int:
    """Run ``worker`` again on these source rows where it FINISHED or FAILED."""
    using = _alias()
    return _back_to_unfinished(Execution.objects.using(using).filter(
        worker=worker.name,
        source_id__in=[keys.to_key(worker.source, pk, using) for pk in pks],
        state__in=TRANSITIONS["reprocess"],
    ))
