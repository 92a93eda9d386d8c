"""The page and the JSON API: plain Django views."""

from django.db.models import Case, CharField, QuerySet, Value, When
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.tasks import TaskResultStatus, default_task_backend
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from django_dbworker import ExecutionStatus, has_execution_status, workers

from .models import Artifact, DuplicatePair, Image
from .uploads import accept

WORKERS = ["prepare_image", "compare_images"]
LIMIT = 500  # images listed


def status_of(worker: str) -> Case:
    """The worker's status on each row, as a column: "FINISHED", ... or None (none yet)."""
    return Case(
        *[When(has_execution_status(worker=worker, statuses=[status]), then=Value(status.value))
          for status in ExecutionStatus],
        default=Value(None),
        output_field=CharField(),
    )


def images_with_status() -> QuerySet[Image]:
    """Images with both workers' statuses and their artifact: one query, however many."""
    return (
        Image.objects.annotate(**{worker: status_of(worker) for worker in WORKERS})
        .select_related("artifact")
        .defer("artifact__thumbnail")
        .order_by("-pk")
    )


def settled(image: Image) -> bool:
    return image.compare_images == ExecutionStatus.FINISHED or (
        image.prepare_image == ExecutionStatus.FAILED
    )


# ----- the page -------------------------------------------------------------------------


@require_GET
def index(request: HttpRequest) -> HttpResponse:
    images = list(images_with_status()[:LIMIT])
    pairs = list(DuplicatePair.objects.select_related("image", "original").order_by("-pk"))
    return render(request, "images/index.html", {
        "images": images,
        "pairs": pairs,
        "busy": not all(settled(image) for image in images),
    })


@require_POST
def upload(request: HttpRequest) -> HttpResponse:
    for file in request.FILES.getlist("file"):
        accept(file)
    return redirect("index")


@require_GET
def thumbnail(request: HttpRequest, pk: int) -> HttpResponse:
    artifact = get_object_or_404(Artifact, image_id=pk)
    return HttpResponse(bytes(artifact.thumbnail), content_type="image/png")


# ----- the JSON API ---------------------------------------------------------------------


def image_json(image: Image) -> dict:
    artifact = getattr(image, "artifact", None)
    return {
        "id": image.pk,
        "name": image.name,
        "uploaded_at": image.uploaded_at.isoformat(),
        "url": image.file.url,
        "status_url": reverse("api-image", args=[image.pk]),
        **{worker: getattr(image, worker) for worker in WORKERS},
        "width": artifact and artifact.width,
        "height": artifact and artifact.height,
        "dhash": artifact and artifact.dhash,
        "thumbnail_url": artifact and reverse("thumbnail", args=[image.pk]),
    }


def pair_json(pair: DuplicatePair) -> dict:
    return {
        "image": {"id": pair.image.pk, "name": pair.image.name},
        "original": {"id": pair.original.pk, "name": pair.original.name},
        "distance": pair.distance,
        "found_at": pair.found_at.isoformat(),
    }


@csrf_exempt  # an API for scripts; a real one would authenticate its callers
@require_http_methods(["GET", "POST"])
def api_images(request: HttpRequest) -> JsonResponse:
    """GET: the latest images with their statuses. POST: upload (multipart field "file";
    an Idempotency-Key header makes a retried upload return the first one)."""
    if request.method == "GET":
        return JsonResponse({"images": [image_json(i) for i in images_with_status()[:LIMIT]]})
    files = request.FILES.getlist("file")
    key = request.headers.get("Idempotency-Key")
    if not files or (key and len(files) > 1):
        return JsonResponse({"error": "send one or more files as the multipart form field "
                                      "'file' (only one with an Idempotency-Key)"}, status=400)
    stored = [accept(file, key=key) for file in files]
    found = images_with_status().filter(pk__in=[image.pk for image, _ in stored])
    created = any(new for _, new in stored)
    return JsonResponse({"images": [image_json(i) for i in found]}, status=201 if created else 200)


@require_GET
def api_image(request: HttpRequest, pk: int) -> JsonResponse:
    """One image: each worker's status and error, its duplicates and its notice task."""
    image = get_object_or_404(images_with_status(), pk=pk)
    data = image_json(image)
    data["workers"] = {}
    for name in WORKERS:
        state = workers[name].state(image.pk)
        error = state["error"]
        data["workers"][name] = {
            "status": state["execution_status"],
            "attempts": state["attempts"],
            "error": error and f"{error['exception_class']}: {error['message']}",
        }
    pairs = DuplicatePair.objects.select_related("image", "original")
    data["duplicates"] = [pair_json(p) for p in pairs.filter(image=image)]
    data["duplicated_by"] = [pair_json(p) for p in pairs.filter(original=image)]
    if image.notify_task_id:
        result = default_task_backend.get_result(image.notify_task_id)
        done = result.status == TaskResultStatus.SUCCESSFUL
        data["notify_task"] = {"id": result.id, "status": result.status,
                               "attempts": result.attempts,
                               "return_value": result.return_value if done else None}
    return JsonResponse(data)


@require_GET
def api_duplicates(request: HttpRequest) -> JsonResponse:
    pairs = DuplicatePair.objects.select_related("image", "original").order_by("pk")
    return JsonResponse({"duplicates": [pair_json(p) for p in pairs]})
