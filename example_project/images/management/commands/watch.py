"""``manage.py watch``: print how the images stand whenever that changes."""

import json
import time
import urllib.error
import urllib.request

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count, Q
from django.tasks import TaskResultStatus, default_task_backend

from django_dbworker import ExecutionStatus, has_execution_status
from images import samples
from images.models import DuplicatePair, Image
from images.views import WORKERS


def status_counts() -> dict[str, int]:
    """Images per worker and status, in one query (the status expressions aggregate too)."""
    return Image.objects.aggregate(images=Count("pk"), **{
        f"{worker}_{status.value.lower()}": Count("pk", filter=Q(
            has_execution_status(worker=worker, statuses=[status])))
        for worker in WORKERS for status in ExecutionStatus
    })


class Command(BaseCommand):
    help = ("Print the images' progress whenever it changes, until Ctrl-C. With --check, "
            "exit 0 once the planted duplicates are found and all work is done, or 1 after "
            "--timeout seconds.")

    def add_arguments(self, parser):
        parser.add_argument("--check", action="store_true")
        parser.add_argument("--timeout", type=float, default=120.0)
        parser.add_argument("--url", help="With --check: also check that the page and the "
                                          "JSON API served here show the planted duplicates, "
                                          "and that its health check and metrics answer.")
        parser.add_argument("--interval", type=float, default=0.5)

    def handle(self, *args, check, timeout, url, interval, **options):
        self.started = time.monotonic()
        shown, seen = "", set()
        try:
            while True:
                counts = status_counts()
                line = self.summary(counts)
                if line != shown:
                    self.say(line)
                    shown = line
                for pair in (DuplicatePair.objects.exclude(pk__in=seen)
                             .select_related("image", "original").order_by("pk")):
                    seen.add(pair.pk)
                    self.say(f"duplicate: #{pair.image.pk} {pair.image.name} looks like "
                             f"#{pair.original.pk} {pair.original.name} "
                             f"(distance {pair.distance})")
                if check and self.all_done(counts):
                    if url:
                        self.check_served(url.rstrip("/"))
                    self.say(f"all {len(samples.PLANTED)} planted duplicates found, every "
                             "image prepared and compared, every notice task done"
                             + (f"; {url} shows them" if url else ""))
                    return
                if check and time.monotonic() - self.started > timeout:
                    raise CommandError(f"--check: not done after {timeout:g}s: {line}")
                time.sleep(interval)
        except KeyboardInterrupt:
            return

    def say(self, text: str) -> None:
        self.stdout.write(f"[{time.monotonic() - self.started:6.1f}s] {text}")
        self.stdout.flush()

    def summary(self, counts: dict[str, int]) -> str:
        parts = [f"{counts['images']} images"]
        for worker in WORKERS:
            by_status = [f"{counts[f'{worker}_{s.value.lower()}']} {s.value.lower()}"
                         for s in ExecutionStatus if counts[f"{worker}_{s.value.lower()}"]]
            waiting = counts["images"] - sum(counts[f"{worker}_{s.value.lower()}"]
                                             for s in ExecutionStatus)
            by_status += [f"{waiting} without status"] if waiting else []
            parts.append(f"{worker}: {', '.join(by_status)}")
        parts.append(f"{DuplicatePair.objects.count()} duplicate pairs")
        return " | ".join(parts)

    def all_done(self, counts: dict[str, int]) -> bool:
        found = {frozenset({p.image.name, p.original.name})
                 for p in DuplicatePair.objects.select_related("image", "original")}
        settled = counts["compare_images_finished"] + counts["prepare_image_failed"]
        if not samples.planted_pairs() <= found or settled < counts["images"]:
            return False
        finished = (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
        return all(default_task_backend.get_result(task_id).status in finished
                   for task_id in Image.objects.values_list("notify_task_id", flat=True))

    def check_served(self, url: str) -> None:
        with urllib.request.urlopen(f"{url}/api/duplicates/", timeout=10) as response:
            pairs = json.load(response)["duplicates"]
        served = {frozenset({p["image"]["name"], p["original"]["name"]}) for p in pairs}
        with urllib.request.urlopen(f"{url}/", timeout=10) as response:
            page = response.read().decode()
        missing = [sorted(pair) for pair in samples.planted_pairs()
                   if pair not in served or not all(name in page for name in pair)]
        if missing:
            raise CommandError(f"--check: {url} does not show the planted duplicates {missing}")
        try:
            with urllib.request.urlopen(f"{url}/dbworker/health/", timeout=10) as response:
                health = json.load(response)
            with urllib.request.urlopen(f"{url}/dbworker/metrics/", timeout=10) as response:
                metrics = response.read().decode()
        except urllib.error.HTTPError as exc:  # health: 503 without a live runworkers
            raise CommandError(f"--check: {exc.url} answered {exc.code}: "
                               f"{exc.read().decode()[:500]}") from exc
        if "dbworker_executions{" not in metrics:
            raise CommandError(f"--check: {url}/dbworker/metrics/ has no executions: {metrics}")
        if not health["healthy"]:
            raise CommandError(f"--check: {url}/dbworker/health/ says {health}")
