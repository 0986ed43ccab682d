"""`GET /api/v1/runs/{runId}/stream`: a run's events as server-sent events (docs/api.md "Streams").

Catch-up and live delivery are ledger.replay.follow's (subscribe first, de-duplicate by sequence, poll
when announcements are lost, stop when finished); this module only authorizes and writes frames.

Where to start: `Last-Event-ID` when the header is present, else `?after=N`, else 0. A browser's
EventSource reconnects to the same URL (still carrying the first `?after=`) and sends the id of the
last event it received in the header, so the header is the later, truer position.

Frames: `id: <sequence>` / `event: ledger.event` / `data: <envelope JSON>`; a `: keepalive` comment
after `LEDGER_STREAM_KEEPALIVE_SECONDS` without a write; when the run is completed or failed and
everything up to its last sequence was sent, `event: end` / `data: {"status": ...}` (no id, so a
reconnecting client keeps its position) and the stream closes. Clients should stop on `end`.

Credentials are checked again while the stream lives (console/streams.py): at every keepalive, and
once a keepalive's time has passed since the last check while events flow. A revoked key, a
logged-out session or a removed member ends the stream (no `end` frame: an EventSource reconnects
and is refused). One caller holds at most LEDGER_STREAM_MAX_PER_CALLER streams per process; the
next is 429 `too_many_streams`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods
from rest_framework.exceptions import APIException, NotAcceptable, NotAuthenticated
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ledger.canonical import ecma_dumps
from ledger.errors import LedgerError
from ledger.limits import MAX_ROW_ID
from ledger.log.prepare import validate_run_id
from ledger.models import Run
from ledger.replay.follow import Follower

from ..streams import Grant, Slot, grant_for, max_per_caller, still_allowed, take_slot
from .auth import access_for, principal
from .errors import exception_handler
from .negotiation import admits
from .pagination import InvalidParameter, int_param
from .permissions import Authenticated
from .schema import error_response_objects

log = logging.getLogger(__name__)


def _keepalive_seconds() -> float:
    return float(settings.LEDGER_STREAM_KEEPALIVE_SECONDS)


def _start_after(request: Request) -> int:
    after = int_param(request, "after", 0, minimum=0)  # refused when malformed, header or not
    header = request.META.get("HTTP_LAST_EVENT_ID", "").strip()
    if not header:
        return after
    try:
        value = int(header)
    except ValueError:
        raise InvalidParameter("Last-Event-ID must be a sequence number", parameter="Last-Event-ID") from None
    if not 0 <= value <= MAX_ROW_ID:
        raise InvalidParameter(f"Last-Event-ID must be between 0 and {MAX_ROW_ID}", parameter="Last-Event-ID")
    return value


class TooManyStreams(LedgerError):
    code = "too_many_streams"
    status = 429


@dataclass(frozen=True)
class _Opened:
    run: Run
    after: int
    caller: Any  # the API key or the session's user
    grant: Grant


def _authenticate(django_request: HttpRequest) -> Request:
    """The caller, authenticated exactly as the DRF views are (same authenticators, same
    permission): 401 without credentials or with a key that is unknown or revoked."""
    # api_settings imports the dotted paths it is given; the stubs type the setting as those strings.
    authenticators = [cls() for cls in api_settings.DEFAULT_AUTHENTICATION_CLASSES]  # type: ignore[operator]
    request = Request(django_request, authenticators=authenticators)
    if not Authenticated().has_permission(request, None):
        raise NotAuthenticated("authentication credentials were not provided")
    return request


def _authorize(django_request: HttpRequest, run_id: str) -> _Opened:
    """The run and the sequence to start after, for a caller authenticated as the DRF views are
    (same scope rule too): 401, 400, 403, 404; and what the stream re-checks while it lives."""
    request = _authenticate(django_request)
    validate_run_id(run_id)
    after = _start_after(request)
    found = access_for(request, "read", run_id=run_id)
    assert found.run is not None
    caller = principal(request)
    workspace = request.query_params.get("workspace") or None
    grant = grant_for(caller, getattr(django_request, "session", None), workspace=workspace, found=found)
    return _Opened(found.run, after, caller, grant)


def _allowed(grant: Grant) -> bool:
    try:
        return still_allowed(grant)
    except Exception:  # cannot tell: the stream ends, and a reconnecting client is asked again
        log.warning("re-checking a stream's credentials failed", exc_info=True)
        return False


def _error_response(exc: Exception) -> HttpResponse:
    drf_response = exception_handler(exc, {"view": "run_stream"})
    response = JsonResponse(drf_response.data, status=drf_response.status_code)
    for header, value in drf_response.items():
        if header.lower() == "www-authenticate":
            response[header] = value
    return response


def _frame(envelope: dict[str, Any]) -> bytes:
    # Numbers in ECMAScript form, the payload's keys in their stored order: the event's bytes as
    # every read of the log writes them (NDJSON, exports, the append's answer). No raw line break
    # can occur: JSON escapes CR and LF in strings.
    data = ecma_dumps(envelope)
    return b"id: %d\nevent: ledger.event\ndata: %s\n\n" % (envelope["sequence"], data)


def _end_frame(status: str) -> bytes:
    return f"event: end\ndata: {json.dumps({'status': status})}\n\n".encode()


async def _event_stream(opened: _Opened, slot: Slot) -> AsyncIterator[bytes]:
    """The frames; the caller's credentials are checked again on every keepalive, and whenever a
    keepalive's time has passed since the last check, and the stream ends when they are gone."""
    try:
        keepalive = _keepalive_seconds()
        loop = asyncio.get_running_loop()
        async with Follower(opened.run, opened.after, idle_after=keepalive) as follower:
            # Sent once subscribed, so that the client sees the headers even when there is nothing
            # to catch up.
            yield b": connected\n\n"
            checked = loop.time()
            async for page in follower:
                idle = not page.items and not page.final
                if idle or loop.time() - checked >= keepalive:
                    if not await database_sync_to_async(_allowed)(opened.grant):
                        return  # revoked, logged out, or no longer a member: the response ends
                    checked = loop.time()
                if page.status is None:  # deleted by retention while we streamed
                    return
                if page.items:
                    yield b"".join(_frame(envelope) for _, envelope in page.items)
                elif not page.final:
                    yield b": keepalive\n\n"
                if page.final:
                    yield _end_frame(page.status)
                    return
    finally:
        slot.release()  # also when the client went away and the response was cancelled


def _accepts_events(request: HttpRequest) -> bool:
    """Whether the Accept header admits `text/event-stream`: as it names it (an EventSource, the
    Python client), or by `*/*` or `text/*` (curl, a browser's address bar); no Accept admits all.
    A range with `q=0` refuses it, the most specific range deciding (`*/*, text/event-stream;q=0`
    is 406), as on every other endpoint (console/api/negotiation.py)."""
    return admits(request.headers.get("Accept", ""), "text/event-stream")


ALLOWED = ["GET", "HEAD", "OPTIONS"]


def _headers(response: HttpResponseBase) -> HttpResponseBase:
    response["Cache-Control"] = "no-cache"
    # Proxies such as nginx would otherwise hold events back until a buffer fills.
    response["X-Accel-Buffering"] = "no"
    return response


@csrf_exempt  # read-only, like the DRF views (which are exempt too)
@require_http_methods(ALLOWED)
async def run_stream(request: HttpRequest, run_id: str) -> HttpResponseBase:
    # Before the credentials, as DRF negotiates the content of the other views first.
    if request.method == "OPTIONS":
        # As DRF's views answer it: the caller authenticated, the methods in Allow, nothing looked up.
        try:
            await sync_to_async(_authenticate)(request)
        except APIException as exc:
            return _error_response(exc)
        answer = JsonResponse({"name": "Run Stream", "renders": ["text/event-stream"], "parses": []})
        answer["Allow"] = ", ".join(ALLOWED)
        return answer
    if not _accepts_events(request):
        return _error_response(NotAcceptable("the stream is text/event-stream, which the Accept header does not admit"))
    try:
        opened = await sync_to_async(_authorize)(request, run_id)
    except (LedgerError, APIException) as exc:
        return _error_response(exc)
    # HEAD answers as on every other GET path of the API: GET's checks, then its headers without a
    # body, holding no stream slot.
    if request.method == "HEAD":
        return _headers(HttpResponse(content_type="text/event-stream"))
    slot = take_slot(opened.caller)
    if slot is None:
        return _error_response(
            TooManyStreams(
                f"this caller already holds {max_per_caller()} open streams; close one first", limit=max_per_caller()
            )
        )
    # The slot goes back when the stream ends (the generator's finally), or, should the response
    # never be iterated (the client left first), when the generator holding it is collected.
    return _headers(StreamingHttpResponse(_event_stream(opened, slot), content_type="text/event-stream"))


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
                'run is completed or failed and everything is sent: `event: end` / `data: {"status": ...}` '
                "(without an id), and the stream closes. The caller's credentials are checked again at least "
                "every keepalive: a revoked key, a logged-out session or a removed member ends the stream "
                "(without `end`). One caller (a key, or a user) holds at most LEDGER_STREAM_MAX_PER_CALLER "
                "(default 20) streams at once per server process; the next is 429 `too_many_streams`."
            ),
            "tags": ["runs"],
            "parameters": [
                {"name": "runId", "in": "path", "required": True, "schema": {"type": "string"}},
                {
                    "name": "after",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0, "default": 0},
                    "description": "Start after this sequence (Last-Event-ID, when sent, wins; a malformed after is 400 all the same).",
                },
                {
                    "name": "Last-Event-ID",
                    "in": "header",
                    "required": False,
                    "schema": {"type": "integer", "minimum": 0},
                    "description": "The id of the last event received; wins over ?after=.",
                },
                {
                    "name": "workspace",
                    "in": "query",
                    "required": False,
                    "schema": {"type": "string"},
                    "description": "TENANT/WORKSPACE, for a console session that sees several; an API key may name only its own (any other is 404).",
                },
            ],
            "responses": {
                "200": {
                    "description": "The event stream",
                    "content": {"text/event-stream": {"schema": {"type": "string"}}},
                },
                **error_response_objects(
                    e400=["invalid_run_id", "invalid_parameter (after, Last-Event-ID)"],
                    e403=["insufficient_scope"],
                    e404=["not_found (also a run of another workspace)"],
                    e406=["not_acceptable (an Accept that admits no text/event-stream)"],
                    e429=["too_many_streams"],
                ),
            },
        }
    }
    return result
