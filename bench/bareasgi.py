"""A bare ASGI application for bench/ingest.py: it reads a request's whole body and answers 200
with BENCH_BARE_RESPONSE_BYTES bytes of JSON, and nothing else. Served by Daphne, it measures what
Daphne itself costs per request (HTTP parsing, the body's messages, the response's writing, the
loopback and the client), with no Django, no thread hop and no database."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

_SIZE = max(16, int(os.environ.get("BENCH_BARE_RESPONSE_BYTES", "1000")))
_BODY = b'{"pad":"' + b"x" * (_SIZE - 11) + b'"}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_BODY)).encode())]


async def application(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] != "http":
        return
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _BODY})
