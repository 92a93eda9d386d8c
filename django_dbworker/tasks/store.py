"""Every change of a task row's status, each a guarded UPDATE that reports its row count.

    (enqueue)   -> READY        insert (run_after, priority, queue)
    (enqueue)   -> WAITING      insert with dependencies not met yet (after=[...])
    (enqueue)   -> CANCELLED    insert after a dependency already failed
    WAITING     -> READY        release: its last dependency was met (tasks.dependents)
    WAITING     -> CANCELLED    a dependency failed or was cancelled (DependencyFailed)
    READY       -> RUNNING      claim
    RETRYING    -> RUNNING      claim (once available_at has passed)
    RUNNING     -> SUCCESSFUL   succeed with the claim's token
    RUNNING     -> RETRYING     an attempt failed and retries are left
    RUNNING     -> FAILED       an attempt failed for good; release after MAX_CRASHES
    RUNNING     -> READY        release (its process died or it was cut off), reap
    RUNNING     -> READY        unclaim: claimed ahead, given back before it ran (the
                                attempt and its worker id are taken back)
    RUNNING     -> READY        snooze: the task raised Snooze, available after its delay
                                (the attempt and its worker id taken back, snoozes + 1)
    READY       -> CANCELLED    cancel
    WAITING     -> CANCELLED    cancel
    RETRYING    -> CANCELLED    cancel
    RUNNING     -> CANCELLED    cancel: the supervisor stops its process, then records it
    FAILED      -> READY        retry (a person asks for another attempt)
    CANCELLED   -> READY        retry
    READY       -> (deleted)    purge
    WAITING     -> (deleted)    purge
    RETRYING    -> (deleted)    purge
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connections, transaction
from django.db.models import F, Func, JSONField, Q, QuerySet
from django.utils import timezone

from .. import conf
from ..db import compiled, engine, engine_for, keys, notify, sources
from ..db.engine import Claim as EngineClaim
from ..db.partial import InStates
from ..djtasks import TaskResultDoesNotExist
from ..models import (
    ANY_QUEUE_GUARD,
    TASK_CLAIMABLE,
    TASK_SETTLED,
    TaskDependency,
    TaskRecord,
    TaskStatus,
    Transition,
)
from ..units.claimant import Claimant
from ..units.failures import FailureInfo
from ..units.leases import Leases, lease_live, one_statement
from ..workflows import retention
from . import dependents, newtasks, uniqueness
from .errorlist import error_entry, kept_errors

KEY_NAMESPACE = newtasks.KEY_NAMESPACE

#: The state machine as data: each change's guard (the statuses it starts from) and the
#: statuses it leads to (``Transition.to``; empty: deleted); the table above, checked by
#: tests/test_status.py. "finish" is every record of a claimed attempt (succeed,
#: fail_attempt, release, the supervisor's records of timeouts and cancels).
TRANSITIONS: dict[str, Transition] = {
    # created (no status before): READY, or WAITING / CANCELLED with dependencies
    "enqueue": Transition((), to={TaskStatus.READY, TaskStatus.WAITING, TaskStatus.CANCELLED}),
    "claim": Transition(TASK_CLAIMABLE, to={TaskStatus.RUNNING}),
    "finish": Transition({TaskStatus.RUNNING}, to={
        TaskStatus.SUCCESSFUL, TaskStatus.RETRYING, TaskStatus.FAILED, TaskStatus.READY,
        TaskStatus.CANCELLED}),
    "unclaim": Transition({TaskStatus.RUNNING}, to={TaskStatus.READY}),
    "snooze": Transition({TaskStatus.RUNNING}, to={TaskStatus.READY}),
    "release": Transition({TaskStatus.WAITING}, to={TaskStatus.READY}),
    "cancel_dependent": Transition({TaskStatus.WAITING}, to={TaskStatus.CANCELLED}),
    "cancel_waiting": Transition({TaskStatus.READY, TaskStatus.WAITING, TaskStatus.RETRYING},
                                 to={TaskStatus.CANCELLED}),
    "cancel_running": Transition({TaskStatus.RUNNING}, to={TaskStatus.CANCELLED}),
    "retry": Transition({TaskStatus.FAILED, TaskStatus.CANCELLED}, to={TaskStatus.READY}),
    "purge": Transition({*TASK_CLAIMABLE, TaskStatus.WAITING}, to=()),
}


@dataclass(frozen=True, slots=True)
class TaskClaim:
    """A claimed task as its store knows it (``tasks.unit.TaskUnit`` is the unit the
    supervisor runs)."""

    task_id: uuid.UUID
    task_path: str
    token: uuid.UUID
    attempt: int
    lease_expires_at: datetime
    claimed_at: datetime
    #: The task row as the claim left it (``sources.columns`` order), so that the child
    #: that runs it need not read it again; empty: read it. Not part of the claim's
    #: identity (equality, hash) nor of its repr (arguments and errors may be large).
    values: tuple[Any, ...] = dataclasses.field(default=(), compare=False, repr=False)

    def row(self, using: str) -> TaskRecord | None:
        """The task row as claimed, or as stored now when the claim did not bring it."""
        if self.values:
            return sources.columns(TaskRecord, using).instance(TaskRecord, using, self.values)
        return get(self.task_id)

    @property
    def unit_id(self) -> str:
        return str(self.task_id)

    @property
    def unit_pk(self) -> uuid.UUID:
        return self.task_id


def _alias() -> str:
    return conf.get().DATABASE


def _prep(name: str, value: Any, using: str) -> Any:
    return keys.column_field(TaskRecord, name).get_db_prep_save(value, connections[using])


# ----- enqueue ------------------------------------------------------------------------


def insert(rows: list[newtasks.NewTask], *, idempotency_key: str | None,
           payload: str | None = None) -> list[newtasks.NewTask | TaskRecord]:
    """Store new task rows in one statement; with a key, return the row holding it.
    ``payload``: ``tasks.newtasks.encode(rows)`` if the caller has it."""
    if idempotency_key is None:
        insert_batches([(rows, payload)])
        return list(rows)
    using = _alias()
    manager = TaskRecord.objects.using(using)
    try:
        with transaction.atomic(using=using):
            manager.bulk_create([r.record() for r in rows], ignore_conflicts=True)
            notify.announce(using, notify.TASKS)
    except IntegrityError:  # pragma: no cover - ignore_conflicts covers the key
        pass
    return [manager.get(idempotency_key=idempotency_key)]


def insert_batches(batches: Iterable[tuple[list[newtasks.NewTask], str | None]]) -> None:
    """Store new task rows without an idempotency key, a statement per batch of
    ``(rows, payload)`` (``tasks.newtasks.encode(rows)``, or None: made here if needed), all in
    one transaction.

    On PostgreSQL the statements are pipelined (``Engine.pipelined``): each batch is sent as
    soon as ``batches`` gives it, and the server stores it while the next is built, so the
    Python work per row and the server's run side by side instead of one after the other.
    An exception from ``batches`` (a call that is not JSON) or from the server rolls every
    batch back. Outside a transaction, no BEGIN and COMMIT of their own there: the
    pipeline's statements are one implicit transaction (``Engine.one_transaction``), so an
    ``enqueue()`` costs one round trip."""
    using = _alias()
    connection = connections[using]
    keyed = False
    with engine(using).one_transaction(connection):
        for rows, payload in batches:
            newtasks.insert(rows, using, payload)
            keyed = keyed or _keyed(rows)
        notify.announce(using, notify.TASKS if keyed else notify.KEYLESS_TASKS)


def _keyed(rows: list[newtasks.NewTask]) -> bool:
    """Whether a new task of ``rows`` has a concurrency limit (and so a key)."""
    return any(row.shared.concurrency_limit is not None for row in rows)


def insert_one_batch(rows: list[newtasks.NewTask], payload: str | None) -> None:
    """``insert_batches`` of one batch. Outside a transaction, where the engine can
    (``Engine.one_query``), the INSERT and the announcement go in one query, a transaction
    of their own (no BEGIN and COMMIT round trips): an enqueue() reaches an idle
    supervisor that much sooner. Inside the caller's transaction as ``insert_batches``:
    in a savepoint, so that a failed insert leaves the caller's transaction usable."""
    using = _alias()
    connection = connections[using]
    announce = notify.statement(using, notify.KEYLESS_TASKS)
    if rows and not _keyed(rows) and connection.get_autocommit():
        insert = newtasks.insert_statement(rows, using, payload)
        if insert is not None and engine(using).one_query(
                connection, [insert, *([announce] if announce else [])]):
            return
    insert_batches([(rows, payload)])


def key_exists(key: str) -> bool:
    return TaskRecord.objects.using(_alias()).filter(idempotency_key=key).exists()


def get(result_id: Any) -> TaskRecord | None:
    try:
        pk = uuid.UUID(str(result_id))
    except ValueError:
        return None
    try:
        return sources.get(TaskRecord, pk, _alias())  # compiled once: read once per attempt
    except TaskRecord.DoesNotExist:
        return None


# ----- claim --------------------------------------------------------------------------


def claim(
    queues: list[str] | None,
    limit: int,
    claimant: Claimant,
    lease: float,
    *,
    only_path: str | None = None,
    exclude_paths: list[str] | tuple[str, ...] = (),
    exclude_queues: frozenset[str] = frozenset(),
) -> list[TaskClaim]:
    """Claim up to ``limit`` ready tasks without a concurrency key, highest priority first
    (``Engine.claim``), in one statement; ``exclude_queues``: paused queues, for a claim of
    every queue (``queues`` None). Tasks with a concurrency key are left for the keyed
    claim (``concurrency.claim``; ``planner.claim`` chooses)."""
    if limit <= 0:
        return []
    exclude = tuple(exclude_paths)
    using = _alias()
    connection = connections[using]
    now = timezone.now()
    paused = tuple(sorted(exclude_queues)) if queues is None else ()

    def build(at: datetime) -> Any:
        ready = TaskRecord.objects.using(using).ready(at)
        # Some queues: their own index, never the every-queue one; every queue: that one
        # (its guard: models.ANY_QUEUE_GUARD).
        inner: QuerySet[TaskRecord, Any] = (
            ready.in_queues(queues) if queues is not None else ready.filter(ANY_QUEUE_GUARD))
        if paused:
            inner = inner.exclude(queue_name__in=list(paused))
        if only_path is not None:
            inner = inner.filter(task_path=only_path)
        if exclude:
            inner = inner.exclude(task_path__in=list(exclude))
        inner = inner.filter(concurrency_key__isnull=True)  # keyed: concurrency.claim
        # The order of the claim index (dbworker_task_claimable): with one queue the claim
        # walks it and stops after ``limit`` tasks; a tie-breaker it lacks (``id``) would
        # make every claim sort all waiting tasks. Ties go in index order (enqueue order).
        inner = inner.order_by(F("priority").desc(), "available_at").values("id")[:limit]
        if connection.features.has_select_for_update_skip_locked:
            inner = inner.select_for_update(
                skip_locked=True,
                of=("self",) if connection.features.has_select_for_update_of else ())
        return inner

    key = ("task", tuple(queues) if queues is not None else None, limit, only_path, exclude,
           paused)
    inner_sql, inner_params = compiled.sql_with_now(key, None, build, now, using)
    return _claim_candidates(inner_sql, inner_params, claimant, lease, now)


def claim_ids(ids: list[Any], claimant: Claimant, lease: float, now: datetime, *,
              held: bool = True) -> list[TaskClaim]:
    """Claim the tasks ``ids`` that the caller's transaction picked (``tasks.concurrency
    .claim``), in no particular order. ``held``: it holds them all (locked, still
    waiting); else those it does not hold are locked here, ``SKIP LOCKED``, and claimed
    only if they still wait (another claim may have taken them since they were read)."""
    using = _alias()
    connection = connections[using]
    if held:
        quote = connection.ops.quote_name
        marks = ", ".join(["%s"] * len(ids))
        sql = (f"SELECT {quote('id')} FROM {quote(TaskRecord._meta.db_table)} "
               f"WHERE {quote('id')} IN ({marks})")
        params: Sequence[Any] = [_prep("id", pk, using) for pk in ids]
        # Held: an engine that would read them again first need not (``Claim.ids``).
        return _claim_candidates(sql, params, claimant, lease, now, held=True, ids=params)
    waiting = TaskRecord.objects.using(using).ready(now).filter(pk__in=ids).values("id")
    if connection.features.has_select_for_update_skip_locked:
        waiting = waiting.select_for_update(
            skip_locked=True,
            of=("self",) if connection.features.has_select_for_update_of else ())
    sql, params = waiting.query.get_compiler(using).as_sql()
    return _claim_candidates(sql, params, claimant, lease, now, held=True)


def _claim_candidates(inner_sql: str, inner_params: Sequence[Any], claimant: Claimant,
                      lease: float, now: datetime, *, held: bool = False,
                      ids: Sequence[Any] | None = None) -> list[TaskClaim]:
    """RUNNING for ``claimant``: the tasks ``inner_sql`` selects (their ids), in its order;
    ``held``: in the caller's transaction, which holds them (no savepoint of its own);
    ``ids``: what ``inner_sql`` selects, known already (``Claim.ids``)."""
    using = _alias()
    connection = connections[using]
    expires = now + timedelta(seconds=lease)
    token = uuid.uuid4()
    worker_id = f"{claimant.host}:{claimant.pid}"
    quote = connection.ops.quote_name
    # the whole row comes back: the child runs the task from it without reading it again
    returned = sources.columns(TaskRecord, using)
    append = engine_for(connection).json_append("worker_ids")
    stamp = _prep("last_attempted_at", now, using)
    parts = EngineClaim(
        table=quote(TaskRecord._meta.db_table),
        sets=("status = %s, token = %s, supervisor_id = %s, claimed_host = %s, "
              "claimed_pid = %s, attempts = attempts + 1, "
              "started_at = COALESCE(started_at, %s), last_attempted_at = %s, "
              f"lease_expires_at = %s, worker_ids = {append}"),
        set_params=[
            TaskStatus.RUNNING,
            _prep("token", token, using),
            _prep("supervisor_id", claimant.supervisor_id, using),
            claimant.host,
            claimant.pid,
            stamp,
            stamp,
            _prep("lease_expires_at", expires, using),
            worker_id,
        ],
        candidates=inner_sql,
        candidate_params=inner_params,
        returning=f"{quote('id')}, {returned.sql}",
        ids=ids,
    )
    with (contextlib.nullcontext() if held else one_statement(using),
          connection.cursor() as cursor):
        # in the candidates' order: priority, then the longest available (ties: the index's)
        rows = returned.values([row[1:] for row in engine_for(connection).claim(cursor, parts)])
    at = [returned.names.index(name) for name in ("id", "task_path", "attempts")]
    return [TaskClaim(row[at[0]], row[at[1]], token, row[at[2]], expires, now, row)
            for row in rows]


def claim_order(c: TaskClaim) -> tuple[int, datetime]:
    """Claim order, to merge several claims: higher priority first, then the longest
    available (a stable sort: each claim's own order stays)."""
    names = sources.columns(TaskRecord, _alias()).names
    return -c.values[names.index("priority")], c.values[names.index("available_at")]


# ----- completion ---------------------------------------------------------------------


def _fenced(c: TaskClaim, using: str) -> Any:
    assert TRANSITIONS["finish"] == {TaskStatus.RUNNING}  # what the fence guards
    return TASKS.fenced(c, using)


def _live(c: TaskClaim, using: str, now: datetime) -> Any:
    """``_fenced``, and the lease not expired where that is checked (``store.lease_live``)."""
    qs = _fenced(c, using)
    return qs.filter(lease_expires_at__gt=now) if lease_live(using) else qs


def succeed(c: TaskClaim, return_value: Any, *, at: datetime | None = None) -> int:
    """RUNNING -> SUCCESSFUL with the return value, fenced by the claim's token and its
    lease; ``at``: its ``finished_at`` (default: now). Returns the rows changed (0 or 1)."""
    return len(succeed_many([(c, return_value, at or timezone.now())]))


def succeed_many(done: Sequence[tuple[TaskClaim, Any, datetime]]) -> set[uuid.UUID]:
    """``succeed`` for several tasks in one statement: ``(claim, return value, finished
    at)`` each. Returns the ids of the tasks it recorded; the others were taken over,
    cancelled or their lease expired meanwhile (each is fenced on its own).

    A child that runs many short tasks records them together: one round trip and one
    commit instead of one per task. Written out rather than built with the ORM (the same
    guard as ``_live``): ``UPDATE ... FROM`` the new values, which PostgreSQL and SQLite
    (3.33+) both run.

    Tasks nobody waits for are recorded by that one statement, which also states
    ``has_dependents = false``; a task some dependent waits for (its claim said so, or the
    statement left it: a dependent was enqueued while it ran) is recorded in a
    transaction with the release of its dependents (``dependents``)."""
    if not done:
        return set()
    hinted = _hinted_dependents(done)
    plain = [d for d in done if d[0].task_id not in hinted]
    recorded = _succeed(plain, lone=True) if plain else set()
    rest = [d for d in done if d[0].task_id not in recorded]
    if rest:
        using = _alias()
        with transaction.atomic(using=using):
            ended = _succeed(rest, lone=False)
            if ended:
                dependents.resolve(using, [(pk, TaskStatus.SUCCESSFUL) for pk in ended])
        recorded |= ended
    return recorded


def _hinted_dependents(done: Sequence[tuple[TaskClaim, Any, datetime]]) -> set[uuid.UUID]:
    """The tasks whose claim saw ``has_dependents`` set."""
    names = sources.columns(TaskRecord, _alias()).names
    at = names.index("has_dependents")
    return {c.task_id for c, _, _ in done if c.values and c.values[at]}


def _succeed(done: Sequence[tuple[TaskClaim, Any, datetime]], *, lone: bool) -> set[uuid.UUID]:
    """``succeed_many``'s statement; ``lone``: only tasks without dependents."""
    connection = connections[_alias()]
    field = functools.partial(keys.column_field, TaskRecord)
    quote = connection.ops.quote_name
    table = quote(TaskRecord._meta.db_table)
    column = {name: quote(keys.column_name(TaskRecord, name)) for name in
              ("id", "token", "status", "return_value", "finished_at", "lease_expires_at",
               "has_dependents")}
    (from_status,) = TRANSITIONS["finish"]
    sets = (f"{column['status']} = %s, {column['return_value']} = v.return_value, "
            f"{column['finished_at']} = v.finished_at, "
            f"{column['token']} = NULL, {column['lease_expires_at']} = NULL")
    where = (f"{table}.{column['id']} = v.id AND {table}.{column['token']} = v.token "
             f"AND {table}.{column['status']} = %s")
    where_params: list[Any] = [from_status]
    if lone:
        where += f" AND {table}.{column['has_dependents']} = %s"
        where_params.append(False)
    if lease_live(connection.alias):
        where += f" AND {table}.{column['lease_expires_at']} > %s"
        where_params.append(field("lease_expires_at").get_db_prep_save(timezone.now(),
                                                                        connection))
    columns = [field(name) for name in ("id", "token", "return_value", "finished_at")]
    rows = [(c.task_id, c.token, value, at) for c, value, at in done]
    to_id = field("id").to_python
    with connection.cursor() as cursor:
        changed = engine_for(connection).update_from_values(
            cursor, table, sets, [TaskStatus.SUCCESSFUL], columns, rows, where,
            where_params, returning=f"{table}.{column['id']}",
            announce=notify.ENDED if notify.enabled(connection.alias) else None)
    return {to_id(value) for (value,) in changed}


def fail_attempt(
    c: TaskClaim, info: FailureInfo, *, retry_at: datetime | None,
    status: TaskStatus = TaskStatus.FAILED, live: bool = False,
) -> int:
    """Record a failed attempt: RETRYING until ``retry_at``, else ``status`` for good.

    ``live``: the child that ran it records, so its lease must not have expired either
    (the supervisor's records of timeouts, cancels and crashes need only the token)."""
    using = _alias()
    now = timezone.now()
    with transaction.atomic(using=using):
        fenced = _live(c, using, now) if live else _fenced(c, using)
        row = fenced.select_for_update().values("errors", "has_dependents").first()
        if row is None:
            return 0
        errors = [*kept_errors(row["errors"]), error_entry(info, c.attempt, now)]
        done = {"token": None, "lease_expires_at": None, "errors": errors}
        if retry_at is not None:  # a retry never releases dependents
            return fenced.update(status=TaskStatus.RETRYING, available_at=retry_at, **done)
        changed = fenced.update(status=status, finished_at=now, **done)
        if changed:
            notify.announce_ended(using, [c.task_id])
            if row["has_dependents"]:
                _resolve(using, c.task_id, status)
        return changed


def _resolve(using: str, task_id: Any, status: str) -> None:
    """The dependents of a task that just ended ``status`` (``dependents``)."""
    dependents.resolve(using, [(task_id, status)])


class Tasks(Leases):
    """The tasks' table of leased units (the kind ``task``)."""

    name = "task"
    model = TaskRecord
    status = "status"
    held_status = TaskStatus.RUNNING
    back_status = TaskStatus.READY

    def held(self, using: str) -> Any:
        return TaskRecord.objects.using(using).running()  # the index dbworker_task_running

    def claim_of(self, pk: Any, attempt: int, token: uuid.UUID, now: datetime) -> TaskClaim:
        return TaskClaim(pk, "", token, attempt, now, now)

    def crashed_too_often(self, c: Any, fenced: Any, info: FailureInfo, now: datetime,
                          back: dict[str, Any]) -> int:
        if fenced.update(crashes=F("crashes") + 1):  # counted, as a row's last crash is
            return fail_attempt(c, info, retry_at=None)
        return 0

    def crashed(self, c: Any, fenced: Any, info: FailureInfo, now: datetime,
                back: dict[str, Any]) -> int:
        """READY with one more crash, and the crash in its errors."""
        row = fenced.select_for_update().values("errors").first()
        if row is None:
            return 0
        errors = [*kept_errors(row["errors"]), error_entry(info, c.attempt, now)]
        return fenced.update(status=TaskStatus.READY, crashes=F("crashes") + 1, errors=errors,
                             **back)

    def unclaimed(self, using: str, first: Q) -> dict[str, Any]:
        """READY, with the worker id the claim added taken back."""
        return {"status": TaskStatus.READY,
                "worker_ids": Func(F("worker_ids"), template=engine(using).json_drop_last(),
                                   output_field=JSONField())}


#: The tasks' lease life cycle (``units.leases``), and its roads by name.
TASKS = Tasks()
release = TASKS.release
unclaim = TASKS.unclaim
renew = TASKS.renew
reap = TASKS.reap
reap_held = TASKS.reap_held
release_untracked = TASKS.release_untracked


# ----- cancellation and retention -----------------------------------------------------


def cancel(result_id: Any) -> bool:
    """Cancel a waiting task now, or ask the supervisor running it to stop it.

    True if the task was cancelled or is being stopped, False if it had finished already;
    ``TaskResultDoesNotExist`` for an unknown id. A cancelled task ends CANCELLED (Django
    sees FAILED) with ``TaskCancelled`` in its errors.
    """
    using = _alias()
    row = get(result_id)
    if row is None:
        raise TaskResultDoesNotExist(str(result_id))
    now = timezone.now()
    info = FailureInfo("django_dbworker.exceptions.TaskCancelled",
                       "the task was cancelled before it ran")
    with transaction.atomic(using=using):
        waiting = TaskRecord.objects.using(using).filter(
            pk=row.pk, status__in=TRANSITIONS["cancel_waiting"]
        )
        current = waiting.select_for_update().values(
            "errors", "attempts", "has_dependents").first()
        if current is not None:
            errors = [*current["errors"], error_entry(info, current["attempts"], now)]
            changed = waiting.update(status=TaskStatus.CANCELLED, finished_at=now,
                                     cancel_requested_at=now, errors=errors)
            if changed:
                notify.announce_ended(using, [row.pk])
            if changed and current["has_dependents"]:
                _resolve(using, row.pk, TaskStatus.CANCELLED)
            return bool(changed)
        return bool(
            TaskRecord.objects.using(using)
            .filter(pk=row.pk, status__in=TRANSITIONS["cancel_running"],
                    cancel_requested_at__isnull=True)
            .update(cancel_requested_at=now)
        ) or TaskRecord.objects.using(using).filter(
            pk=row.pk, status=TaskStatus.RUNNING
        ).exists()


def cancel_requested(task_ids: list[uuid.UUID]) -> list[uuid.UUID]:
    """Which of these running tasks someone asked to cancel."""
    if not task_ids:
        return []
    return list(
        TaskRecord.objects.using(_alias())
        .filter(pk__in=task_ids, status=TaskStatus.RUNNING, cancel_requested_at__isnull=False)
        .values_list("pk", flat=True)
    )


def prune_batch(cutoff: datetime, batch: int) -> int:
    """Delete up to ``batch`` tasks that finished before ``cutoff``, and the uniqueness
    keys they hold (``uniqueness.forget_holders``)."""
    using = _alias()
    ids = list(
        TaskRecord.objects.using(using).finished()
        .filter(finished_at__lt=cutoff)
        .values_list("pk", flat=True)[:batch]
    )
    if not ids:
        return 0
    uniqueness.forget_holders(ids)
    # the edges of pruned dependents (those of pruned dependencies are kept: resolved)
    plain_delete(TaskDependency.objects.using(using).filter(dependent_id__in=ids))
    return plain_delete(TaskRecord.objects.using(using).filter(pk__in=ids))


def plain_delete(qs: QuerySet[Any]) -> int:
    """``DELETE ... WHERE`` of ``qs``, one statement: our tables have no relations to
    cascade and no signals of their own, but Django's ``delete()`` fetches every row
    first (in statements of 100 keys) whenever any ``post_delete`` receiver listens to
    all senders (ours does, for source rows: ``rows.pending``). At a million rows that was
    more than half of a purge's time."""
    return int(qs._raw_delete(qs.db))


def prune(older_than: timedelta, batch: int,
          progress: Callable[[int], None] | None = None) -> int:
    """Delete every finished task older than ``older_than``, ``batch`` rows at a time,
    then the workflows left without a task (``workflows.retention``); ``progress`` is told
    the running total after each batch (and may give the batch's space back)."""
    cutoff = timezone.now() - older_than
    deleted = 0
    for one_batch in (prune_batch, retention.prune_batch):
        while n := one_batch(cutoff, batch):
            deleted += n
            if progress is not None:
                progress(deleted)
    return deleted


# ----- operators' changes ---------------------------------------------------------------


def retry(task_ids: list[Any]) -> int:
    """Give FAILED or CANCELLED tasks another attempt now; how many changed.

    Attempts and errors are kept: the task's own ``retries`` count from its first attempt,
    so a manual retry of a task that used them all gets exactly one more attempt.
    """
    return TaskRecord.objects.using(_alias()).filter(
        pk__in=task_ids, status__in=TRANSITIONS["retry"]
    ).update(status=TaskStatus.READY, available_at=timezone.now(), finished_at=None,
             cancel_requested_at=None, crashes=0, return_value=None)


#: Tasks a purge deletes per transaction.
PURGE_BATCH = 1000
#: Batches of keys a purge reads at once: each read walks the index from its start again,
#: past the entries of the rows deleted so far (dead until a VACUUM), so reads are few.
PURGE_READ = 50


def purge(queues: list[str] | None, *, batch: int = PURGE_BATCH,
          progress: Callable[[int], None] | None = None) -> int:
    """Delete the tasks waiting to run (READY, WAITING, RETRYING) in ``queues`` (None:
    all), enqueued before the purge began; how many. Tasks waiting for a purged one are
    cancelled (``DependencyFailed``) as if it had been cancelled: none waits forever for a
    task that is gone.

    In transactions of ``batch`` tasks (and the dependents that go with them), so no
    claim, enqueue or renewal waits for more than one batch; their keys are read
    ``PURGE_READ`` batches at a time through the index of their statuses (the claim index
    for READY and RETRYING, ``dbworker_task_status`` for WAITING), so the work follows the
    tasks purged, not the table. ``progress`` is told the running total after each batch.
    Tasks enqueued meanwhile are left (a purge ends, whatever the enqueues)."""
    using = _alias()
    started = timezone.now()
    base = TaskRecord.objects.using(using).filter(enqueued_at__lte=started)
    if queues is not None:
        base = base.filter(queue_name__in=queues)
    deleted = 0
    waiting = base.filter(InStates("status", TASK_SETTLED), status=TaskStatus.WAITING)
    for part in (base.filter(InStates("status", TASK_CLAIMABLE)), waiting):
        while keys := list(part.values_list("pk", flat=True)[:batch * PURGE_READ]):
            for start in range(0, len(keys), batch):
                deleted += _purge_batch(using, keys[start:start + batch], waiting)
                if progress is not None:
                    progress(deleted)
    return deleted


def _purge_batch(using: str, keys: list[Any], waiting: QuerySet[TaskRecord]) -> int:
    """One transaction: the tasks of ``keys`` still waiting locked (a claim that took one
    first is waited for, and then it no longer waits) and deleted, with the dependents the
    purge would delete too (``waiting``), however deep: they go with the tasks they wait
    for, never cancelled by them first. The other dependents are resolved (cancelled).
    How many were deleted."""
    with transaction.atomic(using=using):
        found = list(TaskRecord.objects.using(using).filter(
            pk__in=keys, status__in=TRANSITIONS["purge"]).select_for_update()
            .values_list("pk", "has_dependents"))
        if not found:
            return 0
        ids = {pk for pk, _ in found}
        awaited = frontier = [pk for pk, has in found if has]
        while frontier:
            edges = TaskDependency.objects.using(using).filter(dependency_id__in=frontier)
            more = list(waiting.filter(pk__in=edges.values("dependent_id"))
                        .exclude(pk__in=ids).select_for_update()
                        .values_list("pk", "has_dependents"))
            ids |= {pk for pk, _ in more}
            frontier = [pk for pk, has in more if has]
            awaited = awaited + frontier
        deleted = plain_delete(TaskRecord.objects.using(using).filter(
            pk__in=sorted(ids), status__in=TRANSITIONS["purge"]))
        if awaited:  # after the delete: a dependent purged too is not cancelled
            dependents.resolve(using, [(pk, TaskStatus.CANCELLED) for pk in awaited])
        return deleted
