"""What every console WebSocket shares: a cap on the sockets one user holds open, and the re-check
of their credentials while a socket lives (console/streams.py, docs/security.md "Streams").

Every `LEDGER_STREAM_KEEPALIVE_SECONDS` the socket asks whether its session still exists and its
user may still see what the socket shows; when not, it stops sending and closes with code 4401.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer

from ledger.tenancy.access import Access

from ..streams import CLOSE_CREDENTIALS, Grant, Slot, grant_for, keepalive_seconds, still_allowed, take_slot

log = logging.getLogger(__name__)


def _allowed(grant: Grant) -> bool:
    try:
        return still_allowed(grant)
    except Exception:  # cannot tell: the socket closes, and the browser reconnects and is asked again
        log.warning("re-checking a socket's credentials failed", exc_info=True)
        return False


class WatchedConsumer(AsyncJsonWebsocketConsumer):
    slot: Slot | None = None
    watcher: asyncio.Task[None] | None = None

    def take_slot(self) -> bool:
        """A slot among the user's open streams; False when they hold the most allowed (refuse)."""
        self.slot = take_slot(self.scope["user"])
        return self.slot is not None

    def watch(self, found: Access, workspace: str | None) -> None:
        """Re-check, every keepalive, that the socket's user may still see `found`."""
        grant = grant_for(self.scope["user"], self.scope.get("session"), workspace=workspace, found=found)
        self.watcher = asyncio.create_task(self._watch(grant))

    async def _watch(self, grant: Grant) -> None:
        interval = keepalive_seconds()
        while True:
            await asyncio.sleep(interval)
            if not await database_sync_to_async(_allowed)(grant):
                await self.stop_sending()
                await self.close(code=CLOSE_CREDENTIALS)
                return

    async def stop_sending(self) -> None:
        """Stop whatever sends on the socket (before it closes for lost credentials)."""

    async def stop_watching(self) -> None:
        if self.watcher is not None and self.watcher is not asyncio.current_task():
            self.watcher.cancel()
            with suppress(asyncio.CancelledError):
                await self.watcher
        if self.slot is not None:
            self.slot.release()

    async def disconnect(self, code: int) -> None:
        await self.stop_watching()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The console's sockets are one-way: whatever a client sends (JSON or not) is ignored."""
