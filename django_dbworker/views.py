"""The health and metrics views; include ``django_dbworker.urls`` to serve them."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from .insight import health as health_checks
from .insight import metrics as prometheus
from .logs import log_event


@never_cache
@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """200 when healthy, 503 with the problems otherwise (or when the database is down)."""
    try:
        verdict = health_checks.verdict()
    except DatabaseError as exc:
        log_event(logging.WARNING, "health_database_error", error=str(exc)[:300])
        verdict = {"healthy": False, "problems": [f"database error: {exc}"]}
    return JsonResponse(verdict, status=200 if verdict["healthy"] else 503)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    return HttpResponse(prometheus.render(), content_type=prometheus.CONTENT_TYPE)
