"""A bare WebSocket fan-out for bench/console.py: what Daphne and Channels cost per frame alone.

Served by Daphne on the channel layer the settings configure (with REDIS_URL, ours: the pub/sub
layer of ledger/announce.py), each socket is a Channels consumer that joins one group when it
connects and sends every group message's `text` as a frame, and nothing else: no session, no
access check, no database, no rendering, no catch-up. The bench sends the frame it measures (a row
as the console renders it) with one `group_send`; every subscriber's delay from that send is what
Channels, Daphne, autobahn and Twisted take to deliver it, the floor under the console's own live
delivery on the same server. Plain HTTP answers 200 (the start-up probe).
"""

from __future__ import annotations

import os
from typing import Any, Awaitable, Callable

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402  (needs the settings)

GROUP = "bench.barews"


class Forward(AsyncWebsocketConsumer):
    groups = [GROUP]  # joined on connect, left on disconnect (Channels)

    async def bench_frame(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["text"])


_websocket = Forward.as_asgi()


async def application(scope: dict[str, Any], receive: Callable[[], Awaitable[dict[str, Any]]],
                      send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    if scope["type"] == "websocket":
        await _websocket(scope, receive, send)
    elif scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
