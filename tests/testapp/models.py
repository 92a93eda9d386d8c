import uuid

from django.db import models


class Item(models.Model):
    """A source row whose ``action`` tells the test handlers what to do."""

    kind = models.CharField(max_length=20, default="touch")
    action = models.CharField(max_length=100, default="ok")
    enabled = models.BooleanField(default=True)
    rank = models.IntegerField(default=0)
    steps = models.IntegerField(default=0)

    class Meta:
        ordering = ["id"]


class Effect(models.Model):
    """Written by handlers inside their transaction: one row per committed run."""

    item_id = models.BigIntegerField()
    worker = models.CharField(max_length=50)
    pid = models.IntegerField(default=0)
    note = models.CharField(max_length=100, blank=True, default="")


class Document(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    title = models.CharField(max_length=50)


class Tag(models.Model):
    code = models.CharField(max_length=20, primary_key=True)


class Solo(models.Model):
    """A source row with one worker only (``solo``): a transactional unit whose completion
    commits in its own query on PostgreSQL (no sibling workers to write for after it)."""

    action = models.CharField(max_length=100, default="ok")


class Ranked(models.Model):
    """Source rows of the eligible-order workers (``rank_pk``, ``rank_up``, ``rank_down``):
    no other worker reads them, so their executions count only there."""

    rank = models.IntegerField(default=0)


class Slow(models.Model):
    """Source rows of ``slow_eligible``, whose eligible queryset sleeps inside the database
    on every claim (``DBWORKER_TEST_SLOW_ELIGIBLE`` seconds) and never lets a row through:
    the claim that holds up a supervisor's loop (tests/test_renewer.py)."""


class Awaiting(models.Model):
    """A source row that waits for a task (``has_task_status``, tests/test_workflow_rows.py):
    the task's id as a UUID, or as the text ``result.id`` gives."""

    task_id = models.UUIDField(null=True, blank=True)
    task_text = models.CharField(max_length=64, blank=True, default="")
