"""The example's workers: discovered at start-up because this module is called workers.py.

The documents table is the queue. ``count_words`` runs once for every document;
``index_document`` becomes eligible for a document only once ``count_words`` has FINISHED
it, and does its work a few words per call, returning ``Unfinished()`` until it is done.
"""

import re
from collections import Counter

from django_dbworker import ExecutionStatus, Finished, Unfinished, has_execution_status, worker

from .models import Document, IndexEntry, Summary

TOP_WORDS = 8
WORDS_PER_STEP = 3
STOP_WORDS = frozenset(
    ["the", "and", "for", "with", "that", "this", "from", "into", "over", "under", "about"]
)


@worker(source=Document, concurrency=2)
def count_words(document: Document) -> Finished:
    words = re.findall(r"[a-z']+", document.body.lower())
    if not words:
        # Raising marks this execution FAILED, with the error kept for people to read.
        raise ValueError(f"document {document.pk} ({document.title!r}) has no text to count")
    counts = Counter(w for w in words if len(w) > 2 and w not in STOP_WORDS)
    # Written in the same transaction as the FINISHED status: both commit, or neither.
    Summary.objects.update_or_create(
        document=document,
        defaults={
            "word_count": len(words),
            "top_words": [word for word, _ in counts.most_common(TOP_WORDS)],
        },
    )
    return Finished()


@worker(
    source=Document,
    eligible=lambda: Document.objects.filter(
        has_execution_status(worker="count_words", statuses=[ExecutionStatus.FINISHED])
    ),
)
def index_document(document: Document) -> Finished | Unfinished:
    summary = document.summaries.latest("id")
    indexed = set(document.index.values_list("word", flat=True))
    todo = [word for word in summary.top_words if word not in indexed]
    IndexEntry.objects.bulk_create(
        [IndexEntry(word=word, document=document) for word in todo[:WORDS_PER_STEP]]
    )
    # Unfinished(): call me again for this document (Unfinished(delay=5) would wait 5 s).
    return Unfinished() if len(todo) > WORDS_PER_STEP else Finished()
