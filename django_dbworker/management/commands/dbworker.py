"""``manage.py dbworker``: look at and fix background work. Parses options only; the work is
in ``django_dbworker.cli``. ``--json`` prints one document (docs/cli.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.core.serializers.json import DjangoJSONEncoder
from django.db import OperationalError
from django.utils.module_loading import autodiscover_modules

from django_dbworker import conf
from django_dbworker.cli import (
    OperationError,
    changes,
    pauses,
    render,
    reports,
    schedules,
    triggers,
    workflows,
)
from django_dbworker.db import engine, errors
from django_dbworker.db.connections import own_process

#: The version of every JSON document but those whose meaning changed since
#: (``reports.LISTINGS``; docs/cli.md).
SCHEMA_VERSION = 1
#: The largest --limit (a database LIMIT must fit its integer).
MAX_LIMIT = 2**31 - 1


class Command(BaseCommand):
    help = ("Inspect and fix background work: inspect, stats, failed, dead, supervisors, "
            "retry, reset, cancel, purge, prune, vacuum, triggers, schedules, pause, resume, "
            "paused, workflow, workflows. "
            "'manage.py dbworker SUBCOMMAND --help' for each.")

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="subcommand", required=True, metavar="SUBCOMMAND")

        def add(name: str, help_text: str, *, changes_rows: bool = False) -> CommandParser:
            p = sub.add_parser(name, help=help_text, description=help_text)
            p.add_argument("--json", action="store_true",
                           help="Print one JSON document instead of tables.")
            if changes_rows:
                p.add_argument("--yes", action="store_true",
                               help="Do not ask before changing anything.")
            return p

        add("inspect", "Supervisors and what they run; with IDs, those units in full.") \
            .add_argument("ids", nargs="*", metavar="ID")
        p = add("stats", "Counts by status, lag, throughput and failures.")
        self._names(p)
        p.add_argument("--exact", action="store_true",
                       help="Count every status exactly (a scan of the whole tables; JSON "
                            "version 1). Without it counts stop at 10000 (\"at_least\").")
        for name, help_text in (
                ("failed", "Executions and tasks that failed: first those that will be tried "
                 "again (tasks RETRYING, units given back after a crash), next try first, "
                 "then those FAILED for good, newest first."),
                ("dead", "Executions and tasks that FAILED for good (no retries left), "
                 "newest first.")):
            p = add(name, help_text)
            self._names(p)
            p.add_argument("--limit", type=int, default=50, help="At most this many of each.")
            p.add_argument("--tracebacks", action="store_true", help="Show tracebacks too.")
            if name == "failed":
                p.add_argument("--retrying", action="store_true",
                               help="Only those that will be tried again (the JSON document "
                               "of version 1).")
        add("supervisors", "Supervisors of the last day and what they run; --dead: those that "
            "died (stopped beating without stopping) and what became of their units.") \
            .add_argument("--dead", action="store_true", help="Only the dead ones.")
        add("retry", "Run failed executions and failed or cancelled tasks again.",
            changes_rows=True).add_argument("ids", nargs="+", metavar="ID")
        p = add("reset", "Run a worker again on source rows where it FAILED.", changes_rows=True)
        p.add_argument("worker", metavar="WORKER")
        p.add_argument("pks", nargs="+", metavar="PK")
        p.add_argument("--finished", action="store_true",
                       help="Also reset rows where the worker FINISHED (reprocess).")
        add("cancel", "Cancel waiting or running tasks.", changes_rows=True) \
            .add_argument("ids", nargs="+", metavar="ID")
        p = add("purge", "Delete waiting tasks (READY, WAITING, RETRYING).", changes_rows=True)
        p.add_argument("--queue", action="append", dest="queues", metavar="QUEUE",
                       help="Only this queue (repeatable; default: every queue).")
        p = add("prune", "Delete finished tasks and old supervisor rows.", changes_rows=True)
        p.add_argument("--older-than", type=float, default=None, metavar="SECONDS",
                       help="Default: DBWORKER['RETENTION'].")
        p = add("triggers", "Database triggers that make new rows pending in their writer's "
                "transaction: status (default), install, remove.")
        p.add_argument("action", nargs="?", default="status", choices=triggers.ACTIONS)
        p.add_argument("--worker", action="append", dest="workers", metavar="WORKER",
                       help="Only this worker (repeatable; default: every worker).")
        for name, help_text in (
                ("pause", "Stop claiming from a task queue or a row worker until resumed."),
                ("resume", "Claim from a paused task queue or row worker again.")):
            p = add(name, help_text)
            which = p.add_mutually_exclusive_group(required=True)
            which.add_argument("--queue", metavar="QUEUE", help="A task queue.")
            which.add_argument("--worker", metavar="WORKER", help="A row worker.")
            if name == "pause":
                p.add_argument("--reason", default="", help="Shown with the pause.")
        add("paused", "The paused task queues and row workers, and since when.")
        p = add("workflow", "A workflow (or enqueue_many batch): progress, members and "
                "their dependencies with statuses.")
        p.add_argument("id", metavar="ID")
        p.add_argument("--limit", type=int, default=1000, help="At most this many members.")
        p = add("workflows", "The most recent workflows and their progress.")
        p.add_argument("--limit", type=int, default=50, help="At most this many.")

        p = add("vacuum", "Give the disk space of pruned rows back: VACUUM (SQLite: the file, "
                "then incremental auto-vacuum; PostgreSQL: our tables), ANALYZE TABLE on "
                "MariaDB/MySQL; --full: VACUUM FULL / OPTIMIZE TABLE (locks the tables).",
                changes_rows=True)
        p.add_argument("--full", action="store_true",
                       help="Rewrite the tables to give all free space back (locks them).")
        schedules.arguments(add("schedules", "Cron schedules (code-declared and stored) and "
                                "their next run; add, edit, enable, disable, remove stored ones."))

    def _names(self, parser: CommandParser) -> None:
        parser.add_argument("--worker", action="append", dest="workers", metavar="WORKER")
        parser.add_argument("--queue", action="append", dest="queues", metavar="QUEUE")

    def handle(self, *args: Any, **options: Any) -> None:
        autodiscover_modules("tasks")
        name = options["subcommand"]
        # SQLite: transactions take the write lock when they begin and wait for it (up to
        # SQLITE_BUSY_TIMEOUT), as runworkers' do; a deferred one that read first would fail
        # at once with "database is locked" beside running supervisors (check W001).
        own_process(conf.get().DATABASE)
        try:
            self._run(name, options)
        except OperationalError as exc:
            using = conf.get().DATABASE
            if engine(using).concurrent_writers or not errors.transient(exc, using):
                raise
            raise CommandError(
                f"The database is locked: another process held its write lock longer than "
                f"DBWORKER['SQLITE_BUSY_TIMEOUT'] ({conf.get().SQLITE_BUSY_TIMEOUT:g} s); "
                "run the command again, or raise SQLITE_BUSY_TIMEOUT; "
                "give the database 'OPTIONS': {'transaction_mode': 'IMMEDIATE'} so that "
                "every process waits its turn (system check django_dbworker.W001).") from exc

    def _run(self, name: str, options: dict[str, Any]) -> None:
        try:
            if name in ("retry", "reset", "cancel", "purge", "prune"):
                self._change(name, options)
            elif name == "schedules":
                doc = schedules.run(options, lambda q: self._confirm(q, options["json"]))
                self._print(name, doc, schedules.render, options["json"])
            elif name in ("pause", "resume"):
                self._pause(name, options)
            elif name == "vacuum":
                self._vacuum(options)
            else:
                self._report(name, options)
        except OperationError as exc:
            raise CommandError(str(exc)) from None

    # ----- reports ----------------------------------------------------------------------

    def _report(self, name: str, options: dict[str, Any]) -> None:
        text: Callable[[dict[str, Any]], str]
        version = SCHEMA_VERSION
        if name == "inspect":
            doc, text = reports.inspect(options["ids"]), render.inspect
        elif name == "stats":
            exact = options.get("exact", False)
            doc = reports.stats(options["workers"], options["queues"], exact=exact)
            text, version = render.stats, reports.STATS_VERSIONS[exact]
        elif name in ("failed", "dead"):
            self._limit(options)
            listing = "retrying" if options.get("retrying") else name
            doc = reports.failures(options["workers"], options["queues"],
                                   limit=options["limit"], traceback=options["tracebacks"],
                                   listing=listing)
            version = reports.LISTINGS[listing]

            def failures_text(d: dict[str, Any]) -> str:
                return render.failures(d, options["tracebacks"], listing=listing)
            text = failures_text
        elif name == "triggers":
            doc = triggers.triggers(options["action"], options["workers"])
            text = render.triggers
        elif name == "paused":
            doc, text = pauses.paused(), render.paused
        elif name == "workflow":
            self._limit(options)
            doc = workflows.workflow(options["id"], options["limit"])
            text = workflows.render_workflow
        elif name == "workflows":
            self._limit(options)
            doc, text = workflows.workflows(options["limit"]), workflows.render_workflows
        else:
            dead = options["dead"]
            doc = reports.supervisors(dead=dead)

            def supervisors_text(d: dict[str, Any]) -> str:
                return render.supervisor_list(d, dead=dead)
            text = supervisors_text
        self._print(name, doc, text, options["json"], version=version)

    def _limit(self, options: dict[str, Any]) -> None:
        if not 0 <= options["limit"] <= MAX_LIMIT:
            raise CommandError(f"--limit {options['limit']}: give a whole number from 0 "
                               f"to {MAX_LIMIT}.")

    # ----- changes ----------------------------------------------------------------------

    def _change(self, name: str, options: dict[str, Any]) -> None:
        if name == "retry":
            plan = changes.retry(options["ids"])
        elif name == "reset":
            plan = changes.reset(options["worker"], options["pks"],
                                 finished=options["finished"])
        elif name == "cancel":
            plan = changes.cancel(options["ids"])
        elif name == "purge":
            plan = changes.purge(options["queues"])
        else:
            plan = changes.prune(options["older_than"])
        as_json = options["json"]
        if plan.count and not options["yes"]:
            self._ask(plan, as_json)
        if options["verbosity"] >= 1 and plan.count > changes.BATCH:
            # A change of more than one batch says how far it is, on stderr.
            plan.progress = lambda done: self.stderr.write(
                f"{name}: {done:,} of {plan.count:,} done")
        changed = plan.apply() if plan.count else 0
        doc = plan.as_dict(changed)
        self._print(name, doc, lambda d: render.plan(d) + f"\nChanged {d['changed']}.",
                    as_json)

    def _pause(self, name: str, options: dict[str, Any]) -> None:
        if name == "pause":
            doc = pauses.pause(options["queue"], options["worker"], options["reason"])
        else:
            doc = pauses.resume(options["queue"], options["worker"])
        self._print(name, doc, getattr(render, name), options["json"])

    def _vacuum(self, options: dict[str, Any]) -> None:
        from django_dbworker.db import space

        using = conf.get().DATABASE
        if options["full"] and not options["yes"]:
            self._confirm("VACUUM FULL / OPTIMIZE TABLE rewrites django-dbworker's tables and "
                          "locks each while it does (no claim or enqueue meanwhile).\n",
                          options["json"])
        try:
            doc = space.vacuum(using, full=options["full"])
        except space.VacuumInTransaction as exc:
            raise CommandError(str(exc)) from None
        self._print("vacuum", doc, render.vacuum, options["json"])

    def _ask(self, plan: changes.Plan, as_json: bool) -> None:
        self._confirm(render.plan(plan.as_dict(None)), as_json)

    def _confirm(self, question: str, as_json: bool) -> None:
        # With --json, stdout carries only the document: the question goes to stderr.
        out = self.stderr if as_json else self.stdout
        out.write(question)
        out.write("Go ahead? [y/N] ", ending="")
        out.flush()
        try:
            answer = input()
        except EOFError:
            answer = ""
        if answer.strip().lower() not in ("y", "yes"):
            raise CommandError("Nothing was changed: not confirmed. Answer 'y', or pass --yes "
                               "to change without asking.")

    def _print(self, name: str, doc: dict[str, Any], text: Any, as_json: bool, *,
               version: int = SCHEMA_VERSION) -> None:
        if as_json:
            document = {"command": name, "version": version, **doc}
            self.stdout.write(json.dumps(document, cls=DjangoJSONEncoder, indent=2))
        else:
            self.stdout.write(text(doc))
