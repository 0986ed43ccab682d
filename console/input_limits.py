"""Limits on what a request may carry, for the API and the console alike (docs/security.md
"Input limits"): the body's size however it is framed, and no NUL character in the path, the
query string or a form.

`BodyLimit` wraps the ASGI application: it counts the body's bytes as the server hands them over,
so a body sent without Content-Length (chunked) meets the same 10 MiB as one that declares it.
Past the limit it stops keeping the bytes (the rest is read and dropped, so memory stays bounded)
and marks the request; `InputLimitsMiddleware` then answers 413 before anything parses it. A
chunked body within the limit gets the Content-Length it lacked, without which DRF would read it
as empty.

A NUL anywhere in the path or a query parameter (or a console form field) is a 400: PostgreSQL
cannot hold it in text, SQLite can, and both must answer alike. So is a query parameter the API is
given twice (`?status=running&status=failed`): every API parameter takes one value, and reading
the last one would answer a question the client did not ask.

A body sent with `Content-Encoding` (gzip or deflate) is inflated by `decompressed`, for every
reader of a body (the API's JSON parser, the OTLP receiver), and meets the same 10 MiB once
inflated; another encoding is 415, never read as if it were plain.
"""

from __future__ import annotations

import zlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from django.core.exceptions import TooManyFieldsSent
from django.http import HttpRequest, HttpResponse, JsonResponse

from ledger.errors import LedgerError
from ledger.limits import NUL

MAX_BODY_BYTES = 10 * 1024 * 1024  # docs/api.md: request bodies over 10 MiB are 413 payload_too_large
TOO_LARGE = "runledger.body_too_large"  # the scope key BodyLimit sets

Scope = dict[str, Any]
Message = Mapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class PayloadTooLarge(LedgerError):
    code = "payload_too_large"
    status = 413

    def __init__(self) -> None:
        super().__init__("request bodies are limited to 10 MiB", limit=MAX_BODY_BYTES)


class InvalidParameter(LedgerError):
    code = "invalid_parameter"


class UnsupportedEncoding(LedgerError):
    code = "unsupported_media_type"
    status = 415


ENCODINGS = ("gzip", "deflate")


def decompressed(body: bytes, encoding: str, *, unreadable: Callable[[str], LedgerError]) -> bytes:
    """The body without its Content-Encoding (gzip, or deflate; none or `identity`: as it is),
    refused past the body limit once inflated (413 `payload_too_large`): a small bomb cannot fill
    the memory. Another encoding is 415 `unsupported_media_type` (`details.field`
    `Content-Encoding`). A stream that is not valid, cut short or followed by other bytes is
    `unreadable(message)`, the reader's own 400: a client must not be told that what it never
    fully sent was taken."""
    encoding = encoding.strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding not in ENCODINGS:
        raise UnsupportedEncoding(
            f"Content-Encoding {encoding!r} is not supported: gzip, deflate or none", field="Content-Encoding"
        )
    out = b""
    rest = body
    while True:  # gzip allows several members one after another (RFC 1952 §2.2); deflate is one stream
        inflater = zlib.decompressobj(wbits=31 if encoding == "gzip" else 15)
        try:
            out += inflater.decompress(rest, MAX_BODY_BYTES + 1 - len(out))
        except zlib.error as exc:
            raise unreadable(f"the body is not valid {encoding}: {exc}") from None
        if len(out) > MAX_BODY_BYTES or inflater.unconsumed_tail:
            raise PayloadTooLarge()
        if not inflater.eof:
            raise unreadable(f"the body is not valid {encoding}: the stream is cut short")
        rest = inflater.unused_data
        if not rest:
            return out
        if encoding != "gzip" or not rest.startswith(b"\x1f\x8b"):
            raise unreadable(f"the body is not valid {encoding}: {len(rest)} byte(s) follow the end of the stream")


class BodyLimit:
    """ASGI middleware: bodies over `limit` bytes, however framed, reach the app empty and marked
    `scope[TOO_LARGE]`."""

    def __init__(self, app: Asgi, limit: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        scope[TOO_LARGE] = False
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message.get("type") != "http.request" or scope[TOO_LARGE]:
                return message
            seen += len(message.get("body", b""))
            if seen <= self.limit:
                if not message.get("more_body", False):
                    _declare_length(scope, seen)
                return message
            scope[TOO_LARGE] = True
            while message.get("more_body", False):  # drain the rest without keeping it
                message = await receive()
                if message.get("type") != "http.request":
                    return message
            return {"type": "http.request", "body": b"", "more_body": False}

        await self.app(scope, limited, send)


def _declare_length(scope: Scope, length: int) -> None:
    """Give a body that came without Content-Length (chunked) the header, now that it is all here:
    DRF reads a request without one as empty. Django reads the whole body before it builds the
    request from the scope, so the request sees the header."""
    headers = scope.get("headers") or []
    if any(name.lower() == b"content-length" for name, _ in headers):
        return
    scope["headers"] = [*headers, (b"content-length", str(length).encode())]


def _refuse(request: HttpRequest, error: LedgerError) -> HttpResponse:
    if request.path.startswith("/api/"):
        return JsonResponse(error.error_body(), status=error.status)
    return HttpResponse(error.message, status=error.status, content_type="text/plain; charset=utf-8")


def _nul_parameter(items: Any) -> str | None:
    for name, values in items:
        if NUL in name or any(NUL in value for value in values):
            return name.replace(NUL, "\\u0000")
    return None


def _repeated_parameter(items: Any) -> str | None:
    return next((name for name, values in items if len(values) > 1), None)


class InputLimitsMiddleware:
    """Early in MIDDLEWARE: refuses a body over 10 MiB (declared, or counted by BodyLimit) with 413, and a NUL in
    the path, a query parameter or a console form with 400 `invalid_parameter` (the error body
    under /api/, plain text elsewhere), as is a query parameter given twice under /api/."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        scope = getattr(request, "scope", None)
        try:
            declared = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            declared = 0
        if declared > MAX_BODY_BYTES or (scope is not None and scope.get(TOO_LARGE)):
            return _refuse(request, PayloadTooLarge())
        if NUL in request.path:
            return _refuse(request, InvalidParameter("the path may not contain the NUL character (U+0000)"))
        try:
            name = _nul_parameter(request.GET.lists())
        except TooManyFieldsSent:  # Django's DATA_UPLOAD_MAX_NUMBER_FIELDS, 1,000
            if not request.path.startswith("/api/"):
                raise  # the console's styled 400 page (handler400)
            return _refuse(request, InvalidParameter("a request may carry at most 1,000 query parameters"))
        if name is not None:
            return _refuse(
                request,
                InvalidParameter(f"query parameter {name} may not contain the NUL character (U+0000)", parameter=name),
            )
        if request.path.startswith("/api/") and (name := _repeated_parameter(request.GET.lists())) is not None:
            return _refuse(
                request,
                InvalidParameter(f"query parameter {name} is given more than once; give it once", parameter=name),
            )
        # Console forms only: the API reads JSON bodies (checked by its parser), and reading
        # request.POST here would consume a body DRF still has to read.
        if (
            request.method == "POST"
            and not request.path.startswith("/api/")
            and request.content_type in ("application/x-www-form-urlencoded", "multipart/form-data")
        ):
            name = _nul_parameter(request.POST.lists())
            if name is not None:
                return _refuse(
                    request,
                    InvalidParameter(f"form field {name} may not contain the NUL character (U+0000)", parameter=name),
                )
        return self.get_response(request)
