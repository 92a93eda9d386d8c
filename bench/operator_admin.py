"""What the admin's pages cost as the tables grow (issue 39): each changelist with its
filters, search, a deep page and "show counts", a ``WorkerStatusMixin`` list filtered by
status, and the dashboard, at each size, on fresh tables and after ``VACUUM ANALYZE``.

Each size is a fresh PostgreSQL database: ``size`` source rows (``benchapp_row``) with an
execution each of ``by_pk`` (the older half FINISHED, every 1,000th of them FAILED with
its Failure, the newest half PENDING) and ``size`` tasks (the older half SUCCESSFUL, every
1,000th FAILED, the rest READY), loaded with set-based SQL into the product's own tables
and indexes. Each page is fetched ``--runs`` times through Django's test client as a
superuser (the median is kept). ``--code DIR`` measures the django_dbworker found in
``DIR`` instead (``git archive <commit> django_dbworker | tar -x -C DIR``: the "before").

    PYTHONPATH=. .venv/bin/python bench/operator_admin.py --sizes 10000 1000000 --label after
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import benchlib  # noqa: E402

#: A page's fetch gives up after this (the slowest "before" pages took 20 s and more).
TIMEOUT_S = 60


def pages(size: int) -> dict[str, str]:
    deep = max(size // 50 // 2, 1)  # the middle of the list (the page 10,104)
    e, t = "/admin/django_dbworker/execution/", "/admin/django_dbworker/taskrecord/"
    return {
        "dashboard": "/admin/django_dbworker/dashboard/",
        "executions": e,
        "executions FAILED": f"{e}?state__exact=FAILED",
        "executions worker+FAILED+exception": (f"{e}?worker=by_pk&state__exact=FAILED"
                                               "&exception=builtins.ValueError"),
        "executions search": f"{e}?q={size // 3}",
        "executions deep page": f"{e}?p={deep}",
        "tasks": t,
        "tasks READY": f"{t}?status__exact=READY",
        "tasks FAILED": f"{t}?status__exact=FAILED",
        "tasks search path": f"{t}?q=benchapp.tasks.noop",
        "tasks deep page": f"{t}?p={deep}",
        "tasks show counts": f"{t}?_facets=True",
        "mixin FAILED": "/admin/benchapp/row/?dbworker_by_pk=FAILED",
    }


def configure(code: str | None) -> None:
    """bench_settings plus the admin, then Django set up and migrated."""
    if code:
        sys.path.insert(0, code)
    os.environ["DJANGO_SETTINGS_MODULE"] = "bench_settings"
    import bench_settings as s

    s.INSTALLED_APPS = ["django.contrib.admin", "django.contrib.auth",
                        "django.contrib.contenttypes", "django.contrib.sessions",
                        "django.contrib.messages", *s.INSTALLED_APPS]
    s.MIDDLEWARE = ["django.contrib.sessions.middleware.SessionMiddleware",
                    "django.contrib.auth.middleware.AuthenticationMiddleware",
                    "django.contrib.messages.middleware.MessageMiddleware"]
    s.TEMPLATES = [{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True, "OPTIONS": {"context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages"]}}]
    s.ROOT_URLCONF = "operator_admin"
    s.ALLOWED_HOSTS = ["*"]
    s.STATIC_URL = "/static/"
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    import django_dbworker

    print(f"  code: {Path(django_dbworker.__file__).parent}", file=sys.stderr)


def __getattr__(name: str) -> Any:
    """The URLconf (this module, imported by Django): the admin, with a WorkerStatusMixin
    admin of benchapp's Row."""
    if name != "urlpatterns":
        raise AttributeError(name)
    from benchapp.models import Row
    from django.contrib import admin
    from django.urls import path

    from django_dbworker.admin import WorkerStatusMixin

    if not admin.site.is_registered(Row):
        admin.site.register(Row, type("RowAdmin", (WorkerStatusMixin, admin.ModelAdmin),
                                      {"dbworker_workers": ["by_pk"]}))
    return [path("admin/", admin.site.urls)]


def load(size: int) -> None:
    from django.db import connection

    spec = importlib.util.spec_from_file_location("operator_bench", BENCH / "operator.py")
    assert spec and spec.loader
    operator_bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(operator_bench)
    benchlib.load_rows(size)
    benchlib.load_executions("by_pk", size, pending=size // 2)
    operator_bench.load_tasks(size)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE django_dbworker_execution SET state = 'FAILED' "
                       "WHERE state = 'FINISHED' AND id % 1000 = 0")
        cursor.execute("INSERT INTO django_dbworker_failure (execution_id, attempt, "
                       "exception_class, message, traceback, occurred_at) SELECT id, 1, "
                       "'builtins.ValueError', 'broken', '', now() FROM "
                       "django_dbworker_execution WHERE state = 'FAILED'")
        cursor.execute("UPDATE django_dbworker_taskrecord SET status = 'FAILED' "
                       "WHERE status = 'SUCCESSFUL' AND ('x' || substr(id::text, 1, 8))"
                       "::bit(32)::int % 1000 = 0")


def analyze() -> None:
    """VACUUM ANALYZE of every table the pages read."""
    from django.db import connection

    benchlib.analyze()
    with connection.cursor() as cursor:
        for table in ("django_dbworker_taskrecord", "django_dbworker_failure"):
            cursor.execute(f"VACUUM (ANALYZE) {table}")


def measure(client: Any, size: int, runs: int) -> dict[str, Any]:
    from django.core.signals import request_finished, request_started
    from django.db import OperationalError, close_old_connections, connection

    # One connection throughout, so that its statement_timeout holds.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)

    found: dict[str, Any] = {}
    for name, url in pages(size).items():
        times, status = [], None
        for _ in range(runs):
            start = time.perf_counter()
            try:
                with connection.cursor() as cursor:
                    cursor.execute(f"SET statement_timeout = '{TIMEOUT_S}s'")
                status = client.get(url).status_code
            except OperationalError:
                status = f"timeout {TIMEOUT_S} s"
            times.append(time.perf_counter() - start)
            if status != 200:
                break
        found[name] = {"median_s": round(statistics.median(times), 4),
                       "runs_s": [round(t, 4) for t in times], "status": status}
        print(f"    {name}: {found[name]['median_s']:.4f} s ({status})", file=sys.stderr,
              flush=True)
    return found


def child(size: int, runs: int, out: str, code: str | None) -> None:
    with benchlib.scratch_database("postgres", tag=f"admin{size}") as name:
        os.environ.update(benchlib.environment("postgres", name))
        configure(code)
        from django.contrib.auth.models import User
        from django.test import Client

        started = time.perf_counter()
        load(size)
        loaded = time.perf_counter() - started
        print(f"  {size}: loaded in {loaded:.1f} s", file=sys.stderr, flush=True)
        client = Client()
        client.force_login(User.objects.create_superuser("admin", "", "pw"))
        result = {"size": size, "load_s": round(loaded, 1), "fresh": measure(client, size, runs)}
        analyze()
        result["analyzed"] = measure(client, size, runs)
        Path(out).write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--label", default="after", help="before or after (the results' name)")
    parser.add_argument("--code", help="a folder holding the django_dbworker to measure")
    parser.add_argument("--child-size", type=int)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.child_size:
        child(args.child_size, args.runs, args.out, args.code)
        return
    code = ["--code", args.code] if args.code else []
    results = benchlib.per_size(__file__, args.sizes, ["--runs", str(args.runs), *code])
    names = list(pages(1))
    rows = [(name, *(f"{r[when][name]['median_s']:.3f}" for r in results
                     for when in ("fresh", "analyzed"))) for name in names]
    print(benchlib.markdown_table(
        ["page", *(f"{r['size']:,} {when}" for r in results for when in ("fresh", "analyzed"))],
        rows))
    benchlib.write_results(f"operator-admin-{args.label}.json", {
        "benchmark": "operator_admin", "db": "postgres", "label": args.label,
        "machine": benchlib.machine(), "results": results})


if __name__ == "__main__":
    main()
