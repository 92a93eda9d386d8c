from django.db import models
from django.utils import timezone


class Document(models.Model):
    """A source row: both workers in workers.py treat the documents table as their queue."""

    title = models.CharField(max_length=200)
    body = models.TextField(blank=True)
    created = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.title


class Summary(models.Model):
    """Written by count_words, in the same transaction as its FINISHED status."""

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="summaries")
    word_count = models.PositiveIntegerField()
    top_words = models.JSONField(default=list)

    class Meta:
        verbose_name_plural = "summaries"

    def __str__(self) -> str:
        return f"{self.document}: {self.word_count} words"


class IndexEntry(models.Model):
    """One word of the tiny search index that index_document fills, a few words per step."""

    word = models.CharField(max_length=50)
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="index")

    class Meta:
        verbose_name_plural = "index entries"
        constraints = [
            models.UniqueConstraint(fields=["word", "document"], name="documents_index_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.word} -> {self.document_id}"
