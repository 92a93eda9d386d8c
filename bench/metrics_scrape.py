"""What one scrape of ``dbworker/metrics/`` costs: the view through Django's test client.

Uses the test suite's settings and a test database of its own (created and dropped here),
fills it with finished, failed and waiting units, then times ``--scrapes`` GETs.

    DBWORKER_TEST_DB=sqlite|postgres PYTHONPATH=. .venv/bin/python bench/metrics_scrape.py
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test import Client  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.urls import reverse  # noqa: E402


def fill(rows: int) -> None:
    from django_dbworker.testing import run_until_idle
    from tests.testapp import tasks
    from tests.testapp.models import Item

    Item.objects.bulk_create([Item(action="raise" if i % 10 == 0 else "ok")
                              for i in range(rows)])
    for i in range(rows):
        tasks.add.enqueue(i, 1)
    run_until_idle()
    Item.objects.bulk_create([Item() for _ in range(rows // 10)])  # waiting
    for i in range(rows // 10):
        tasks.add.enqueue(i, 2)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--no-process", action="store_true",
                        help='DBWORKER["METRICS_PROCESS"] = False')
    args = parser.parse_args()
    setup_test_environment()
    if args.no_process:
        from django.conf import settings

        settings.DBWORKER = {**settings.DBWORKER, "METRICS_PROCESS": False}
    name = connection.creation.create_test_db(verbosity=0)
    try:
        fill(args.rows)
        client, url = Client(), reverse("django_dbworker:metrics")
        assert client.get(url).status_code == 200
        times = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            response = client.get(url)
            times.append(time.perf_counter() - start)
        assert response.status_code == 200
        print(f"{connection.vendor}: {args.scrapes} scrapes, {args.rows} rows: "
              f"median {statistics.median(times) * 1e3:.2f} ms, "
              f"p95 {sorted(times)[int(len(times) * 0.95)] * 1e3:.2f} ms, "
              f"{len(response.content)} bytes, "
              f"{response.content.count(b'\n') } lines")
    finally:
        connection.creation.destroy_test_db(name, verbosity=0)


if __name__ == "__main__":
    main()
