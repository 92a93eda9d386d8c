"""The example's own tests (``manage.py test images``; tests/test_example.py runs them on
SQLite and PostgreSQL). Work runs in this process with run_until_idle(): no runworkers."""

import io
import shutil
import tempfile
import uuid
from datetime import timedelta
from unittest import mock

from django.core import mail
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import call_command
from django.tasks import TaskResultStatus, default_task_backend
from django.test import TestCase, override_settings
from django.utils import timezone
from PIL import Image as Pillow

from django_dbworker import ExecutionStatus, execution_status, workers
from django_dbworker.models import Execution, Supervisor
from django_dbworker.tasks.schedules import schedules
from django_dbworker.testing import run_until_idle

from . import samples
from .hashing import dhash, distance
from .models import DuplicatePair, Image
from .tasks import daily_digest

WORKERS = ["prepare_image", "compare_images"]


def picture(number: int) -> bytes:
    return samples.encode(samples.draw(number), "PNG")


class ExampleTestCase(TestCase):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.media = tempfile.mkdtemp()
        cls.enterClassContext(override_settings(MEDIA_ROOT=cls.media))
        cls.addClassCleanup(shutil.rmtree, cls.media, ignore_errors=True)

    def upload(self, name: str, content: bytes, **headers):
        return self.client.post("/api/images/", {"file": SimpleUploadedFile(name, content)},
                                headers=headers)


class DeduplicationTests(ExampleTestCase):
    def test_the_samples_end_to_end(self):
        for name, content in samples.samples():
            self.assertEqual(self.upload(name, content).status_code, 201)
        counts = run_until_idle(WORKERS)
        self.assertEqual(counts["failed"], 1)  # notes.txt

        pairs = self.client.get("/api/duplicates/").json()["duplicates"]
        found = {frozenset({p["image"]["name"], p["original"]["name"]}) for p in pairs}
        self.assertEqual(found, samples.planted_pairs())
        self.assertTrue(all(p["distance"] <= 5 for p in pairs))

        notes = Image.objects.get(name=samples.NOT_AN_IMAGE)
        status = self.client.get(f"/api/images/{notes.pk}/").json()
        self.assertEqual(status["workers"]["prepare_image"]["status"], "FAILED")
        self.assertIn("'notes.txt' is not an image", status["workers"]["prepare_image"]["error"])
        self.assertIsNone(status["workers"]["compare_images"]["status"])

        # The notice tasks: all ran once the comparisons were done; one mail per pair.
        run_until_idle()
        self.assertEqual(len(mail.outbox), len(samples.PLANTED))
        self.assertTrue(all(m.subject.startswith("Duplicate upload:") for m in mail.outbox))
        later = DuplicatePair.objects.first().image
        notice = self.client.get(f"/api/images/{later.pk}/").json()["notify_task"]
        self.assertEqual(notice["status"], TaskResultStatus.SUCCESSFUL)
        self.assertEqual(notice["return_value"], {"duplicates": 1, "emailed": True})

        call_command("watch", "--check", "--timeout", "0", stdout=io.StringIO())

    def test_compare_works_in_pages(self):
        for number in range(1, 6):
            self.upload(f"{number}.png", picture(number))
        with mock.patch("images.workers.PAGE_SIZE", 2):
            counts = run_until_idle(WORKERS)
        # Image 4 has 3 earlier images (2 pages), image 5 has 4 (2 pages): one
        # Unfinished() each before Finished().
        self.assertEqual(counts["unfinished"], 2)
        self.assertEqual(counts["finished"], 5 + 5)
        last = Image.objects.latest("pk")
        self.assertEqual(execution_status(worker="compare_images", source_id=last.pk),
                         ExecutionStatus.FINISHED)
        self.assertEqual(last.artifact.compared_up_to, last.pk - 1)

    def test_a_failed_image_can_be_retried(self):
        image_id = self.upload("broken.png", b"\x89PNG not really").json()["images"][0]["id"]
        run_until_idle(WORKERS)
        self.assertEqual(execution_status(worker="prepare_image", source_id=image_id),
                         ExecutionStatus.FAILED)
        Image.objects.get(pk=image_id).file.save("fixed.png", io.BytesIO(picture(1)))
        self.assertTrue(workers["prepare_image"].reset_failed(image_id))
        run_until_idle(WORKERS)
        self.assertEqual(execution_status(worker="compare_images", source_id=image_id),
                         ExecutionStatus.FINISHED)

    def test_perceptual_hash(self):
        original = samples.draw(7)
        copy = Pillow.open(io.BytesIO(samples.encode(samples.altered(original, "smaller"),
                                                     "JPEG", 60)))
        self.assertLessEqual(distance(dhash(original), dhash(copy)), 5)
        self.assertGreater(distance(dhash(original), dhash(samples.draw(8))), 10)


class PageTests(ExampleTestCase):
    def test_the_page_costs_two_queries_however_many_images(self):
        for images in (3, 9):
            while Image.objects.count() < images:
                number = Image.objects.count() + 1
                self.upload(f"picture-{number}.png", picture(number))
            self.upload("copy.jpg", samples.encode(samples.draw(1), "JPEG"))
            run_until_idle(WORKERS)
            with self.assertNumQueries(2):  # the images with statuses, the pairs
                response = self.client.get("/")
            self.assertEqual(response.status_code, 200)
            self.assertContains(response, ">FINISHED<", count=2 * Image.objects.count())
            self.assertContains(response, "copy.jpg")
            with self.assertNumQueries(1):
                self.client.get("/api/images/")

    def test_statuses_before_and_after(self):
        self.upload("one.png", picture(1))
        listed = self.client.get("/api/images/").json()["images"][0]
        self.assertEqual([listed["prepare_image"], listed["compare_images"]], [None, None])
        run_until_idle(["prepare_image"])
        listed = self.client.get("/api/images/").json()["images"][0]
        self.assertEqual([listed["prepare_image"], listed["compare_images"]], ["FINISHED", None])
        self.assertEqual(self.client.get(listed["thumbnail_url"])["Content-Type"], "image/png")

    def test_the_upload_form(self):
        response = self.client.post("/upload/", {"file": [
            SimpleUploadedFile("a.png", picture(1)), SimpleUploadedFile("b.png", picture(2)),
        ]})
        self.assertRedirects(response, "/")
        self.assertEqual(list(Image.objects.order_by("pk").values_list("name", flat=True)),
                         ["a.png", "b.png"])


class TaskTests(ExampleTestCase):
    def test_a_retried_upload_with_the_same_key_is_the_same_image_and_task(self):
        first = self.upload("a.png", picture(1), idempotency_key="upload-1")
        again = self.upload("a.png", picture(1), idempotency_key="upload-1")
        self.assertEqual((first.status_code, again.status_code), (201, 200))
        self.assertEqual(first.json()["images"][0]["id"], again.json()["images"][0]["id"])
        image = Image.objects.get()
        result = default_task_backend.get_result(image.notify_task_id)
        self.assertEqual(result.idempotency_key, f"notify-duplicates:{image.pk}")

    def test_the_notice_waits_for_the_comparison(self):
        self.upload("a.png", picture(1))
        counts = run_until_idle()  # everything, tasks too: the notice may run first
        image = Image.objects.get()
        result = default_task_backend.get_result(image.notify_task_id)
        if counts["retrying"]:
            self.assertEqual(result.dbworker_status, "RETRYING")
            self.assertIn("ComparisonPending", result.errors[0].exception_class_path)
        else:
            self.assertEqual(result.status, TaskResultStatus.SUCCESSFUL)

    def test_daily_digest_waits_for_the_days_work(self):
        self.assertEqual(schedules()["daily_digest"].cron, "0 8 * * *")
        self.upload("a.png", picture(1))
        self.upload("b.png", b"not a picture")
        started = daily_digest.call()  # what the 08:00 tick runs: it starts the workflow
        self.assertEqual(started["images"], 2)
        first = default_task_backend.get_result(started["next"])
        self.assertEqual(first.dbworker_status, "WAITING")  # for prepare_image on both
        run_until_idle()  # the workers, the notices and the two steps of the digest
        first.refresh()
        self.assertEqual(first.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(first.return_value["pictures"], 1)  # b.png is not a picture
        report = default_task_backend.get_result(first.return_value["next"])
        self.assertEqual(report.status, TaskResultStatus.SUCCESSFUL)
        self.assertEqual(report.return_value,
                         {"uploaded": 2, "prepared": 1, "failed": 1, "duplicates": 0})
        compared = Execution.objects.get(worker="compare_images", state="FINISHED").finished_at
        self.assertLessEqual(compared, report.started_at)  # it waited for the comparison
        self.assertEqual(len(mail.outbox), 1)
        self.assertIn("2 uploaded", mail.outbox[0].subject)


class ApiErrorTests(ExampleTestCase):
    """The JSON API's errors are JSON, with a message that says what was wrong."""

    def assertJsonError(self, response, status: int, text: str) -> None:
        self.assertEqual(response.status_code, status)
        self.assertEqual(response["Content-Type"], "application/json")
        self.assertIn(text, response.json()["error"])

    def test_an_unknown_image_is_a_json_404(self):
        self.assertJsonError(self.client.get("/api/images/999/"), 404,
                             "No Image matches the given query")

    def test_an_unknown_api_url_is_a_json_404(self):
        self.assertJsonError(self.client.get("/api/nothing/"), 404,
                             "no such API resource: /api/nothing/")

    def test_a_wrong_method_is_a_json_405_with_allow(self):
        response = self.client.delete("/api/duplicates/")
        self.assertJsonError(response, 405, "DELETE is not allowed here; use GET")
        self.assertEqual(response["Allow"], "GET")

    def test_an_upload_without_a_file_keeps_its_message(self):
        self.assertJsonError(self.client.post("/api/images/"), 400, "multipart form field")

    def test_an_error_in_a_view_is_a_json_500_without_debug(self):
        self.client.raise_request_exception = False
        with mock.patch("images.views.images_with_status", side_effect=RuntimeError("boom")):
            response = self.client.get("/api/images/")
        self.assertJsonError(response, 500, "Internal Server Error")
        self.assertNotIn("boom", response.content.decode())

    def test_pages_outside_the_api_keep_their_html_errors(self):
        response = self.client.get("/images/999/thumbnail.png")
        self.assertEqual(response.status_code, 404)
        self.assertTrue(response["Content-Type"].startswith("text/html"))


class OperationsTests(ExampleTestCase):
    """django_dbworker's health check and metrics, mounted under /dbworker/."""

    def test_health_wants_a_live_supervisor(self):
        response = self.client.get("/dbworker/health/")
        self.assertEqual(response.status_code, 503)  # no runworkers in a test
        self.assertIn("0 supervisor(s) alive", response.json()["problems"][0])
        self.assertIn("worker:prepare_image", response.json()["lag_seconds"])

    def test_health_is_ok_while_a_supervisor_beats(self):
        now = timezone.now()
        Supervisor.objects.create(id=uuid.uuid4(), host="h", pid=1, started_at=now,
                                  last_heartbeat=now,
                                  heartbeat_expires_at=now + timedelta(seconds=30))
        response = self.client.get("/dbworker/health/")
        self.assertEqual(response.status_code, 200, response.content)
        self.assertEqual(response.json()["status"], "ok")

    def test_metrics_count_the_images_work(self):
        self.upload("a.png", picture(1))
        self.upload("b.png", b"not a picture")
        run_until_idle(WORKERS)
        response = self.client.get("/dbworker/metrics/")
        self.assertEqual(response.status_code, 200)
        self.assertTrue(response["Content-Type"].startswith("text/plain"))
        text = response.content.decode()
        # prometheus_client writes labels sorted by name, values as floats.
        self.assertIn('dbworker_executions{status="finished",worker="prepare_image"} 1.0', text)
        self.assertIn('dbworker_executions{status="failed",worker="prepare_image"} 1.0', text)
