"""`/ws/runs/<runId>/?after=N&workspace=T/W`: a run's timeline rows, caught up and then live.

Catch-up and live delivery are ledger.replay.follow's (subscribe first, de-duplicate by sequence, poll
when announcements are lost, stop when finished; one channel in the run's group, one shared read
and one rendering per announcement for every subscriber of the run in this process, which the
run's feed sends to the sockets standing where an announced batch begins through `_push`). The
consumer authorizes and formats frames.

Messages: `{"type": "event", "sequence": N, "html": "<tr …>"}` (the page's own row template) and,
once the run is finished and everything up to its last sequence was sent, `{"type": "end",
"status": …}`, after which the socket closes. Nothing is ever written from `receive`.

Who may subscribe: a signed-in member of the run's tenant. Anonymous, unknown run, another
tenant's run, a bad `after`: the handshake is refused (the same for all, so nothing is revealed);
so is a user's socket past LEDGER_STREAM_MAX_PER_CALLER. While open, the socket re-checks every
keepalive that the session and the membership still hold, and closes with 4401 when not
(console/live/watch.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import suppress
from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.urls import path

from ledger.errors import LedgerError
from ledger.limits import MAX_ROW_ID
from ledger.models import Run
from ledger.replay import follow
from ledger.tenancy import access
from ledger.tenancy.access import Access

from ..rows import event_row, render_event_row
from ..timeline import annotate
from .watch import WatchedConsumer

log = logging.getLogger(__name__)


def _find_run(user: Any, run_id: str, workspace: str | None) -> Access | None:
    """The run among the member's workspaces; `workspace=T/W` picks one (needed when two hold
    the same run id). None for anything the user may not see."""
    if user is None:
        return None
    try:
        return access.resolve(user, workspace=workspace or None, run_id=run_id)
    except LedgerError:
        return None


def _row(envelope: dict[str, Any], run: Run) -> str:
    """The event's whole message, as JSON text: made once per shared read (ledger.replay.follow), sent as
    it is to every subscriber of the run here."""
    row = event_row(envelope, run.workspace)
    # Its offset, summary and call as the page draws them (console/timeline.py); a gap and the
    # pairing with the row before need that row, which the page already holds.
    annotate([row], [envelope], run, gaps=False)
    return json.dumps({"type": "event", "sequence": envelope["sequence"], "html": render_event_row(row)})


def feeds_here() -> dict[int, follow.RunFeed]:
    """This event loop's shared reads of rendered rows, by run pk."""
    return follow.feeds_here(_row)


class RunConsumer(WatchedConsumer):
    follower: follow.Follower | None = None
    sender: asyncio.Task[None] | None = None

    async def connect(self) -> None:
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        try:
            after = int(query.get("after", ["0"])[0] or 0)
        except ValueError:
            after = -1
        if not 0 <= after <= MAX_ROW_ID:  # a sequence is a bigint
            await self.close(code=4400)
            return
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        workspace = query.get("workspace", [""])[0] or None
        found = await database_sync_to_async(_find_run)(self.scope.get("user"), run_id, workspace)
        if found is None or found.run is None:
            await self.close(code=4404)
            return
        if not self.take_slot():  # the user holds as many streams as allowed
            await self.close(code=4429)
            return
        self.follower = await follow.Follower(found.run, after, render=_row, push=self._push).__aenter__()
        await self.accept()
        self.sender = asyncio.create_task(self._send_pages(self.follower))
        self.watch(found, workspace)

    async def _send_pages(self, follower: follow.Follower) -> None:
        try:
            await self._forward(follower)
        except asyncio.CancelledError:
            raise
        except Exception:  # the socket went away mid-send, or a read kept failing: end this socket only
            log.warning("following run %s failed", follower.run, exc_info=True)
            await self.close(code=1011)

    async def _forward(self, follower: follow.Follower) -> None:
        async for page in follower:
            if page.status is None:  # deleted by retention meanwhile
                await self.close(code=4404)
                return
            await self._push(page.items)
            if page.final:
                await self.send_json({"type": "end", "status": page.status})
                await self.close(code=1000)
                return

    async def _push(self, items: list[tuple[int, Any]]) -> None:
        """Send items as frames: a page's, or those the run's feed hands this socket itself while
        its follower waits (ledger.replay.follow)."""
        for _, message in items:
            await self.send(text_data=message)

    async def stop_sending(self) -> None:
        if self.sender is not None and self.sender is not asyncio.current_task():
            self.sender.cancel()
            with suppress(asyncio.CancelledError):
                await self.sender

    async def disconnect(self, code: int) -> None:
        await self.stop_sending()
        if self.follower is not None:
            follower, self.follower = self.follower, None
            await follower.__aexit__(None, None, None)
        await self.stop_watching()


websocket_urlpatterns = [
    path("ws/runs/<str:run_id>/", RunConsumer.as_asgi(), name="ws-run"),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
