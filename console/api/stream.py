"""`GET /api/v1/runs/{runId}/stream`: a run's events as server-sent events (API.md "Streams").

Catch-up (DESIGN.md §5 item 2): the stream joins the run's channel-layer group *before* it reads
the database, so an event committed between the two is either in the read or announced after it;
it then sends only sequences above the last one it sent (`last_sent`), so one that is both read
and announced goes out once. Announcements only wake the stream: events are always read from the
database. The layer is lossy (another process's in-memory layer never reaches us, Redis may drop a
message or be down), so without an announcement the stream reads the database anyway every
`LEDGER_STREAM_POLL_SECONDS`.

Where to start: `Last-Event-ID` when the header is present, else `?after=N`, else 0. A browser's
EventSource reconnects to the same URL (still carrying the first `?after=`) and sends the id of the
last event it received in the header, so the header is the later, truer position.

Frames: `id: <sequence>` / `event: ledger.event` / `data: <envelope JSON>`; a `: keepalive` comment
after `LEDGER_STREAM_KEEPALIVE_SECONDS` without a write; when the run is completed or failed and
everything up to its last sequence was sent, `event: end` / `data: {"status": ...}` (no id, so a
reconnecting client keeps its position) and the stream closes. Clients should stop on `end`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from asgiref.sync import sync_to_async
from channels.layers import BaseChannelLayer, get_channel_layer
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase
from django.urls import path
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET
from rest_framework.exceptions import APIException, NotAuthenticated
from rest_framework.request import Request
from rest_framework.settings import api_settings

from ledger import selectors
from ledger.announce import group_for
from ledger.append import validate_run_id
from ledger.errors import LedgerError
from ledger.models import Run, RunStatus

from .auth import caller_for
from .errors import exception_handler
from .pagination import InvalidParameter, int_param
from .permissions import Authenticated

log = logging.getLogger(__name__)

# Catch-up reads the log in pages so that a long run is never held in memory at once.
PAGE_SIZE = 500


def _poll_seconds() -> float:
    return float(settings.LEDGER_STREAM_POLL_SECONDS)


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
    caller = caller_for(request, "read", run_id=run_id)
    return selectors.get_run(caller.workspace, run_id), after


def _error_response(exc: Exception) -> HttpResponse:
    drf_response = exception_handler(exc, {"view": "run_stream"})
    response = JsonResponse(drf_response.data, status=drf_response.status_code)
    for header, value in drf_response.items():
        if header.lower() == "www-authenticate":
            response[header] = value
    return response


def _read(run: Run, after: int) -> tuple[str | None, int, list[dict[str, Any]]]:
    """The run's status and last sequence, then its events after `after` (one page).

    The head is read first: its last sequence is committed with the events, so the page read
    next contains at least everything up to it (or a full page)."""
    head = Run.objects.filter(pk=run.pk).values_list("status", "last_sequence").first()
    if head is None:  # deleted by retention while we streamed
        return None, 0, []
    return head[0], head[1], selectors.events(run, after=after, limit=PAGE_SIZE)


def _frame(envelope: dict[str, Any]) -> bytes:
    data = json.dumps(envelope, ensure_ascii=False, separators=(",", ":"))
    return f"id: {envelope['sequence']}\nevent: ledger.event\ndata: {data}\n\n".encode()


def _end_frame(status: str) -> bytes:
    return f"event: end\ndata: {json.dumps({'status': status})}\n\n".encode()


@dataclass
class _News:
    """The highest sequence announced so far, and a wake-up for the stream."""

    latest: int = 0
    wake: asyncio.Event = field(default_factory=asyncio.Event)


async def _listen(layer: BaseChannelLayer, channel: str, news: _News, retry_after: float) -> None:
    while True:
        try:
            message = await layer.receive(channel)
        except asyncio.CancelledError:
            raise
        except Exception:  # the layer is lossy; the stream goes on polling meanwhile
            log.warning("receiving announcements on %s failed; polling meanwhile", channel, exc_info=True)
            await asyncio.sleep(retry_after)
            continue
        if message.get("type") == "ledger.appended":
            sequence = message.get("sequence")
            if isinstance(sequence, int):
                news.latest = max(news.latest, sequence)
            news.wake.set()


async def _subscribe(layer: BaseChannelLayer | None, group: str) -> str | None:
    if layer is None:
        return None
    try:
        channel = await layer.new_channel()
        await layer.group_add(group, channel)
    except Exception:
        log.warning("could not join %s; the stream polls the database only", group, exc_info=True)
        return None
    return channel


async def _wait_for_news(news: _News, last_sent: int, timeout: float) -> None:
    """Return when an announcement past `last_sent` arrives, or after `timeout` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while news.latest <= last_sent:
        remaining = deadline - loop.time()
        if remaining <= 0:
            return
        news.wake.clear()
        try:
            await asyncio.wait_for(news.wake.wait(), remaining)
        except TimeoutError:
            return


async def _event_stream(run: Run, after: int) -> AsyncIterator[bytes]:
    poll, keepalive = _poll_seconds(), _keepalive_seconds()
    loop = asyncio.get_running_loop()
    layer = get_channel_layer()
    group = group_for(run.pk)
    news = _News()
    listener: asyncio.Task[None] | None = None
    read = sync_to_async(_read)
    channel: str | None = None
    try:
        # Subscribe before the first read: see the module docstring.
        channel = await _subscribe(layer, group)
        if layer is not None and channel is not None:
            listener = asyncio.create_task(_listen(layer, channel, news, poll))
        last_sent = after
        # Sent at once so that the client sees the headers even when there is nothing to catch up.
        yield b": connected\n\n"
        last_write = loop.time()
        while True:
            status, last_sequence, page = await read(run, last_sent)
            last_read = loop.time()
            if status is None:
                return
            if page:
                yield b"".join(_frame(envelope) for envelope in page)
                last_sent = page[-1]["sequence"]
                last_write = loop.time()
                if len(page) == PAGE_SIZE:
                    continue
            if status in RunStatus.finished() and last_sent >= last_sequence:
                yield _end_frame(status)
                return
            # Read again on an announcement past last_sent, or when the poll timer runs out;
            # keepalives in between do not read the database.
            while True:
                wake_at = min(last_read + poll, last_write + keepalive)
                await _wait_for_news(news, last_sent, wake_at - loop.time())
                if loop.time() >= last_write + keepalive:
                    yield b": keepalive\n\n"
                    last_write = loop.time()
                    if layer is not None and channel is not None:
                        # Layers expire group membership (a day by default); a stream may outlive it.
                        with suppress(Exception):
                            await layer.group_add(group, channel)
                if news.latest > last_sent or loop.time() >= last_read + poll:
                    break
    finally:
        if listener is not None:
            listener.cancel()
            with suppress(asyncio.CancelledError):
                await listener
        if layer is not None and channel is not None:
            try:
                await layer.group_discard(group, channel)
            except Exception:
                log.warning("could not leave %s", group, exc_info=True)


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


_OPENAPI_ERROR = {"description": "the error envelope", "content": {"application/json": {"schema": {"type": "object"}}}}


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
                "400": {**_OPENAPI_ERROR, "description": "invalid_run_id, or invalid_parameter (after, Last-Event-ID)"},
                "401": {**_OPENAPI_ERROR, "description": "unauthenticated"},
                "403": {**_OPENAPI_ERROR, "description": "insufficient_scope"},
                "404": {**_OPENAPI_ERROR, "description": "not_found (also a run of another workspace)"},
            },
        }
    }
    return result
