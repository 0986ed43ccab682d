"""`/ws/runs/<runId>/?after=N&workspace=T/W`: a run's timeline rows, caught up and then live.

Catch-up (DESIGN.md §5 item 2), as the SSE stream does it (ledger/api/stream.py): join the run's
group *before* reading the database, so an event committed between the two is either in the read
or announced after it; send only sequences above the last one sent, so an event both read and
announced goes out once. An announcement only wakes the consumer: its content is never trusted,
the events are read from the database. The layer is lossy (another process's in-memory layer
never reaches us; Redis may drop a message), so without announcements the consumer still reads
the head every `LEDGER_STREAM_POLL_SECONDS`.

Messages: `{"type": "event", "sequence": N, "html": "<tr …>"}` (the page's own row template) and,
once the run is finished and everything up to its last sequence was sent, `{"type": "end",
"status": …}`, after which the socket closes. Nothing is ever written from `receive`.

Who may subscribe: a signed-in member of the run's tenant. Anonymous, unknown run, another
tenant's run, a bad `after`: the handshake is refused (the same for all, so nothing is revealed).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings
from django.urls import path

from console.pages.run import event_row, render_row
from ledger import selectors
from ledger.announce import group_for
from ledger.errors import NotFound
from ledger.models import Run

log = logging.getLogger(__name__)

PAGE_SIZE = 500
FINISHED = ("completed", "failed")


def _find_run(user: Any, run_id: str, workspace: str | None) -> Run | None:
    """The run among the member's workspaces; `workspace=T/W` picks one (needed when two hold
    the same run id). None for anything the user may not see."""
    if not getattr(user, "is_authenticated", False):
        return None
    if workspace:
        tenant, _, slug = workspace.partition("/")
        try:
            ws = selectors.workspace_for(user, tenant, slug)
            run = selectors.get_run(ws, run_id)
        except NotFound:
            return None
        run.workspace = ws
        return run
    found = list(Run.objects.filter(workspace__in=selectors.workspaces_for(user), run_id=run_id)
                 .select_related("workspace__tenant")[:2])
    return found[0] if len(found) == 1 else None


def _read(run: Run, after: int) -> tuple[str | None, int, list[tuple[int, str]]]:
    """The run's status and last sequence, then up to a page of rendered rows after `after`.

    The head first: its last sequence commits with the events, so the page read next holds
    everything up to it (or is full)."""
    head = Run.objects.filter(pk=run.pk).values_list("status", "last_sequence").first()
    if head is None:  # deleted by retention meanwhile
        return None, 0, []
    status, last_sequence = head
    if last_sequence <= after:
        return status, last_sequence, []
    envelopes = selectors.events(run, after=after, limit=PAGE_SIZE)
    return status, last_sequence, [(e["sequence"], render_row(event_row(e, run.workspace))) for e in envelopes]


class RunConsumer(AsyncJsonWebsocketConsumer):
    run: Run | None = None
    group: str | None = None
    last_sent = 0
    live = False  # accepted and not yet ended
    last_read = 0.0  # loop time of the last database read
    poller: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            after = int(query.get("after", ["0"])[0] or 0)
        except ValueError:
            after = -1
        if after < 0:
            await self.close(code=4400)
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        run = await database_sync_to_async(_find_run)(self.scope.get("user"), run_id,
                                                      query.get("workspace", [""])[0])
        if run is None:
            await self.close(code=4404)
            return
        self.run, self.last_sent = run, after
        self.lock = asyncio.Lock()
        # Join first, read second: see the module docstring.
        self.group = group_for(run.pk)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        self.live = True
        if await self._catch_up():
            self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        self.live = False
        if self.poller is not None:
            self.poller.cancel()
            with suppress(asyncio.CancelledError):
                await self.poller
        if self.group is not None:
            try:
                await self.channel_layer.group_discard(self.group, self.channel_name)
            except Exception:
                log.warning("could not leave %s", self.group, exc_info=True)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any) -> None:
        """The socket is one-way: whatever a client sends (JSON or not) is ignored."""

    async def ledger_appended(self, message: dict[str, Any]) -> None:
        if self.live:
            await self._catch_up()

    async def _poll(self) -> None:
        """Read the database when nothing else made it read for a poll interval."""
        interval = float(getattr(settings, "LEDGER_STREAM_POLL_SECONDS", 1.0))
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self.last_read + interval - loop.time()))
            if loop.time() < self.last_read + interval:
                continue  # an announcement made it read meanwhile
            try:
                if not await self._catch_up():
                    return
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed read is retried on the next tick or announcement
                log.warning("reading run %s failed; retrying", self.run, exc_info=True)

    async def _catch_up(self) -> bool:
        """Send every row after the last one sent; False once `end` went out (or the run is gone)."""
        assert self.run is not None
        async with self.lock:
            while self.live:
                status, last_sequence, rows = await database_sync_to_async(_read)(self.run, self.last_sent)
                self.last_read = asyncio.get_running_loop().time()
                if status is None:
                    self.live = False
                    await self.close(code=4404)
                    return False
                for sequence, html in rows:
                    if sequence > self.last_sent:
                        await self.send_json({"type": "event", "sequence": sequence, "html": html})
                        self.last_sent = sequence
                if len(rows) == PAGE_SIZE:
                    continue
                if status in FINISHED and self.last_sent >= last_sequence:
                    self.live = False
                    await self.send_json({"type": "end", "status": status})
                    await self.close(code=1000)
                    return False
                return True
            return False


websocket_urlpatterns = [
    path("ws/runs/<str:run_id>/", RunConsumer.as_asgi(), name="ws-run"),
]
