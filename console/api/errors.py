"""The error body of docs/api.md, `{"error": {"code", "message", "details"}}`, for everything under
/api/: domain errors, DRF's own, and Django's 404/413/500 pages, which would otherwise be HTML.

"Error body" on purpose: an *envelope* is an event (docs/design.md §3), never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response

from ledger.errors import LedgerError

from ..input_limits import MAX_BODY_BYTES, PayloadTooLarge

log = logging.getLogger(__name__)


def error_body(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


NOT_FOUND = ("not_found", "not found")
INTERNAL = ("internal_error", "an unexpected error occurred; it has been logged")

_DRF_CODES: list[tuple[type[Exception], str, int]] = [
    (drf.NotAuthenticated, "unauthenticated", 401),
    (drf.AuthenticationFailed, "unauthenticated", 401),
    (drf.PermissionDenied, "forbidden", 403),
    (drf.NotFound, "not_found", 404),
    (drf.MethodNotAllowed, "method_not_allowed", 405),
    (drf.NotAcceptable, "not_acceptable", 406),
    (drf.UnsupportedMediaType, "unsupported_media_type", 415),
    (drf.ParseError, "invalid_json", 400),
    (drf.Throttled, "rate_limited", 429),
]


def first_field(detail: Any) -> str:
    """The dotted path of the first invalid field of a DRF ValidationError's detail
    (`modelOverrides.planner.model`, `runIds.0`); "" for the body as a whole."""
    path: list[str] = []
    while isinstance(detail, dict | list) and detail:
        if isinstance(detail, dict):
            key, detail = next(iter(detail.items()))
            if key != "non_field_errors":
                path.append(str(key))
        else:
            index = next((i for i, item in enumerate(detail) if isinstance(item, dict | list) and item), None)
            if index is None:
                break
            path.append(str(index))
            detail = detail[index]
    return ".".join(path)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every failure becomes the error body."""
    if isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    if isinstance(exc, LedgerError):
        if exc.status >= 500:
            log.error("integrity failure: %s", exc.message)
        response = Response(exc.error_body(), status=exc.status)
        if getattr(exc, "retry_after", None) is not None:
            response["Retry-After"] = str(exc.retry_after)  # type: ignore[attr-defined]
        return response
    if isinstance(exc, Http404):
        return Response(error_body(*NOT_FOUND), status=404)
    if isinstance(exc, drf.ValidationError):
        details = {"fields": exc.detail, "field": first_field(exc.detail)}
        return Response(error_body("invalid_request", "the request is not valid", details), status=400)
    for cls, code, status in _DRF_CODES:
        if isinstance(exc, cls):
            response = Response(error_body(code, str(getattr(exc, "detail", exc))), status=status)
            if status == 401:
                response["WWW-Authenticate"] = "Bearer"
            return response
    log.exception("unexpected error in %s", context.get("view"))
    return Response(error_body(*INTERNAL), status=500)


_PAGES = {
    # Django's own 400 (a SuspiciousOperation: a Host not in ALLOWED_HOSTS, a malformed header or
    # cookie), refused before any view read the request.
    400: ("invalid_request", "the request is not valid: refused before it was read (its Host, or a malformed header)"),
    # Django's own 403 (its CSRF check on a view outside DRF, which checks a session's token itself).
    403: ("forbidden", "forbidden"),
    404: NOT_FOUND,
    405: ("method_not_allowed", "method not allowed"),
    500: INTERNAL,
}


class ApiErrorMiddleware:
    """Under /api/: refuse bodies over 10 MiB before anything parses them, and turn Django's
    HTML 400/403/404/405/500 pages (a disallowed Host, a failed CSRF check, unknown paths,
    unexpected exceptions) into the error body."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > MAX_BODY_BYTES:
            too_large = PayloadTooLarge()
            return JsonResponse(too_large.error_body(), status=too_large.status)
        response = self.get_response(request)
        content_type = response.get("Content-Type", "")
        if response.status_code in _PAGES and not content_type.startswith(("application/json", "text/event-stream")):
            replaced = JsonResponse(error_body(*_PAGES[response.status_code]), status=response.status_code)
            if "Allow" in response:  # a 405 names the methods the path takes (RFC 9110 §15.5.6)
                replaced["Allow"] = response["Allow"]
            return replaced
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/api/"):
            return None
        if isinstance(exception, (RequestDataTooBig, Http404)):
            handled = exception_handler(exception, {"view": request.path})
            return JsonResponse(handled.data, status=handled.status_code)
        log.exception("unexpected error under /api/", exc_info=exception)
        return JsonResponse(error_body(*INTERNAL), status=500)
