"""``django.tasks`` tasks, run by the same ``runworkers`` as the workers: a notice when an
upload duplicates an earlier one, and a daily digest on a cron schedule."""

from datetime import timedelta

from django.conf import settings
from django.core.mail import send_mail
from django.db.models import Count, Q
from django.tasks import task
from django.utils import timezone

from django_dbworker import ExecutionStatus, cron, execution_status, has_execution_status

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
@cron("0 8 * * *", name="daily_digest", misfire="latest", misfire_window=timedelta(hours=6))
@task
def daily_digest() -> dict:
    since = timezone.now() - timedelta(days=1)
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
