"""The health and metrics views; include ``django_dbworker.urls`` to serve them.

Both may be served to anyone (a load balancer, Prometheus): when the database cannot be
read they name the failing component only, never its address or the driver's message;
those go to the ``django_dbworker`` log (``health_database_error``,
``metrics_database_error``)."""

from __future__ import annotations

import logging

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from . import conf
from .insight import deadline
from .insight import health as health_checks
from .insight import metrics as prometheus
from .logs import log_event

#: What an anonymous client learns when the database does not answer.
UNAVAILABLE = {"healthy": False, "status": "unavailable", "failing": ["database"],
               "problems": ["the database cannot be read; see the django_dbworker log "
                            "(health_database_error) for why"]}
#: What it learns when the database answers too slowly (``insight.deadline``).
DEGRADED = {"healthy": False, "status": "degraded", "failing": ["database"],
            "problems": [f"the database did not answer within {deadline.SECONDS:g}s; "
                         "see the django_dbworker log (health_database_error)"]}


def _database_error(event: str, exc: DatabaseError) -> None:
    log_event(logging.ERROR, event, database=conf.get().DATABASE,
              error=f"{type(exc).__name__}: {str(exc).strip()[:500]}")


@never_cache
@require_safe
def health(request: HttpRequest) -> JsonResponse:
    """200 when healthy, 503 with the problems otherwise; 503 naming only the failing
    component when the database is down."""
    try:
        with deadline.limited(conf.get().DATABASE):
            verdict = health_checks.verdict()
    except DatabaseError as exc:
        _database_error("health_database_error", exc)
        return JsonResponse(DEGRADED if isinstance(exc, deadline.Overdue) else UNAVAILABLE,
                            status=503)
    verdict = {"status": "ok" if verdict["healthy"] else "unhealthy", **verdict}
    return JsonResponse(verdict, status=200 if verdict["healthy"] else 503)


@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """The Prometheus text (with this process' metrics unless
    ``DBWORKER["METRICS_PROCESS"]`` is False); 503 with a short text body when the database
    is down."""
    try:
        with deadline.limited(conf.get().DATABASE):
            text = prometheus.render(process=conf.get().METRICS_PROCESS)
    except DatabaseError as exc:
        _database_error("metrics_database_error", exc)
        why = ("database too slow: no answer within "
               f"{deadline.SECONDS:g}s" if isinstance(exc, deadline.Overdue)
               else "database unavailable")
        return HttpResponse(f"{why} (see the django_dbworker log)\n",
                            status=503, content_type="text/plain; charset=utf-8")
    return HttpResponse(text, content_type=prometheus.CONTENT_TYPE)
