"""`GET /api/v1/runs/{runId}/stream`: a run's events as server-sent events (API.md "Streams").

Catch-up and live delivery are ledger.follow's (subscribe first, de-duplicate by sequence, poll
when announcements are lost, stop when finished); this module only authorizes and writes frames.

Where to start: `Last-Event-ID` when the header is present, else `?after=N`, else 0. A browser's
EventSource reconnects to the same URL (still carrying the first `?after=`) and sends the id of the
last event it received in the header, so the header is the later, truer position.

Frames: `id: <sequence>` / `event: ledger.event` / `data: <envelope JSON>`; a `: keepalive` comment
after `LEDGER_STREAM_KEEPALIVE_SECONDS` without a write; when the run is completed or failed and
everything up to its last sequence was sent, `event: end` / `data: {"status": ...}` (no id, so a
reconnecting client keeps its position) and the stream closes. Clients should stop on `end`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from rest_framework.exceptions import APIException, NotAuthenticated
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ledger.append import validate_run_id
from ledger.errors import LedgerError
from ledger.follow import Follower
from ledger.models import Run

from .auth import access_for
from .errors import exception_handler
from .pagination import InvalidParameter, int_param
from .permissions import Authenticated
from .schema import error_response_objects

def _keepalive_seconds() -> float:
    return float(settings.LEDGER_STREAM_KEEPALIVE_SECONDS)


def _start_after(request: Request) -> int:
    header = request.META.get("HTTP_LAST_EVENT_ID", "").strip()
    if not header:
        return int_param(request, "after", 0, minimum=0)
    try:
        value = int(header)
    except ValueError:
        raise InvalidParameter("Last-Event-ID must be a sequence number", parameter="Last-Event-ID") from None
    if value < 0:
        raise InvalidParameter("Last-Event-ID must be at least 0", parameter="Last-Event-ID")
    return value


def _authorize(django_request: HttpRequest, run_id: str) -> tuple[Run, int]:
    """The run and the sequence to start after, for a caller authenticated exactly as the DRF
    views are (same authenticators, same permission, same scope rule): 401, 400, 403, 404."""
    # api_settings imports the dotted paths it is given; the stubs type the setting as those strings.
    authenticators = [cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]  # type: ignore[operator]
    request = Request(django_request, authenticators=authenticators)
    if not Authenticated().has_permission(request, None):
        raise NotAuthenticated("authentication credentials were not provided")
    validate_run_id(run_id)
    after = _start_after(request)
    run = access_for(request, "read", run_id=run_id).run
    assert run is not None
    return run, after


def _error_response(exc: Exception) -> HttpResponse:
    drf_response = exception_handler(exc, {"view": "run_stream"})
    response = JsonResponse(drf_response.data, status=drf_response.status_code)
    for header, value in drf_response.items():
        if header.lower() == "www-authenticate":
            response[header] = value
    return response


def _frame(envelope: dict[str, Any]) -> bytes:
    data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    return f"id: {envelope['sequence']}\nevent: ledger.event\ndata: {data}\n\n".encode()


def _end_frame(status: str) -> bytes:
    return f"event: end\ndata: {json.dumps({'status': status})}\n\n".encode()


async def _event_stream(run: Run, after: int) -> AsyncIterator[bytes]:
    async with Follower(run, after, idle_after=_keepalive_seconds()) as follower:
        # Sent once subscribed, so that the client sees the headers even when there is nothing to
        # catch up.
        yield b": connected\n\n"
        async for page in follower:
            if page.status is None:  # deleted by retention while we streamed
                return
            if page.items:
                yield b"".join(_frame(envelope) for _, envelope in page.items)
            elif not page.final:
                yield b": keepalive\n\n"
            if page.final:
                yield _end_frame(page.status)
                return


@csrf_exempt  # read-only and GET only, like the DRF views (which are exempt too)
@require_GET
async def run_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    try:
        run, after = await sync_to_async(_authorize)(request, run_id)
    except (LedgerError, APIException) as exc:
        return _error_response(exc)
    response = StreamingHttpResponse(_event_stream(run, after), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    # Proxies such as nginx would otherwise hold events back until a buffer fills.
    response["X-Accel-Buffering"] = "no"
    return response


urlpatterns = [path("runs/<str:run_id>/stream", run_stream, name="run-stream")]


def openapi_hook(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the stream is a plain Django view, so describe it here."""
    result.setdefault("paths", {})["/api/v1/runs/{runId}/stream"] = {
        "get": {
            "operationId": "runs_stream",
            "summary": "The run's events as server-sent events, then live ones",
            "description": (
                "Scope `read` (or a console session). Sends every event with sequence > N in order as "
                "`id: <sequence>` / `event: ledger.event` / `data: <envelope JSON>`, then live events, with "
                "no gap and no duplicate. N is the `Last-Event-ID` header when present (an EventSource "
                "reconnect), else `?after=`, else 0. A `: keepalive` comment at least every 15 s. When the "
                "run is completed or failed and everything is sent: `event: end` / `data: {\"status\": ...}` "
                "(without an id), and the stream closes."
            ),
            "tags": ["runs"],
            "parameters": [
                {"name": "runId", "in": "path", "required": True, "schema": {"type": "string"}},
                {"name": "after", "in": "query", "required": False,
                 "schema": {"type": "integer", "minimum": 0, "default": 0},
                 "description": "Start after this sequence (ignored when Last-Event-ID is sent)."},
                {"name": "Last-Event-ID", "in": "header", "required": False,
                 "schema": {"type": "integer", "minimum": 0},
                 "description": "The id of the last event received; wins over ?after=."},
                {"name": "workspace", "in": "query", "required": False, "schema": {"type": "string"},
                 "description": "TENANT/WORKSPACE, for a console session that sees several."},
            ],
            "responses": {
                "200": {"description": "The event stream",
                        "content": {"text/event-stream": {"schema": {"type": "string"}}}},
                **error_response_objects(
                    e400=["invalid_run_id", "invalid_parameter (after, Last-Event-ID)"],
                    e403=["insufficient_scope"], e404=["not_found (also a run of another workspace)"]),
            },
        }
    }
    return result
