"""The JSON API answers its errors as JSON too: ``{"error": "..."}`` with the status.

Django answers a 404, a 405 or a 400 with an HTML page (with ``DEBUG``, its debug page);
a script calling ``/api/`` should not have to parse one. This middleware turns every error
response under ``/api/`` into JSON, with the message of the ``Http404`` or
``PermissionDenied`` a view raised. A 500 keeps Django's debug page while ``DEBUG`` is on
(its traceback is what you need then) and is JSON otherwise; Django logs it either way.
"""

from collections.abc import Callable
from http import HTTPStatus

from django.conf import settings
from django.core.exceptions import BadRequest, PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse

API = "/api/"
ENDPOINTS = "/api/images/, /api/images/<id>/ and /api/duplicates/"


def is_api(request: HttpRequest) -> bool:
    return request.path_info.startswith(API)


def error(status: int, message: str) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def message_for(request: HttpRequest, response: HttpResponse) -> str:
    status = response.status_code
    if status == 404:
        return f"no such API resource: {request.path}; the API is {ENDPOINTS}"
    if status == 405:
        return f"{request.method} is not allowed here; use {response.get('Allow', '')}"
    try:
        return HTTPStatus(status).phrase
    except ValueError:  # a status http.HTTPStatus does not know
        return f"error {status}"


class ApiErrorsMiddleware:
    """Put it first in ``MIDDLEWARE``, so that it sees every other middleware's answers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if (not is_api(request) or response.status_code < 400
                or response.get("Content-Type", "").startswith("application/json")
                or (response.status_code >= 500 and settings.DEBUG)):
            return response
        converted = error(response.status_code, message_for(request, response))
        if "Allow" in response:
            converted["Allow"] = response["Allow"]
        return converted

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        """The message of what a view raised; anything else goes on to Django (a 500)."""
        if not is_api(request):
            return None
        for kind, status in ((Http404, 404), (PermissionDenied, 403), (BadRequest, 400)):
            if isinstance(exception, kind):
                return error(status, str(exception) or HTTPStatus(status).phrase)
        return None
