"""Catch-up and live (docs/design.md §5 item 2): a run's events after a sequence, page by page, then
as they are written, until the run is finished. SSE and the WebSocket consumer only format frames.

The rules, in the order they are applied:

- **Subscribe first, then read.** The follower hears announcements on the run's channel-layer
  group (through its feed's channel, below) from before its first read, so an event committed
  between the two is either in the read or announced after it.
- **De-duplicate by sequence.** Only sequences above the last one handed out leave the follower,
  so an event both read and announced goes out once.
- **Announcements wake; the log answers.** The layer is lossy (another process's in-memory layer
  never reaches us; Redis may drop a message or be down), so without one the follower reads the
  head anyway every `LEDGER_STREAM_POLL_SECONDS`. An announcement of a small batch carries the
  batch as committed (ledger/log/announce.py: the stored columns of its events, the run's status
  after it); followers that stand exactly where it begins take it as their read (below). Anything
  else (a gap, a follower elsewhere, a message without the batch, one that does not add up) reads
  the database.
- **Stop when finished.** Once the run is completed or failed and everything up to its last
  sequence was handed out, the last page says so (`final`) and the iteration ends. A run deleted
  meanwhile ends it too, with `status` None.

One channel in the run's group and one read serve every follower of a run in this process
(`RunFeed`): fifty browsers on one run cost the layer one message and the database one read (and
one rendering) per announcement, not fifty. A follower whose transport gives it a `push` (the
WebSocket) and that waits for news exactly where an announced batch begins is handed that batch
by the feed itself, which sends it through `push`, instead of being woken to take the same read
on a turn of its own: the same items it would have taken, without a task switch per socket
(bench/README.md, console). Anyone else, and every page that ends a run, goes the way below.

A read is shared only with a follower it is fresh enough for: one woken by an announcement of
sequence S joins a read created after this process first heard S; a start or a poll joins only a
read created after it asked. Reads are keyed by the position they read after, so each follower
keeps its own position. The reads run on one thread
of the process that keeps its database connection (`_reader`), in one statement
(`selectors.run_tail`). An announcement that carries its batch (events P+1..S, the status after S)
becomes the feed's newest read after P, created once S was heard, as a read after P made just
after that commit would have answered: a commit's rows and the head it moved are what any later
read sees up to S. It serves only followers that need nothing announced past S (announcements of
one run can arrive out of order when two threads commit to it); whatever came after S is
announced after it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial
from typing import Any

from django.conf import settings
from django.db import connection

from ..log.announce import Subscription
from ..log.envelopes import decode_payload, row_envelope
from ..models import Run, RunStatus
from ..reads import selectors

log = logging.getLogger(__name__)

# Catch-up reads the log in pages so that a long run is never held in memory at once.
PAGE_SIZE = 500
FINISHED = RunStatus.finished()
STATUSES = frozenset(RunStatus.values)
ANY_SEQUENCE = 2**63  # above every sequence (a bigint)
HEARD_KEPT = 256  # announcements remembered per feed; a follower further behind reads afresh
WAKE_GROUP = 5  # followers woken per turn of the loop (RunFeed._announce)
LISTENER_GRACE = 2.0  # seconds a closing feed's listener has to take its leave message

# What a transport makes of one envelope (the WebSocket: its rendered row); done once per read.
Render = Callable[[dict[str, Any], Run], Any]
# How a transport sends a follower's items (sequence, rendered) the feed hands it (`Follower.push`).
Push = Callable[[list[tuple[int, Any]]], Awaitable[None]]
Snapshot = tuple[str | None, int, list[tuple[int, Any]]]  # status, last sequence, items after a position


def poll_seconds() -> float:
    return float(settings.LEDGER_STREAM_POLL_SECONDS)


def _envelope(envelope: dict[str, Any], run: Run) -> dict[str, Any]:
    return envelope


def announced_envelope(event: Any, run: Run) -> dict[str, Any]:
    """The envelope of one event as an announcement carries it (ledger.log.announce.announced_events:
    the columns a read returns, the time already formatted), as `selectors.run_tail` makes it."""
    sequence, event_id, type_, occurrence_id, recorded_at, payload = event
    if not (
        isinstance(sequence, int)
        and isinstance(event_id, str)
        and isinstance(type_, str)
        and isinstance(occurrence_id, str | None)
        and isinstance(recorded_at, str)
        and isinstance(payload, str)
    ):
        raise ValueError(f"not an announced event: {event!r}")
    return row_envelope(event, run.run_id, decode_payload(payload))


def _announced(message: dict[str, Any], run: Run) -> tuple[int, str, int, list[Any]] | None:
    """(position before, status, last sequence, events) of an announcement that carries its batch
    of this run, dense and ending at its sequence; None for any other."""
    events, status, last = message.get("events"), message.get("status"), message.get("sequence")
    if (
        not isinstance(events, list)
        or not events
        or status not in STATUSES
        or not isinstance(last, int)
        or message.get("runId") != run.run_id
    ):
        return None
    first = last - len(events) + 1
    for expected, event in enumerate(events, first):
        if not isinstance(event, list | tuple) or len(event) != 6 or event[0] != expected:
            return None
    return first - 1, status, last, events


# The live reads of this process run on one thread of their own, which keeps its database
# connection between reads: opening one per read (CONN_MAX_AGE=0 closes it after each, as for a
# request) was about half of a delivery's time on PostgreSQL (bench/console.py). The connection is
# closed after a failed read, and once no follower is left here.
_reader = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger-follow")
_followed = 0  # feeds alive in this process, over all event loops (each test has its own)
_followed_lock = threading.Lock()


def _read(run: Run, after: int, render: Render) -> Snapshot:
    """The run's status and last sequence, and up to a page of items after `after` (not past it:
    whoever handed out the last sequence saw the status that came with it, so a later announcement
    of it, which a follower skips, is never needed to end). On the reader thread."""
    try:
        tail = selectors.run_tail(run, after=after, limit=PAGE_SIZE)
    except Exception:
        connection.close()  # broken or not, the next read starts on a fresh one
        raise
    if tail is None:  # deleted by retention meanwhile
        return None, 0, []
    status, last_sequence, envelopes = tail
    return status, last_sequence, [(e["sequence"], render(e, run)) for e in envelopes]


def _feed_opened() -> None:
    global _followed
    with _followed_lock:
        _followed += 1


def _feed_closed() -> None:
    global _followed
    with _followed_lock:
        _followed -= 1
        if not _followed:
            _reader.submit(_close_connection)


def _close_connection() -> None:
    connection.close()  # the reader thread's own: `connection` is per thread


@dataclass
class _Read:
    created: int  # the feed's clock when it was asked for: its queries run after that
    task: asyncio.Future[Snapshot]
    full: bool = False
    # An announced batch's: what it holds is as of that batch's commit, so it answers only a
    # follower that needs nothing announced past it. None: a database read, as of `created`.
    upto: int | None = None


class RunFeed:
    """This process's channel in the run's group and its reads of the run for one rendering,
    shared by all of its followers here (see the module docstring). Lives while it has followers;
    everything in it runs on the loop."""

    def __init__(self, run: Run, render: Render, feeds: dict[int, RunFeed]) -> None:
        self.run = run
        self.render = render
        self.feeds = feeds
        self.at: Counter[int] = Counter()  # followers per position (the last sequence each handed out)
        self.positions: dict[Follower, int] = {}
        self.clock = 0
        self.heard: dict[int, int] = {}  # announced sequence -> clock when first heard here
        self.reads: dict[int, _Read] = {}  # position -> the newest read of the items after it
        self.database_reads = 0
        self.announced_reads = 0  # reads taken from announcements instead of the database
        self.pushed = 0  # batches handed to a follower by the feed (`_push`), per follower
        self.subscription = Subscription(run.pk)
        self.listener: asyncio.Task[None] | None = None
        self.joined = asyncio.ensure_future(self._subscribe())
        _feed_opened()

    async def subscribed(self) -> None:
        """Return once the feed hears the run's announcements (or knows it cannot: it polls)."""
        # A follower cancelled while it waits must not cancel the join for the others.
        await asyncio.shield(self.joined)

    async def _subscribe(self) -> None:
        if await self.subscription.join():
            self.listener = asyncio.ensure_future(self._listen())

    async def _listen(self) -> None:
        while True:
            try:
                message = await self.subscription.receive()
            except asyncio.CancelledError:
                raise
            except Exception:  # the layer is lossy; the followers go on polling meanwhile
                log.warning(
                    "receiving announcements on %s failed; polling meanwhile", self.subscription.group, exc_info=True
                )
                await asyncio.sleep(poll_seconds())
                continue
            if message is None:  # the feed closed
                return
            if message.get("type") == "ledger.appended":
                await self._announce(message.get("sequence"), self._take_batch(message))

    async def _announce(self, sequence: object, batch_after: int | None = None) -> None:
        """Hand the announced batch (read after `batch_after`, `_take_batch`) to the followers
        that can be pushed to, and wake the others; a few at a time, the loop turning in between:
        a follower's frames reach its socket's buffer as they are sent, but the server writes them
        out only on the loop's next turn, so with all fifty served at once the first subscriber's
        frame left after the fiftieth was made."""
        followers = list(self.positions)
        batch = self._pushable(sequence, batch_after)
        for start in range(0, len(followers), WAKE_GROUP):
            if start:
                await asyncio.sleep(0)
            for follower in followers[start : start + WAKE_GROUP]:
                if follower not in self.positions:  # gone meanwhile
                    continue
                if batch is not None and follower.waits_at(batch_after):
                    await self._push(follower, batch)
                else:
                    follower.announce(sequence)

    def _pushable(self, sequence: object, after: int | None) -> tuple[int, list[tuple[int, Any]]] | None:
        """(last sequence, items) of the batch just announced as `sequence`, taken as the read
        after `after`, when a follower standing there may be handed it: a page that does not end
        the run (its end, `final`, is the follower's own to hand out and act on) nor fill a page."""
        read = self.reads.get(after) if after is not None else None
        if read is None or read.upto != sequence:  # an announced batch's read is answered when made
            return None
        status, last, items = read.task.result()
        if status in FINISHED or not items or len(items) >= PAGE_SIZE:
            return None
        return last, items

    async def _push(self, follower: Follower, batch: tuple[int, list[tuple[int, Any]]]) -> None:
        """What the follower's own turn would do with the batch: move past it, then send it."""
        last, items = batch
        assert follower.push is not None
        follower.last_sent = last
        follower.pushed_at = asyncio.get_running_loop().time()  # its poll counts from here, as from a read
        self.moved(follower, last)
        self.pushed += 1
        try:
            await follower.push(items)
        except Exception:  # its own turn meets whatever broke, on its next send
            log.warning("pushing run %s to a follower failed", self.run, exc_info=True)
            follower.wake_to_read()

    def _take_batch(self, message: dict[str, Any]) -> int | None:
        """The batch an announcement carries, as the newest read after the position it continues,
        when a follower here stands there (module docstring); that position, or None."""
        announced = _announced(message, self.run)
        if announced is None or announced[0] not in self.at:
            return None
        after, status, last, events = announced
        try:
            items = [(event[0], self.render(announced_envelope(event, self.run), self.run)) for event in events]
        except Exception:  # whatever it is, the database answers instead
            log.warning("announced batch of %s not used; reading it", self.run, exc_info=True)
            return None
        self.heard_at(last)  # the read is created after the moment S was heard here, as one asked for then
        self.clock += 1
        task: asyncio.Future[Snapshot] = asyncio.get_running_loop().create_future()
        task.set_result((status, last, items))
        self.reads[after] = _Read(self.clock, task, upto=last)
        self.announced_reads += 1
        return after

    async def refresh(self) -> None:
        await self.subscription.refresh()

    async def close(self) -> None:
        """Leave the run's group: the last follower here left (`leave` said so)."""
        with suppress(Exception):
            await self.joined
        await self.subscription.leave()  # which ends the listener's receive
        if self.listener is not None:
            done, _ = await asyncio.wait({self.listener}, timeout=LISTENER_GRACE)
            if not done:  # asleep after a failed receive, or the layer did not answer
                self.listener.cancel()

    def now(self) -> int:
        return self.clock

    def heard_at(self, sequence: int) -> int:
        """The moment this process first heard of `sequence`: every read created later sees it."""
        if sequence not in self.heard:
            self.heard[sequence] = self.clock
            if len(self.heard) > HEARD_KEPT:
                del self.heard[next(iter(self.heard))]
        return self.heard[sequence]

    async def read(self, after: int, since: int, wanted: int = 0) -> Snapshot:
        """The run after `after`, from a read created after the moment `since` (and, if it is an
        announced batch, reaching the sequence `wanted`): the newest one for that position if it
        is, else a new one from the database."""
        read = self.reads.get(after)
        if read is None or read.created <= since or (read.upto is not None and read.upto < wanted):
            self.clock += 1
            read = _Read(self.clock, asyncio.ensure_future(self._fetch(after)))
            self.reads[after] = read
            read.task.add_done_callback(partial(self._settled, after, read))
        # A follower that leaves mid-read must not cancel the read for the others.
        return await asyncio.shield(read.task)

    async def _fetch(self, after: int) -> Snapshot:
        self.database_reads += 1
        return await asyncio.get_running_loop().run_in_executor(_reader, _read, self.run, after, self.render)

    def _settled(self, after: int, read: _Read, task: asyncio.Future[Snapshot]) -> None:
        if read.task.cancelled() or read.task.exception() is not None:  # also marks it retrieved
            if self.reads.get(after) is read:
                del self.reads[after]  # a failed read is retried, never shared

    def join(self, follower: Follower, position: int) -> None:
        self.positions[follower] = position
        self.at[position] += 1

    def moved(self, follower: Follower, position: int) -> None:
        old = self.positions.get(follower)
        if old is None or old == position:
            return
        self._vacate(old)
        self.positions[follower] = position
        self.at[position] += 1

    def leave(self, follower: Follower) -> bool:
        """Forget `follower`; True when it was the last one here: the caller then `close`s the feed."""
        old = self.positions.pop(follower, None)
        if old is None:
            return False
        self._vacate(old)
        if self.positions or self.feeds.get(self.run.pk) is not self:
            return False
        del self.feeds[self.run.pk]
        _feed_closed()
        return True

    def _vacate(self, position: int) -> None:
        self.at[position] -= 1
        if self.at[position] <= 0:
            del self.at[position]
            self.reads.pop(position, None)  # nobody here needs the items after it any more


# Per event loop (a Daphne process has one; each test's async_to_sync has its own), per
# rendering, per run pk.
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Render, dict[int, RunFeed]]] = (
    weakref.WeakKeyDictionary()
)


def feeds_here(render: Render = _envelope) -> dict[int, RunFeed]:
    """The running event loop's feeds of one rendering, by run pk."""
    return _feeds.setdefault(asyncio.get_running_loop(), {}).setdefault(render, {})


def _feed_for(run: Run, render: Render) -> RunFeed:
    feeds = feeds_here(render)
    if run.pk not in feeds:
        feeds[run.pk] = RunFeed(run, render, feeds)
    return feeds[run.pk]


@dataclass(frozen=True)
class Page:
    """Items (sequence, rendered envelope) above everything handed out before, in order.

    An empty page that is not final means the follower was idle for `idle_after` seconds (SSE
    sends its keepalive then)."""

    items: list[tuple[int, Any]]
    status: str | None  # the run's status when read; None: the run is gone
    final: bool = False  # nothing follows: finished and everything handed out, or gone


@dataclass
class _News:
    # Edge-triggered: an announcement asks for one read. (Waiting instead until the announced
    # sequence arrives would spin on an announcement of a sequence that was never written.)
    pending: bool = False
    since: int = 0  # the feed's clock when the newest useful announcement was first heard here
    # The highest sequence announced since the follower's last read began: an announced batch
    # serves it only if it reaches that far (announcements can arrive out of order: two threads
    # committing to one run). An announcement without a sequence asks for the database.
    wanted: int = 0
    # The idle follower's wait: a bare future, resolved by `wake` or its timer. (An Event under
    # asyncio.wait_for made a task per wait: fifty a commit for fifty followers.)
    waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)


class Follower:
    """One reader's catch-up and live pages of one run, after `after`.

    Use it as `async with Follower(run, after) as follower: async for page in follower: …`.
    It hears the run's announcements through its feed: one channel in the run's group per process
    and rendering, however many follow the run here, so a commit costs the layer one message per
    process rather than one per browser.
    """

    def __init__(
        self,
        run: Run,
        after: int,
        *,
        render: Render = _envelope,
        idle_after: float | None = None,
        push: Push | None = None,
    ) -> None:
        self.run = run
        self.last_sent = after
        self.render = render
        self.idle_after = idle_after
        # The transport's send of items the feed hands this follower while it waits (module
        # docstring); it must not interleave with the pages it iterates, which it does not while
        # the follower waits (the transport is awaiting the next page then).
        self.push = push
        self.pushed_at = 0.0  # the loop's time of the last batch the feed handed it: news, as a read is
        self.news = _News()
        self.feed: RunFeed | None = None

    async def __aenter__(self) -> Follower:
        self.feed = _feed_for(self.run, self.render)
        self.feed.join(self, self.last_sent)
        try:
            await self.feed.subscribed()  # subscribe first, then read
        except BaseException:
            await self._leave()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._leave()

    async def _leave(self) -> None:
        if self.feed is not None and self.feed.leave(self):
            await self.feed.close()

    def announce(self, sequence: object) -> None:
        """An announcement reached this follower: wake it if it may bring something new."""
        assert self.feed is not None
        if not isinstance(sequence, int):
            heard = self.feed.now()
            self.news.wanted = ANY_SEQUENCE
        elif sequence > self.last_sent:
            heard = self.feed.heard_at(sequence)
            self.news.wanted = max(self.news.wanted, sequence)
        else:
            return  # it announces nothing this follower has not handed out
        self.news.pending = True
        self.news.since = max(self.news.since, heard)
        self.news.wake()

    def waits_at(self, position: int | None) -> bool:
        """Whether the feed may hand this follower the batch after `position`: it has a push,
        stands there, and waits for news with none pending (its iteration is parked, so nothing
        else sends for it now)."""
        waiter = self.news.waiter
        return (
            self.push is not None
            and position == self.last_sent
            and not self.news.pending
            and waiter is not None
            and not waiter.done()
        )

    def wake_to_read(self) -> None:
        """Wake it to read the log afresh (after a push that failed)."""
        assert self.feed is not None
        self.news.pending = True
        self.news.since = self.feed.now()
        self.news.wake()

    def __aiter__(self) -> AsyncIterator[Page]:
        return self._pages()

    async def _pages(self) -> AsyncIterator[Page]:
        assert self.feed is not None, "use the follower as an async context manager"
        feed = self.feed
        loop = asyncio.get_running_loop()
        poll = poll_seconds()
        since = feed.now()
        last_page = loop.time()
        while True:
            self.news.pending = False
            wanted, self.news.wanted = self.news.wanted, 0
            try:
                status, last_sequence, items = await feed.read(self.last_sent, since, wanted)
            except asyncio.CancelledError:
                raise
            except Exception:  # a failed read is retried on the next poll or announcement
                log.warning("reading run %s failed; retrying", self.run, exc_info=True)
                status, last_sequence, items = "", 0, []
            last_read = loop.time()
            if status is None:
                yield Page([], None, final=True)
                return
            fresh = [(sequence, item) for sequence, item in items if sequence > self.last_sent]
            if fresh:
                self.last_sent = fresh[-1][0]
                feed.moved(self, self.last_sent)
            full = len(items) == PAGE_SIZE
            final = not full and status in FINISHED and self.last_sent >= last_sequence
            if fresh or final:
                yield Page(fresh, status, final)
                last_page = loop.time()
                if final:
                    await self._leave()  # its reads are done; whoever follows on shares without it
                    return
            if full:
                since = feed.now()
                continue
            # Read again on an announcement past last_sent, or when the poll timer runs out;
            # idle pages in between do not read the database.
            while True:
                wake_at = last_read + poll
                if self.idle_after is not None:
                    wake_at = min(wake_at, last_page + self.idle_after)
                await self._wait_for_news(wake_at - loop.time())
                last_read = max(last_read, self.pushed_at)  # a batch handed to it meanwhile was news too
                if self.idle_after is not None and loop.time() >= last_page + self.idle_after:
                    yield Page([], status)
                    last_page = loop.time()
                    await feed.refresh()
                if self.news.pending:
                    since = self.news.since
                    break
                if loop.time() >= last_read + poll:
                    since = feed.now()
                    break

    async def _wait_for_news(self, timeout: float) -> None:
        """Return when an announcement past last_sent arrives, or after `timeout` seconds."""
        if self.news.pending or timeout <= 0:
            return
        loop = asyncio.get_running_loop()
        waiter = self.news.waiter = loop.create_future()
        timer = loop.call_later(timeout, self.news.wake)
        try:
            await waiter
        finally:
            timer.cancel()
            self.news.waiter = None
