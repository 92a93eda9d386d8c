"""``django.tasks`` tasks, run by the same ``runworkers`` as the workers: a notice when an
upload duplicates an earlier one, and a daily digest on a cron schedule, sent once the
day's images have all been prepared and compared (a workflow: tasks waiting for rows)."""

from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import Count, Q
from django.tasks import task
from django.utils import timezone

from django_dbworker import (
    ExecutionStatus,
    after_row,
    cron,
    execution_status,
    has_execution_status,
)

from .models import DuplicatePair, Image

FINISHED, FAILED = ExecutionStatus.FINISHED, ExecutionStatus.FAILED


class ComparisonPending(Exception):
    """compare_images has not finished the image yet: the task is retried later."""


# Enqueued by uploads.accept() for every upload. It cannot know yet whether the image is a
# duplicate, so it waits by failing with ComparisonPending, which is retried (after 1, 2,
# 4, 5, 5, ... seconds); any other exception fails the task at once.
@task(retries=30, retry_delay=1, retry_backoff=True, retry_max_delay=5,
      retry_for=(ComparisonPending,))
def notify_duplicates(image_id: int) -> dict:
    image = Image.objects.filter(pk=image_id).first()
    if image is None or execution_status(worker="prepare_image", source_id=image_id) == FAILED:
        return {"duplicates": 0, "emailed": False}  # deleted, or not an image at all
    if execution_status(worker="compare_images", source_id=image_id) != FINISHED:
        raise ComparisonPending(f"image {image_id} has not been compared yet")
    pairs = list(image.duplicates.select_related("original").order_by("original_id"))
    if pairs:
        lines = [f"- #{p.original.pk} {p.original.name} (distance {p.distance})" for p in pairs]
        send_mail(
            subject=f"Duplicate upload: {image.name}",
            message=f"#{image.pk} {image.name} looks like:\n" + "\n".join(lines),
            from_email=None,
            recipient_list=[settings.IMAGES_NOTIFY_EMAIL],
        )
    return {"duplicates": len(pairs), "emailed": bool(pairs)}


# Every day at 08:00 (TIME_ZONE). A tick missed while no runworkers ran is sent late if it
# is at most six hours old ("latest"), and only once however many runworkers there are.
# The digest itself waits for the day's work (docs/workflows.md): a workflow of two steps.
@cron("0 8 * * *", name="daily_digest", misfire="latest", misfire_window=timedelta(hours=6))
@task
def daily_digest() -> dict:
    """Start the report on the last 24 hours' uploads: it is sent once every one of them
    has been prepared (or found not to be a picture) and every picture among them has been
    compared with the earlier ones."""
    since = timezone.now() - timedelta(days=1)
    images = list(Image.objects.filter(uploaded_at__gte=since).only("pk"))
    # Step 1 waits for prepare_image on every image of the day, whatever its outcome
    # (run_on_failure: a file that is not a picture must not cancel the report).
    step = wait_for_comparisons.using(
        after=[after_row("prepare_image", image) for image in images], run_on_failure=True,
    ).enqueue(since.isoformat())
    return {"images": len(images), "next": step.id}


@task
def wait_for_comparisons(since: str) -> dict:
    """Every image of the day has been prepared: now the report waits for compare_images
    on each picture among them (compare_images only ever runs on a prepared image)."""
    pictures = list(Image.objects.filter(uploaded_at__gte=since).filter(
        has_execution_status(worker="prepare_image", statuses=[FINISHED]),
    ).only("pk"))
    report = send_digest.using(
        after=[after_row("compare_images", image) for image in pictures], run_on_failure=True,
    ).enqueue(since)
    return {"pictures": len(pictures), "next": report.id}


@task
def send_digest(since: str) -> dict:
    """The report: every image of the day has been prepared and compared."""
    counts = Image.objects.filter(uploaded_at__gte=since).aggregate(
        uploaded=Count("pk"),
        prepared=Count("pk", filter=Q(has_execution_status(worker="prepare_image",
                                                           statuses=[FINISHED]))),
        failed=Count("pk", filter=Q(has_execution_status(worker="prepare_image",
                                                         statuses=[FAILED]))),
    )
    counts["duplicates"] = DuplicatePair.objects.filter(found_at__gte=since).count()
    send_mail(
        subject=f"Images of the last 24 hours: {counts['uploaded']} uploaded",
        message="\n".join(f"{name}: {n}" for name, n in counts.items()),
        from_email=None,
        recipient_list=[settings.IMAGES_NOTIFY_EMAIL],
    )
    return counts
