"""``manage.py seed``: create the sample documents (idempotent: tops up to --count)."""

import random

from django.core.management.base import BaseCommand
from django.db import transaction

from documents.models import Document

WORDS = [
    "river", "mountain", "forest", "city", "harbour", "bridge", "garden", "library", "market",
    "station", "window", "lantern", "engine", "signal", "archive", "letter", "journey",
    "winter", "summer", "morning", "evening", "silver", "copper", "paper", "stone", "glass",
    "thunder", "whisper", "meadow", "valley", "island", "compass", "anchor",
]
FILLER = ["the", "and", "for", "with", "that", "this", "from", "into", "over", "under"]
EVERY_NTH_EMPTY = 50  # these documents have no text, so count_words fails on them


def make_body(rng: random.Random) -> str:
    length = rng.randint(40, 200)
    return " ".join(rng.choice(WORDS if rng.random() < 0.6 else FILLER) for _ in range(length))


class Command(BaseCommand):
    help = "Create sample documents for the demo (no downloads); safe to run again."

    def add_arguments(self, parser):
        parser.add_argument("--count", type=int, default=300)

    def handle(self, *args, count, **options):
        existing = Document.objects.count()
        if existing >= count:
            self.stdout.write(f"{existing} documents already there; nothing to seed.")
            return
        # Saved one by one (not bulk_create) so that each save makes the document a
        # pending unit for every worker at once; rows written otherwise are found by a sweep.
        numbers = range(existing + 1, count + 1)
        with transaction.atomic():
            for number in numbers:
                rng = random.Random(number)
                empty = number % EVERY_NTH_EMPTY == 0
                Document.objects.create(
                    title=f"Document {number:03d}: {rng.choice(WORDS)} {rng.choice(WORDS)}",
                    body="" if empty else make_body(rng),
                )
        empty = sum(1 for number in numbers if number % EVERY_NTH_EMPTY == 0)
        self.stdout.write(
            f"Seeded {len(numbers)} documents ({empty} of them empty, so count_words "
            "will fail on those)."
        )
