"""``manage.py runworkers``: parse options, then hand over to the Supervisor."""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, TextIO, cast

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils.module_loading import autodiscover_modules

from django_dbworker import conf
from django_dbworker.checks import in_memory_sqlite
from django_dbworker.conf import LOG_FORMATS
from django_dbworker.djtasks import task_backends
from django_dbworker.exceptions import UnknownWorker
from django_dbworker.logs import JsonFormatter
from django_dbworker.management.forked import CheckProcessKilled, run_forked
from django_dbworker.rows.registry import workers
from django_dbworker.supervisor.embedding import die_with_parent
from django_dbworker.supervisor.supervisor import Options, Supervisor

LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
#: Seconds between start-up attempts to reach the database: doubling from the first.
FIRST_STARTUP_RETRY, LAST_STARTUP_RETRY = 0.5, 5.0


class Command(BaseCommand):
    help = (
        "Run the supervisor: claim work for the registered workers and run it in child "
        "processes until SIGTERM/SIGINT (or, with --burst, until nothing is claimable)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="append", dest="worker_names", metavar="NAME",
                            help="Run only this worker (repeatable; default: all workers).")
        parser.add_argument("--queue", action="append", dest="queue_names", metavar="NAME",
                            help="Run only tasks of this queue (repeatable). With neither "
                                 "--worker nor --queue, every worker and every queue runs.")
        parser.add_argument("--concurrency", type=int, default=None,
                            help="Child processes (default: DBWORKER['CONCURRENCY']).")
        parser.add_argument("--burst", action="store_true",
                            help="Exit once nothing is claimable and nothing is running.")
        parser.add_argument("--max-tasks-per-child", type=int, default=None,
                            help="Replace a child after it ran this many units.")
        parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                            help="'text' (key=value) or 'json' (one object per event, no "
                                 "progress line); default: DBWORKER['LOG_FORMAT'].")
        parser.add_argument("--grace-period", type=float, default=None,
                            help="Seconds running units get after SIGTERM "
                                 "(default: DBWORKER['GRACE_PERIOD']).")

    def handle(self, *args: Any, **options: Any) -> None:
        die_with_parent()  # started by django_dbworker.start(): stop with that process
        config = conf.get()
        if in_memory_sqlite(config.DATABASE):
            raise CommandError(
                f"DATABASES[{config.DATABASE!r}] is an in-memory SQLite database, which other "
                "processes cannot see; give it a file NAME."
            )
        worker_names, queue_names = options["worker_names"], options["queue_names"]
        selected = self._workers(worker_names) if worker_names or not queue_names else []
        run_tasks, queues = self._queues(queue_names, everything=not worker_names)
        concurrency = options["concurrency"]
        concurrency = config.CONCURRENCY if concurrency is None else concurrency
        if not 1 <= concurrency <= conf.MAX_CONCURRENCY:
            raise CommandError(f"--concurrency {concurrency}: give at least 1 and at most "
                               f"{conf.MAX_CONCURRENCY} (one process and one database "
                               "connection each).")
        max_tasks = options["max_tasks_per_child"]
        max_tasks = config.MAX_TASKS_PER_CHILD if max_tasks is None else max_tasks
        if max_tasks is not None and max_tasks < 1:
            raise CommandError(f"--max-tasks-per-child {max_tasks}: give at least 1.")
        grace = options["grace_period"]
        grace = config.GRACE_PERIOD if grace is None else grace
        if not 0 <= grace <= conf.MAX_SECONDS:  # NaN too: it would never end
            raise CommandError(f"--grace-period {grace}: give 0 or more seconds, at most "
                               f"{conf.MAX_SECONDS:.0f} (one year).")
        self._check_migrations(config.DATABASE, config.STARTUP_WAIT)
        log_format = options["log_format"] or config.LOG_FORMAT
        self._configure_logging(options["verbosity"], log_format)
        # OutputWrapper's own stream (Django's _out, which django-stubs do not declare).
        stream = cast(TextIO, self.stdout._out)
        supervisor = Supervisor(
            Options(workers=selected, tasks=run_tasks, queues=queues,
                    concurrency=concurrency, burst=options["burst"],
                    max_tasks_per_child=max_tasks, grace_period=grace),
            config,
            progress=stream if options["verbosity"] >= 1 and log_format == "text" else None,
        )
        code = supervisor.run()
        if code:
            sys.exit(code)

    def _queues(self, names: list[str] | None, everything: bool) -> tuple[bool, list[str] | None]:
        """Whether to run tasks, and of which queues (None: all of them)."""
        from django_dbworker.backend import DBWorkerBackend

        autodiscover_modules("tasks")
        ours = [b for b in task_backends.all() if isinstance(b, DBWorkerBackend)]
        configured = sorted({q for b in ours for q in b.queues})
        if names:
            if not ours:
                raise CommandError(
                    "--queue was given, but no TASKS backend uses "
                    "django_dbworker.backend.DBWorkerBackend."
                )
            unknown = [n for n in names if n not in configured]
            if unknown:
                raise CommandError(
                    f"Unknown queue(s) {', '.join(map(repr, unknown))}; the DBWorkerBackend "
                    f"QUEUES are {', '.join(map(repr, configured))}."
                )
            return True, list(dict.fromkeys(names))
        return bool(ours) and everything, None

    def _workers(self, names: list[str] | None) -> list[Any]:
        if not names:
            if not workers and not self._has_task_backend():
                raise CommandError(
                    "No workers are registered and no TASKS backend uses DBWorkerBackend. "
                    "Declare workers with @worker in a workers.py module of an app in "
                    "INSTALLED_APPS, or configure TASKS."
                )
            return list(workers.values())
        try:
            return [workers[name] for name in dict.fromkeys(names)]
        except UnknownWorker as exc:
            raise CommandError(str(exc)) from None

    def _has_task_backend(self) -> bool:
        from django_dbworker.backend import DBWorkerBackend

        return any(isinstance(b, DBWorkerBackend) for b in task_backends.all())

    def check(self, *args: Any, **kwargs: Any) -> None:
        """Django's system checks, in a forked process (``forked``): what they import does
        not stay in the supervisor and its children. Some read the database (MariaDB's
        server settings): one that cannot be reached is tried again (``_reaching``)."""
        try:
            config = conf.get()
        except ImproperlyConfigured:  # the checks say what is wrong (E001)
            self._checked(lambda: super(Command, self).check(*args, **kwargs))
            return
        self._reaching(config.DATABASE, config.STARTUP_WAIT,
                       lambda: super(Command, self).check(*args, **kwargs))

    def _check_migrations(self, using: str, wait: float = 0.0) -> None:
        """No unapplied migrations, in a forked process: every app's migrations are
        imported to tell, and need not stay in the supervisor and its children."""
        self._reaching(using, wait, lambda: self._unapplied_migrations(using))

    def _reaching(self, using: str, wait: float, check: Any) -> None:
        """``check`` (``_checked``), tried again while it fails to reach the database
        (a database starting beside us, failing over, a dropped connection), for ``wait``
        seconds (``STARTUP_WAIT``), saying so each time; then a CommandError naming the
        database and the setting."""
        from django.db import InterfaceError, OperationalError, connections

        give_up_at = time.monotonic() + wait
        pause = FIRST_STARTUP_RETRY
        while True:
            try:
                self._checked(check)
                return
            except (OperationalError, InterfaceError) as exc:  # the connection, not the SQL
                reason = str(exc).strip()
                left = give_up_at - time.monotonic()
                if left <= 0:
                    tried = f" (tried for {wait:g} s: DBWORKER['STARTUP_WAIT'])" if wait else ""
                    raise CommandError(
                        f"Cannot reach database {using!r}{tried}: {reason}") from exc
                pause = min(pause, left)
                self.stderr.write(f"runworkers: cannot reach database {using!r} ({reason}); "
                                  f"trying again in {pause:g} s")
                connections[using].close()
                time.sleep(pause)
                pause = min(pause * 2, LAST_STARTUP_RETRY)

    def _checked(self, check: Any) -> None:
        """``check`` in a forked process where that is safe and loses nothing: a process
        with one thread (forking one with more may deadlock the fork on a lock another
        thread held) whose output goes to its own stdout and stderr (a ``call_command``
        writing to a buffer would not get what the fork wrote); else here, as Django
        does."""
        own_streams = all(getattr(wrapper, "_out", None) in (sys.stdout, sys.stderr)
                          for wrapper in (self.stdout, self.stderr))
        if threading.active_count() == 1 and own_streams and hasattr(os, "fork"):
            try:
                run_forked(check)
            except CheckProcessKilled as exc:  # not a verdict on the checks: run them here
                self.stderr.write(f"runworkers: the start-up checks' process was killed by "
                                  f"{exc.signal_name}; running the checks in this process.")
                check()
        else:
            check()

    def _unapplied_migrations(self, using: str) -> None:
        from django.db import DatabaseError, InterfaceError, OperationalError, connections
        from django.db.migrations.executor import MigrationExecutor

        try:
            executor = MigrationExecutor(connections[using])
            plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
        except (OperationalError, InterfaceError):  # cannot reach it: tried again
            raise
        except DatabaseError as exc:
            raise CommandError(f"Cannot read database {using!r}'s migrations: {exc}") from exc
        if plan:
            apps = sorted({migration.app_label for migration, _ in plan})
            raise CommandError(
                f"Database {using!r} has {len(plan)} unapplied migration(s) for "
                f"{', '.join(apps)}; run 'manage.py migrate' first."
            )

    def _configure_logging(self, verbosity: int, log_format: str = "text") -> None:
        logger = logging.getLogger("django_dbworker")
        logger.setLevel(LEVELS.get(verbosity, logging.DEBUG))
        if log_format == "json":
            # JSON was asked for: our own handlers get the JSON formatter, or we add one
            # that does not also pass the records on to text handlers above.
            if not logger.handlers:
                logger.addHandler(logging.StreamHandler(sys.stderr))
                logger.propagate = False
            for handler in logger.handlers:
                handler.setFormatter(JsonFormatter())
            return
        if not logger.handlers and not logging.getLogger().handlers:
            handler = logging.StreamHandler(sys.stderr)
            # On a terminal, clear the progress line before a log line is written over it.
            clear = "\r\033[K" if sys.stderr.isatty() and sys.stdout.isatty() else ""
            handler.setFormatter(
                logging.Formatter(clear + "%(asctime)s %(levelname)s %(message)s")
            )
            logger.addHandler(handler)
