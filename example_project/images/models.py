"""Uploaded images (the queue of both workers), what prepare_image makes of them, and the
duplicate pairs compare_images finds."""

from django.db import models
from django.utils import timezone


class Image(models.Model):
    """An upload. Its rows are the queue: saving one makes it pending for both workers."""

    name = models.CharField(max_length=200)
    file = models.FileField(upload_to="uploads/%Y/%m/%d/")
    uploaded_at = models.DateTimeField(default=timezone.now)
    #: The client's Idempotency-Key: a retried upload with the same key is the same image.
    upload_key = models.CharField(max_length=255, null=True, blank=True, unique=True)
    #: The django.tasks result id of this image's notify_duplicates task.
    notify_task_id = models.CharField(max_length=64, blank=True, default="")

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"


class Artifact(models.Model):
    """What prepare_image computed: size, perceptual hash and a thumbnail."""

    image = models.OneToOneField(Image, on_delete=models.CASCADE, related_name="artifact")
    width = models.PositiveIntegerField()
    height = models.PositiveIntegerField()
    format = models.CharField(max_length=20)
    #: 64-bit difference hash as 16 hex digits: similar pictures differ in few bits.
    dhash = models.CharField(max_length=16)
    thumbnail = models.BinaryField()  # a small PNG
    #: compare_images' cursor: this image was compared with earlier images up to this id.
    compared_up_to = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.image} {self.width}x{self.height} {self.dhash}"


class DuplicatePair(models.Model):
    """``image`` looks like the earlier upload ``original``."""

    image = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="duplicates")
    original = models.ForeignKey(Image, on_delete=models.CASCADE, related_name="+")
    #: Bits in which the two hashes differ (0-64); small means alike.
    distance = models.PositiveSmallIntegerField()
    found_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["image", "original"], name="images_pair_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.image} ~ {self.original} ({self.distance})"
