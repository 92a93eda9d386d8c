"""System checks. IDs are stable and documented in docs/checks.md."""

from __future__ import annotations

import difflib
import sys
from typing import Any

from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured
from django.db import DatabaseError, connections
from django.db.models import CompositePrimaryKey

from . import conf
from .db import ENGINES, engine_for, pooler
from .exceptions import UnknownTask
from .rows.registry import MAX_KEY_LENGTH, key_too_long, workers
from .tasks import registry as task_registry
from .tasks import stored_schedules
from .tasks.schedules import schedules


def in_memory_sqlite(alias: str) -> bool:
    """Whether ``alias`` is a database in one process's memory (SQLite ``:memory:``)."""
    connection = connections[alias]
    return engine_for(connection).in_memory(connection)


@register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    try:
        config = conf.load()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="django_dbworker.E001")]
    errors: list[CheckMessage] = []
    if in_memory_sqlite(config.DATABASE) and not _testing(config.DATABASE):
        errors.append(Error(
            f"DATABASES[{config.DATABASE!r}] is an in-memory SQLite database; runworkers "
            "runs handlers in other processes, which cannot see it.",
            hint="Give the database a file NAME.",
            id="django_dbworker.E002",
        ))
    connection = connections[config.DATABASE]
    engine = engine_for(connection)
    if engine.vendor not in ENGINES:
        errors.append(Error(
            f"DATABASES[{config.DATABASE!r}] uses the {engine.vendor!r} backend, which "
            "django-dbworker has no engine for; its tables and queue would not work there.",
            hint=f"Use one of: {', '.join(sorted(ENGINES))} (DBWORKER['DATABASE'] names "
                 "the database alias holding our tables).",
            id="django_dbworker.E012",
        ))
    errors += engine.setting_checks(config.DATABASE, connection)
    return errors


def _testing(alias: str) -> bool:
    return bool(connections[alias].settings_dict.get("NAME", "").startswith("file:memorydb"))


@register()
def check_workers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    errors: list[CheckMessage] = []
    for worker in workers.values():
        pk = worker.source._meta.pk
        if pk is None or isinstance(pk, CompositePrimaryKey):
            errors.append(Error(
                f"Worker {worker.name!r}: its source {worker.source._meta.label} has no "
                "single-column primary key, which row-as-queue workers need.",
                hint="Give the model an id field or another single-column primary key.",
                obj=worker.handler,
                id="django_dbworker.E005",
            ))
            continue
        too_long = key_too_long(worker.source)
        if too_long:
            errors.append(Error(
                f"Worker {worker.name!r}: {too_long}",
                hint=f"Give the primary key max_length={MAX_KEY_LENGTH} or less.",
                obj=worker.handler,
                id="django_dbworker.E006",
            ))
            continue
        try:
            worker.eligible_queryset()
        except Exception as exc:
            errors.append(Error(
                f"Worker {worker.name!r}: its eligible queryset cannot be built: {exc}",
                hint="eligible= must be a QuerySet of the source model or a callable "
                     "returning one.",
                obj=worker.handler,
                id="django_dbworker.E003",
            ))
    return errors


@register()
def check_schedules(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """Code schedules (``@cron``, ``DBWORKER["SCHEDULES"]``): each valid, each naming a
    registered task (a supervisor would log ``schedule_failed`` every minute instead)."""
    try:
        found = schedules()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), hint="Fix the cron expression or options of that schedule.",
                      id="django_dbworker.E004")]
    errors: list[CheckMessage] = []
    for schedule in found.values():
        try:
            task_registry.resolve(schedule.task_path)
        except UnknownTask as exc:
            where = ("DBWORKER['SCHEDULES']" if schedule.name in conf.get().SCHEDULES
                     else "@cron")
            errors.append(Error(
                f"Schedule {schedule.name!r} ({where}) names a task that is not registered: "
                f"{exc}",
                hint=_task_hint(schedule.task_path), id="django_dbworker.E004"))
    return errors


def _task_hint(path: str) -> str:
    close = difflib.get_close_matches(path, task_registry.known(), n=1, cutoff=0.9)
    also = f" Did you mean {close[0]!r}?" if close else ""
    return ("Give 'task' the dotted path of a function decorated with @task of a "
            f"DBWorkerBackend, e.g. 'myapp.tasks.send_report'.{also}")


@register(Tags.database)
def check_stored_schedules(app_configs: Any = None, databases: Any = None,
                           **kwargs: Any) -> list[CheckMessage]:
    """Enabled stored schedules a supervisor would not run (``stored_schedule_invalid``):
    their task removed from the code since they were saved, a row written by SQL. A
    warning: a row, changed at run time, must not stop ``migrate``."""
    alias = conf.get().DATABASE
    if not databases or alias not in databases:
        return []
    try:
        found = stored_schedules.not_run()
    except DatabaseError:  # unreachable, or not migrated (W002 says so)
        return []
    return [Warning(
        f"Stored schedule {row.name!r} (task {row.task_path!r}) is enabled but not run: "
        f"{problem}",
        hint="Correct it in the admin or with 'manage.py dbworker schedules edit "
             f"{row.name} --task PATH', or disable or remove it.",
        obj=row, id="django_dbworker.W006") for row, problem in found]


@register(Tags.database)
def check_migrations(app_configs: Any = None, databases: Any = None,
                     **kwargs: Any) -> list[CheckMessage]:
    """Our tables are not migrated on DBWORKER["DATABASE"] (only with ``--database``).

    A warning, not an error: ``migrate`` runs database checks too, and must not refuse to
    apply the very migrations this reports.
    """
    from django.db.migrations.executor import MigrationExecutor

    alias = conf.get().DATABASE
    if not databases or alias not in databases or sys.argv[1:2] == ["migrate"]:
        return []  # (migrate checks before it applies the very migrations this reports)
    try:
        loader = MigrationExecutor(connections[alias]).loader
        applied = set(loader.applied_migrations)
    except DatabaseError:
        return []
    # every one of ours not recorded, not only those before the newest (a plan to the leaf
    # node is empty once that one is applied, whatever is missing before it)
    ours = sorted(name for app, name in loader.graph.nodes
                  if app == "django_dbworker" and (app, name) not in applied)
    if not ours:
        return []
    return [Warning(
        f"Database {alias!r} lacks {len(ours)} migration(s) of django_dbworker "
        f"({', '.join(ours)}); runworkers, the admin and the tasks backend need them.",
        hint="Run 'manage.py migrate django_dbworker'.",
        id="django_dbworker.W002",
    )]


@register(Tags.database)
def check_triggers(app_configs: Any = None, databases: Any = None,
                   **kwargs: Any) -> list[CheckMessage]:
    """Stale triggers (``dbworker triggers``), and missing ones beside installed ones on the
    same table. No triggers at all is fine: they are optional."""
    from .rows import triggers

    alias = conf.get().DATABASE
    if not databases or alias not in databases:
        return []
    try:
        states = triggers.status(alias)
    except DatabaseError:  # unreachable, or a database without triggers
        return []
    covered = {s.table for s in states.values() if s.state != "missing"}
    warnings: list[CheckMessage] = []
    for name, state in states.items():
        if state.state == "stale":
            problem = f"its database triggers are stale: {state.reason}"
        elif state.state == "missing" and state.table in covered:
            problem = (f"its table {state.table!r} has triggers for other workers, "
                       "but not for this one: rows written without save() wait for the sweep")
        else:
            continue
        warnings.append(Warning(
            f"Worker {name!r}: {problem}.",
            hint="Run 'manage.py dbworker triggers install' (after every migrate), or "
                 "'manage.py dbworker triggers remove --worker NAME'.",
            id="django_dbworker.W003",
        ))
    return warnings


#: What breaks behind a transaction-pooling pooler when it is on (check W005).
SESSION_SETTINGS = {
    "NOTIFY": "supervisors LISTEN on a server connection the pooler hands to other clients "
              "(runworkers, when it detects the pooler too, polls instead)",
    "PREPARED_STATEMENTS": "a statement prepared in one transaction is missing from the "
                           "server connection of the next (runworkers, when it detects the "
                           "pooler too, prepares nothing)",
}


@register(Tags.database)
def check_pooler(app_configs: Any = None, databases: Any = None,
                 **kwargs: Any) -> list[CheckMessage]:
    """Settings that need a session, for a database reached through a transaction-pooling
    pooler (``db/pooler.py``). Two short connections, only when such a setting is on; silent
    when the database cannot be reached or the answer is unknown."""
    try:
        config = conf.get()
    except ImproperlyConfigured:
        return []  # E001 says why
    alias = config.DATABASE
    if not databases or alias not in databases:
        return []
    connection = connections[alias]
    on = [key for key in SESSION_SETTINGS if getattr(config, key)]
    if not connection.settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
        on.append("DISABLE_SERVER_SIDE_CURSORS")
    if not on:
        return []  # (and elsewhere than on PostgreSQL ``transaction_pooled`` is False)
    try:
        pooled = pooler.transaction_pooled(alias, fresh=True)
    except Exception:  # unreachable: other checks and commands say so
        return []
    if not pooled:
        return []
    why = [f"DBWORKER[{key!r}] is on: {SESSION_SETTINGS[key]}"
           for key in SESSION_SETTINGS if key in on]
    if "DISABLE_SERVER_SIDE_CURSORS" in on:
        why.append(f"DATABASES[{alias!r}] lacks DISABLE_SERVER_SIDE_CURSORS: QuerySet."
                   "iterator() outside a transaction would use a WITH HOLD cursor of a "
                   "session")
    fix = [f"DBWORKER[{key!r}] = False" for key in SESSION_SETTINGS if key in on]
    if "DISABLE_SERVER_SIDE_CURSORS" in on:
        fix.append(f"DATABASES[{alias!r}]['DISABLE_SERVER_SIDE_CURSORS'] = True")
    return [Warning(
        f"Database {alias!r} is reached through a transaction-pooling connection pooler "
        f"(PgBouncer with pool_mode = transaction, or alike); {'; '.join(why)}.",
        hint=f"Set {', '.join(fix)}; or give runworkers settings whose database connects to "
             "PostgreSQL directly (docs/operations.md, PgBouncer).",
        id="django_dbworker.W005",
    )]
