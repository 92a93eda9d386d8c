"""The two workers. The images table is their queue: every uploaded Image is a unit of
work for each, run once by ``manage.py runworkers`` (this module is found at start-up
because it is called workers.py).

``prepare_image`` decodes the upload, hashes it and makes a thumbnail. ``compare_images``
may only run on an image that prepare_image has FINISHED, and compares it with the earlier
images a page at a time: ``Unfinished()`` after each page, ``Finished()`` after the last.
"""

import io

from django.db.models import Count, Q
from PIL import Image as Pillow
from PIL import ImageOps, UnidentifiedImageError

from django_dbworker import (
    ExecutionStatus,
    Finished,
    Unfinished,
    has_execution_status,
    set_progress,
    worker,
)

from .hashing import dhash, distance
from .models import Artifact, DuplicatePair, Image

THUMBNAIL_SIZE = (160, 160)
PAGE_SIZE = 10  # earlier images compared per call
MAX_DISTANCE = 10  # of 64 bits: closer than this is a duplicate


class NotAnImage(Exception):
    """The upload is not a picture Pillow can read."""


@worker(source=Image, concurrency=2, transactional=False)
def prepare_image(image: Image) -> Finished:
    # transactional=False: reading and decoding run outside any transaction (on SQLite a
    # transactional handler holds the write lock while it runs). The one write below is
    # idempotent, so a run cut off after it does no harm when it runs again.
    try:
        with image.file.open("rb") as f:
            picture = Pillow.open(f)
            picture.load()
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError) as exc:
        # Raising marks the execution FAILED and keeps this message for people to read.
        raise NotAnImage(
            f"{image.name!r} is not an image Pillow can read ({type(exc).__name__}); "
            "upload a PNG, JPEG, GIF or WebP file"
        ) from exc
    format = picture.format or ""
    picture = ImageOps.exif_transpose(picture)  # upright, as the camera meant it
    thumbnail = picture.convert("RGB")
    thumbnail.thumbnail(THUMBNAIL_SIZE)
    png = io.BytesIO()
    thumbnail.save(png, format="PNG")
    Artifact.objects.update_or_create(
        image=image,
        defaults={
            "width": picture.width,
            "height": picture.height,
            "format": format,
            "dhash": dhash(picture),
            "thumbnail": png.getvalue(),
        },
    )
    return Finished()


@worker(
    source=Image,
    # Dependent worker: an image becomes eligible once prepare_image has FINISHED it.
    eligible=lambda: Image.objects.filter(
        has_execution_status(worker="prepare_image", statuses=[ExecutionStatus.FINISHED])
    ),
    concurrency=2,
)
def compare_images(image: Image) -> Finished | Unfinished:
    # Transactional (the default): the pairs, the cursor and the new status commit together,
    # so a page cut off halfway is simply done again.
    mine = image.artifact
    earlier = Image.objects.filter(pk__lt=image.pk)
    page = (
        earlier.filter(pk__gt=mine.compared_up_to)
        .annotate(failed=has_execution_status(worker="prepare_image",
                                              statuses=[ExecutionStatus.FAILED]))
        .select_related("artifact")
        .defer("artifact__thumbnail")
        .order_by("pk")[:PAGE_SIZE]
    )
    waiting = False
    for other in page:
        theirs = getattr(other, "artifact", None)
        if theirs is None and not other.failed:
            waiting = True  # not prepared yet: come back for it in a second
            break
        if theirs is not None and (d := distance(mine.dhash, theirs.dhash)) <= MAX_DISTANCE:
            DuplicatePair.objects.get_or_create(image=image, original=other,
                                                defaults={"distance": d})
        mine.compared_up_to = other.pk
    mine.save(update_fields=["compared_up_to"])

    counts = earlier.aggregate(total=Count("pk"), done=Count("pk", filter=Q(
        pk__lte=mine.compared_up_to)))
    set_progress(100 * counts["done"] / max(counts["total"], 1),
                 f"compared with {counts['done']} of {counts['total']} earlier images")
    if waiting:
        return Unfinished(delay=1)
    if counts["done"] < counts["total"]:
        return Unfinished()  # call me again for the next page
    return Finished()
