"""`/ws/runs/<runId>/?after=N&workspace=T/W`: a run's timeline rows, caught up and then live.

Catch-up (DESIGN.md §5 item 2), as the SSE stream does it (console/api/stream.py): join the run's
group *before* reading the database, so an event committed between the two is either in the read
or announced after it; send only sequences above the last one sent, so an event both read and
announced goes out once. An announcement only wakes the consumer: its content is never trusted,
the events are read from the database. The layer is lossy (another process's in-memory layer
never reaches us; Redis may drop a message), so without announcements the consumer still reads
the head every `LEDGER_STREAM_POLL_SECONDS`.

One read serves every subscriber of a run in this process (`RunFeed`): fifty browsers on one run
cost one database read and one rendering per announcement, not fifty. A read is shared only with
a subscriber it is fresh enough for: one woken by an announcement of sequence S joins a read
created after this process first heard S (every copy of one announcement leaves Redis after the
same commit); a connect or a poll joins only a read created after it asked. Reads are keyed by
the position they read after, so each subscriber keeps its own `after`, and it sends only the
sequences above the last one it sent; an announcement of a sequence it has sent wakes nothing.

Messages: `{"type": "event", "sequence": N, "html": "<tr …>"}` (the page's own row template) and,
once the run is finished and everything up to its last sequence was sent, `{"type": "end",
"status": …}`, after which the socket closes. Nothing is ever written from `receive`.

Who may subscribe: a signed-in member of the run's tenant. Anonymous, unknown run, another
tenant's run, a bad `after`: the handshake is refused (the same for all, so nothing is revealed).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
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
from ledger.models import Run, RunStatus

log = logging.getLogger(__name__)

PAGE_SIZE = 500
HEARD_KEPT = 256  # announcements remembered per feed; a subscriber further behind reads afresh

Snapshot = tuple[str | None, int, list[tuple[int, str]]]  # status, last sequence, rows after a position


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


def _read(run: Run, after: int) -> Snapshot:
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
    # Not past the head: whoever sent the last sequence saw the status that came with it, so a
    # later announcement of it (which a subscriber skips) is never needed to send `end`.
    return status, last_sequence, [(e["sequence"], render_row(event_row(e, run.workspace)))
                                   for e in envelopes if e["sequence"] <= last_sequence]


@dataclass
class _Read:
    created: int  # the feed's clock when it was asked for: its queries run after that
    task: asyncio.Future[Snapshot]


class RunFeed:
    """This process's reads of one run, shared by all of its subscribers here (see the module
    docstring). Lives while it has subscribers; everything in it runs on the event loop."""

    def __init__(self, run: Run, feeds: dict[int, RunFeed]) -> None:
        self.run = run
        self.feeds = feeds
        self.at: Counter[int] = Counter()  # subscribers per position (the last sequence each sent)
        self.positions: dict[object, int] = {}
        self.clock = 0
        self.heard: dict[int, int] = {}  # announced sequence -> clock when first heard here
        self.reads: dict[int, _Read] = {}  # position -> the newest read of the rows after it
        self.database_reads = 0

    def now(self) -> int:
        return self.clock

    def heard_at(self, sequence: int) -> int:
        """The moment this process first heard of `sequence`: every read created later sees it."""
        if sequence not in self.heard:
            self.heard[sequence] = self.clock
            if len(self.heard) > HEARD_KEPT:
                del self.heard[next(iter(self.heard))]
        return self.heard[sequence]

    async def read(self, after: int, since: int) -> Snapshot:
        """The run after `after`, from a read created after the moment `since`: the newest one
        for that position if it is, else a new one."""
        read = self.reads.get(after)
        if read is None or read.created <= since:
            self.clock += 1
            fresh = _Read(self.clock, asyncio.ensure_future(self._fetch(after)))
            self.reads[after] = read = fresh
            fresh.task.add_done_callback(lambda _task: self._settled(after, fresh))
        # A subscriber that leaves mid-read must not cancel the read for the others.
        return await asyncio.shield(read.task)

    async def _fetch(self, after: int) -> Snapshot:
        self.database_reads += 1
        return await database_sync_to_async(_read)(self.run, after)

    def _settled(self, after: int, read: _Read) -> None:
        if read.task.cancelled() or read.task.exception() is not None:  # also marks it retrieved
            if self.reads.get(after) is read:
                del self.reads[after]  # a failed read is retried, never shared

    def join(self, subscriber: object, position: int) -> None:
        self.positions[subscriber] = position
        self.at[position] += 1

    def moved(self, subscriber: object, position: int) -> None:
        old = self.positions.get(subscriber)
        if old is None or old == position:
            return
        self._vacate(old)
        self.positions[subscriber] = position
        self.at[position] += 1

    def leave(self, subscriber: object) -> None:
        old = self.positions.pop(subscriber, None)
        if old is None:
            return
        self._vacate(old)
        if not self.positions and self.feeds.get(self.run.pk) is self:
            del self.feeds[self.run.pk]

    def _vacate(self, position: int) -> None:
        self.at[position] -= 1
        if self.at[position] <= 0:
            del self.at[position]
            self.reads.pop(position, None)  # nobody here needs the rows after it any more


# Per event loop (a Daphne process has one; each test's async_to_sync has its own), per run pk.
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, RunFeed]] = weakref.WeakKeyDictionary()


def feeds_here() -> dict[int, RunFeed]:
    """The feeds of the running event loop, by run pk."""
    return _feeds.setdefault(asyncio.get_running_loop(), {})


def feed_for(run: Run) -> RunFeed:
    feeds = feeds_here()
    if run.pk not in feeds:
        feeds[run.pk] = RunFeed(run, feeds)
    return feeds[run.pk]


class RunConsumer(AsyncJsonWebsocketConsumer):
    run: Run | None = None
    feed: RunFeed | None = None
    group: str | None = None
    last_sent = 0
    live = False  # accepted and not yet ended
    last_read = 0.0  # loop time of the last database read it used
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
        self.feed = feed_for(run)
        self.feed.join(self, after)
        await self.accept()
        self.live = True
        if await self._catch_up(self.feed.now()):
            self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        self.live = False
        if self.feed is not None:
            self.feed.leave(self)
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
        if not self.live or self.feed is None:
            return
        sequence = message.get("sequence")
        if not isinstance(sequence, int):
            await self._catch_up(self.feed.now())
        elif sequence > self.last_sent:  # else it announces nothing this socket has not sent
            await self._catch_up(self.feed.heard_at(sequence))

    async def _poll(self) -> None:
        """Read the database when nothing else made it read for a poll interval."""
        interval = float(settings.LEDGER_STREAM_POLL_SECONDS)
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, self.last_read + interval - loop.time()))
            if loop.time() < self.last_read + interval:
                continue  # an announcement made it read meanwhile
            try:
                assert self.feed is not None
                if not await self._catch_up(self.feed.now()):
                    return
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed read is retried on the next tick or announcement
                log.warning("reading run %s failed; retrying", self.run, exc_info=True)

    async def _catch_up(self, since: int) -> bool:
        """Send every row after the last one sent, from reads created after the moment `since`;
        False once `end` went out (or the run is gone)."""
        assert self.run is not None and self.feed is not None
        async with self.lock:
            while self.live:
                status, last_sequence, rows = await self.feed.read(self.last_sent, since)
                self.last_read = asyncio.get_running_loop().time()
                if status is None:
                    self._stop()
                    await self.close(code=4404)
                    return False
                for sequence, html in rows:
                    if sequence > self.last_sent:
                        await self.send_json({"type": "event", "sequence": sequence, "html": html})
                        self.last_sent = sequence
                self.feed.moved(self, self.last_sent)
                if len(rows) == PAGE_SIZE:
                    continue
                if status in RunStatus.finished() and self.last_sent >= last_sequence:
                    self._stop()
                    await self.send_json({"type": "end", "status": status})
                    await self.close(code=1000)
                    return False
                return True
            return False

    def _stop(self) -> None:
        self.live = False
        if self.feed is not None:
            self.feed.leave(self)


websocket_urlpatterns = [
    path("ws/runs/<str:run_id>/", RunConsumer.as_asgi(), name="ws-run"),  # type: ignore[arg-type]  # Channels routes ASGI apps with Django's path(); the stubs allow only views
]
