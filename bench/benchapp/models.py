from django.db import models


class Row(models.Model):
    """A source row: the queue of the benchmark workers."""

    #: Another indexed column to order by (the ``by_priority`` worker).
    priority = models.IntegerField(db_index=True)
    payload = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"row {self.pk}"


class Job(models.Model):
    """The throughput benchmark's source row: one worker only, so each unit is one run."""

    payload = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"job {self.pk}"


class Ping(models.Model):
    """The latency benchmark's source row: its handler notes when it started."""

    #: time.time() when the handler started (written by the handler).
    started = models.FloatField(null=True)

    def __str__(self) -> str:
        return f"ping {self.pk}"


class Feed(models.Model):
    """The row_feeds benchmark's source row, written the ways users write rows: one worker
    only, declared as a user would (``concurrency=2``)."""

    payload = models.CharField(max_length=64, default="")

    def __str__(self) -> str:
        return f"feed {self.pk}"
