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

    def test_what_escapes_a_unit_fails_it_as_in_a_child(self):
        """Anything that escapes running a unit (here a fault injected into the runner's
        start) fails that unit, as a runworkers child records it, and the rest run."""
        from unittest import mock

        from django_dbworker.models import Execution, Failure
        from django_dbworker.rows import runner

        first, second = Item.objects.create(), Item.objects.create()
        doomed = Execution.objects.get(worker="touch", source_id=str(first.pk)).pk
        real = runner.progress.Unit

        def broken(kind, id):
            if id == str(doomed):
                raise RuntimeError("injected fault")
            return real(kind, id)

        with mock.patch.object(runner.progress, "Unit", broken):
            counts = run_until_idle(["touch"])
        self.assertEqual(counts, {"finished": 1, "failed": 1})
        self.assertEqual(execution_status(worker="touch", source_id=second.pk),
                         ExecutionStatus.FINISHED)
        failure = Failure.objects.get(execution_id=doomed)
        self.assertEqual(failure.exception_class, "builtins.RuntimeError")
        self.assertIn("injected fault", failure.message)
