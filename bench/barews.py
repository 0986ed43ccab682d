"""A bare WebSocket fan-out for bench/console.py: what Daphne and Channels cost per frame alone.

Served by Daphne on the channel layer the settings configure (with REDIS_URL, ours: the pub/sub
layer of ledger/log/announce.py). Each socket is a Channels consumer that sends every message of one
group as a frame (its `text`), and nothing else: no session, no access check, no database, no
rendering, no catch-up. Two ways, by path:

  /          a group member per socket (`groups = [GROUP]`), Channels' usual pattern
  /shared    one group member for the process, which forwards each message to every socket here,
             a few sockets per turn of the event loop: how ledger/replay/follow.py's RunFeed fans a run's
             announcement out to its followers (WAKE_GROUP)

The bench sends the frame it measures (one of our rows, as the console renders it) with one
`group_send`; each subscriber's delay from that send is what Channels, Daphne, autobahn and Twisted
take to deliver it: the floor under the console's own live delivery on the same server. Plain
HTTP answers 200 (the start-up probe).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
django.setup()

from channels.generic.websocket import AsyncWebsocketConsumer  # noqa: E402  (needs the settings)
from channels.layers import get_channel_layer  # noqa: E402

from ledger.replay.follow import WAKE_GROUP  # noqa: E402

GROUP = "bench.barews"
SHARED_GROUP = "bench.barews.shared"


class Forward(AsyncWebsocketConsumer):
    groups = [GROUP]  # joined on connect, left on disconnect (Channels)

    async def bench_frame(self, event: dict[str, Any]) -> None:
        await self.send(text_data=event["text"])


class _Shared:
    """The process's one member of SHARED_GROUP and the sockets it forwards to (on the loop)."""

    sockets: list[SharedForward] = []
    joined: asyncio.Future[None] | None = None

    @classmethod
    async def join(cls, socket: SharedForward) -> None:
        if cls.joined is None:
            cls.joined = asyncio.get_running_loop().create_future()
            asyncio.ensure_future(cls._forward(cls.joined))
        await cls.joined
        cls.sockets.append(socket)

    @classmethod
    async def _forward(cls, joined: asyncio.Future[None]) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(SHARED_GROUP, channel)
        joined.set_result(None)
        while True:
            text = (await layer.receive(channel))["text"]
            for index, socket in enumerate(list(cls.sockets)):
                if index and not index % WAKE_GROUP:
                    await asyncio.sleep(0)  # let the loop write out the frames made so far
                await socket.send(text_data=text)


class SharedForward(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        await _Shared.join(self)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self in _Shared.sockets:
            _Shared.sockets.remove(self)


_websocket, _shared = Forward.as_asgi(), SharedForward.as_asgi()


async def application(
    scope: dict[str, Any],
    receive: Callable[[], Awaitable[dict[str, Any]]],
    send: Callable[[dict[str, Any]], Awaitable[None]],
) -> None:
    if scope["type"] == "websocket":
        await (_shared if scope["path"] == "/shared" else _websocket)(scope, receive, send)
    elif scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})
