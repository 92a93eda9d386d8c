"""Storing an upload: the one way in, shared by the page, the JSON API and the sample
command."""

from django.core.files import File
from django.db import transaction

from .models import Image
from .tasks import notify_duplicates


def accept(file: File, *, key: str | None = None) -> tuple[Image, bool]:
    """Store ``file`` as an Image; (image, created). An earlier upload with ``key`` is
    returned instead of storing the file again."""
    name = (file.name or "upload").rsplit("/", 1)[-1][:200]
    with transaction.atomic():
        if key is None:
            image, created = Image.objects.create(name=name, file=file), True
        else:
            image, created = Image.objects.get_or_create(
                upload_key=key, defaults={"name": name, "file": file}
            )
        # Saving the image made it a pending unit for both workers, in this transaction.
        # The task is stored in this transaction too: the image and its task commit
        # together, or neither does. Its key makes this safe to repeat: a retried upload
        # gets the task it already has instead of a second one.
        result = notify_duplicates.using(
            idempotency_key=f"notify-duplicates:{image.pk}"
        ).enqueue(image.pk)
        if image.notify_task_id != result.id:
            Image.objects.filter(pk=image.pk).update(notify_task_id=result.id)
            image.notify_task_id = result.id
    return image, created
