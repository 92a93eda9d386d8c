"""django_dbworker.testing inside Django's TestCase (one wrapping transaction)."""

from django.test import TestCase

from django_dbworker import ExecutionStatus, execution_status
from django_dbworker.testing import run_until_idle
from tests.testapp.models import Effect, Item


class RunUntilIdleInTestCase(TestCase):
    def test_runs_and_rolls_back_failures_inside_the_test_transaction(self):
        ok = Item.objects.create()
        bad = Item.objects.create(action="raise")
        counts = run_until_idle(["touch", "after_touch"])
        self.assertEqual(counts, {"finished": 2, "failed": 1})
        self.assertEqual(execution_status(worker="touch", source_id=ok.pk),
                         ExecutionStatus.FINISHED)
        self.assertEqual(execution_status(worker="touch", source_id=bad.pk),
                         ExecutionStatus.FAILED)
        self.assertEqual(Effect.objects.filter(worker="touch").count(), 1)

    def test_guards_against_endless_unfinished(self):
        Item.objects.create(action="steps:1000")
        with self.assertRaisesMessage(RuntimeError, "Unfinished() forever"):
            run_until_idle(["touch"], max_units=20)

    def test_unknown_worker(self):
        from django_dbworker.exceptions import UnknownWorker

        with self.assertRaises(UnknownWorker):
            run_until_idle(["nope"])
