"""``manage.py report``: each worker's execution statuses over the documents."""

from django.core.management.base import BaseCommand

from django_dbworker import ExecutionStatus, has_execution_status, workers
from documents.models import Document, IndexEntry

WORKERS = ["count_words", "index_document"]


class Command(BaseCommand):
    help = "Count documents by execution status, per worker, with has_execution_status()."

    def handle(self, *args, **options):
        statuses = [ExecutionStatus.FINISHED, ExecutionStatus.FAILED,
                    ExecutionStatus.UNFINISHED, ExecutionStatus.WORKING]
        header = f"{'worker':<16}" + "".join(f"{s.value:>12}" for s in statuses)
        self.stdout.write(header + f"{'no status':>12}")
        for name in WORKERS:
            counts = [
                Document.objects.filter(has_execution_status(worker=name, statuses=[s])).count()
                for s in statuses
            ]
            # Not claimed yet, or not eligible (yet): no execution status at all.
            none = Document.objects.exclude(has_execution_status(worker=name)).count()
            self.stdout.write(f"{name:<16}" + "".join(f"{n:>12}" for n in counts) + f"{none:>12}")

        failed = Document.objects.filter(
            has_execution_status(worker="count_words", statuses=[ExecutionStatus.FAILED])
        ).order_by("pk")
        for document in failed[:3]:
            error = workers["count_words"].state(document.pk)["error"]
            self.stdout.write(f"  FAILED {document.pk}: {error['exception_class']}: "
                              f"{error['message']}")
        if failed.count() > 3:
            self.stdout.write(f"  ... and {failed.count() - 3} more")
        self.stdout.write(f"Search index: {IndexEntry.objects.count()} entries.")
