"""The error envelope of API.md for everything under /api/: domain errors, DRF's own, and
Django's 404/413/500 pages, which would otherwise be HTML."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from django.core.exceptions import RequestDataTooBig
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from rest_framework import exceptions as drf
from rest_framework.response import Response

from ledger.errors import LedgerError

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 10 * 1024 * 1024


def envelope(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


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


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF's EXCEPTION_HANDLER: every failure becomes the envelope."""
    if isinstance(exc, LedgerError):
        if exc.status >= 500:
            log.error("integrity failure: %s", exc.message)
        return Response(exc.envelope(), status=exc.status)
    if isinstance(exc, Http404):
        return Response(envelope("not_found", "not found"), status=404)
    if isinstance(exc, RequestDataTooBig):
        return Response(envelope("payload_too_large", "request bodies are limited to 10 MiB"), status=413)
    if isinstance(exc, drf.ValidationError):
        return Response(envelope("invalid_request", "the request is not valid", {"fields": exc.detail}), status=400)
    for cls, code, status in _DRF_CODES:
        if isinstance(exc, cls):
            response = Response(envelope(code, str(getattr(exc, "detail", exc))), status=status)
            if status == 401:
                response["WWW-Authenticate"] = "Bearer"
            return response
    log.exception("unexpected error in %s", context.get("view"))
    return Response(envelope("internal_error", "an unexpected error occurred; it has been logged"), status=500)


class ApiErrorMiddleware:
    """Under /api/: refuse bodies over 10 MiB before anything parses them, and turn Django's
    HTML 404/405/500 pages (unknown paths, unexpected exceptions) into the envelope."""

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
            return JsonResponse(envelope("payload_too_large", "request bodies are limited to 10 MiB",
                                         {"limit": MAX_BODY_BYTES}), status=413)
        response = self.get_response(request)
        if response.status_code in (404, 405, 500) and not response.get("Content-Type", "").startswith("application/json") \
                and not response.get("Content-Type", "").startswith("text/event-stream"):
            code = {404: "not_found", 405: "method_not_allowed", 500: "internal_error"}[response.status_code]
            return JsonResponse(envelope(code, {404: "not found", 405: "method not allowed",
                                                500: "an unexpected error occurred; it has been logged"}[response.status_code]),
                                status=response.status_code)
        return response

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not request.path.startswith("/api/"):
            return None
        if isinstance(exception, RequestDataTooBig):
            return JsonResponse(envelope("payload_too_large", "request bodies are limited to 10 MiB"), status=413)
        if isinstance(exception, Http404):
            return JsonResponse(envelope("not_found", "not found"), status=404)
        log.exception("unexpected error under /api/", exc_info=exception)
        return JsonResponse(envelope("internal_error", "an unexpected error occurred; it has been logged"), status=500)


def json_body(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode()
