"""After-commit announcements of appended events on the channel layer, and hearing them.

The layer is lossy by design: a message carries the run and its last sequence (or, to a
workspace's runs list, only the run id), and readers fetch what changed from the database. A run's
message also carries the batch as committed, when it is small (`events`: each new event's stored
columns, `status`: the run's status after it), so that a reader standing exactly where the batch
begins can hand it out without a read (ledger/replay/follow.py); anyone else, and everyone after a lost,
merged or oversized message, reads the log, which stays the authority.

With Redis the layer is `RedisPubSubLayer` below: channels_redis's pub/sub layer, on which a group
message is one PUBLISH that Redis hands to the processes subscribed to the group at that moment
(nobody watching: Redis drops it), where the default channels_redis layer keeps groups in sorted
sets and looks each group up (two commands) before pushing to every member's list. Announcements
are written by the committing thread itself, as one non-blocking send of the PUBLISH on a
connection of their own whose replies Redis is told not to send (CLIENT REPLY OFF): no round trip,
no wait, no hand-over to another thread. Whatever that send cannot do at once (no such connection
yet, Redis gone or not reading) goes to a publisher thread with a blocking client, which also
(re)opens the connection; the committing thread never waits for Redis (bench/README.md, "Runtime").
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import secrets
import socket
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from typing import Any

import redis
from asgiref.sync import SyncToAsync, async_to_sync
from channels.layers import BaseChannelLayer, InMemoryChannelLayer, get_channel_layer
from channels_redis.pubsub import RedisPubSubChannelLayer  # type: ignore[import-untyped]
from channels_redis.utils import decode_hosts  # type: ignore[import-untyped]
from django.db import transaction

from ..models import Run

log = logging.getLogger(__name__)


def group_for(run_pk: int) -> str:
    return f"ledger.run.{run_pk}"


def workspace_group_for(workspace_pk: int) -> str:
    return f"ledger.workspace.{workspace_pk}"


# The events that change a run's row in its workspace's runs list or its place on the Approvals
# page: a new row, its final status, its tokens and cost (its own and its tree's: a sub-run's
# call moves its parent's row too, which the list reads again whole), and its attention (a tool
# call that starts or stops waiting for a person, one in doubt or reconciled, a step's retry
# scheduled or started). Other appends move nothing the list shows; its duration ticks in the page.
_LISTED = frozenset(
    {
        "RunStarted",
        "RunCompleted",
        "RunFailed",
        "harness.model.responded",
        "harness.tool_call.approval_requested",
        "harness.tool_call.approved",
        "harness.tool_call.rejected",
        "harness.tool_call.in_doubt",
        "harness.tool_call.reconciled",
        "StepFailed",
        "StepAttemptStarted",
    }
)


_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _background_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process that sends the announcements to a network layer (channels_redis
    keeps its connections on it instead of opening one per announcement)."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="ledger-announce", daemon=True).start()
        return _loop


Message = dict[str, Any]


# What a run's message carries besides its run and type: messages that differ only in these wait
# as one (`_Waiting`), the newest whole.
_CARRIED = frozenset({"sequence", "status", "events"})
# The batch rides along up to this many characters of stored payload (and never more events than a
# reader's page); a bigger batch is announced by its sequence alone.
ANNOUNCED_PAYLOAD_CHARS = 16 * 1024
ANNOUNCED_EVENTS = 500


def _sequence(message: Message) -> int:
    sequence = message.get("sequence")
    return sequence if isinstance(sequence, int) else -1


class _Waiting:
    """The announcements waiting to go out, and whether their sender is busy with them.

    Posting never waits for the layer: the committing thread only files the message and, when the
    sender is idle, wakes it. Messages that differ in nothing but their sequence (a run's appends)
    wait as one, the highest sequence standing for all: a reader woken by it reads everything up
    to it from the database, so under a burst of commits the layer carries one message per run per
    round trip instead of one per commit."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting: dict[tuple[Any, ...], tuple[BaseChannelLayer, str, Message]] = {}
        self.busy = False  # the sender is woken or sending; it drains `waiting` before it idles

    def file(self, layer: BaseChannelLayer, group: str, message: Message) -> bool:
        """File `message`; True when the sender was idle and must be woken."""
        # Besides what a run's message carries along (_CARRIED), announcements hold scalars only
        # (type, ids), so the rest of one is a key; the newest message of a key is kept whole.
        key = (id(layer), group, *sorted((k, v) for k, v in message.items() if k not in _CARRIED))
        with self.lock:
            earlier = self.waiting.get(key)
            if earlier is None or _sequence(message) >= _sequence(earlier[2]):
                self.waiting[key] = (layer, group, message)
            if self.busy:
                return False
            self.busy = True
            return True

    def take(self) -> list[tuple[BaseChannelLayer, str, Message]]:
        """Everything waiting; empty when nothing is, and the sender is idle from then on."""
        with self.lock:
            batch = list(self.waiting.values())
            self.waiting.clear()
            self.busy = bool(batch)
            return batch

    def drop(self) -> None:
        with self.lock:
            self.waiting.clear()
            self.busy = False


class _Sender(_Waiting):
    """The announcements waiting to go out on one event loop, and the one task that sends them."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self.loop = loop

    def post(self, layer: BaseChannelLayer, group: str, message: Message) -> None:
        if not self.file(layer, group, message):
            return
        try:
            self.loop.call_soon_threadsafe(self._start)
        except RuntimeError:  # the loop is closed: nobody is left on it to hear
            self.drop()

    def _start(self) -> None:
        self.loop.create_task(self._drain())

    async def _drain(self) -> None:
        while batch := self.take():
            for layer, group, message in batch:
                try:
                    await layer.group_send(group, message)
                except Exception:  # an announcement lost is caught up by readers; the append has committed
                    log.warning("announcement %s to %s was lost", message, group, exc_info=True)


class RedisPubSubLayer(RedisPubSubChannelLayer):
    """channels_redis's pub/sub layer (console/settings.py names it when REDIS_URL is set), plus
    what the announcements need of it: a blocking PUBLISH of a group message, for the publisher
    thread, and the end of a channel that a `Subscription` leaves.

    The blocking client writes exactly what the layer's `group_send` writes (the group's Redis
    channel, the layer's serializer): tests/test_announce.py holds the two together."""

    def __init__(self, hosts: Any = None, prefix: str = "asgi", **kwargs: Any) -> None:
        super().__init__(hosts=hosts, prefix=prefix, **kwargs)
        self.prefix = prefix
        self.hosts = decode_hosts(hosts)
        self.client: redis.Redis | None = None

    def group_channel(self, group: str) -> str:
        return f"{self.prefix}__group__{group}"

    @property
    def publishes_directly(self) -> bool:
        # One shard given by a URL, as the settings configure it; anything else (several shards,
        # a sentinel) is sent by the layer itself on the background loop.
        return len(self.hosts) == 1 and "address" in self.hosts[0]

    def publish_now(self, group: str, message: Message) -> None:
        """`group_send`, blocking, from any thread (only the publisher thread calls it)."""
        if self.client is None:
            options = dict(self.hosts[0])
            self.client = redis.Redis.from_url(options.pop("address"), **options)
        self.client.publish(self.group_channel(group), self.serialize(message))

    def publish_command(self, group: str, message: Message) -> bytes:
        """The PUBLISH that `group_send` makes, as the bytes of one Redis command (RESP)."""
        channel, payload = self.group_channel(group).encode(), self.serialize(message)
        return b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(payload), payload)

    def open_unanswered(self) -> _Unanswered | None:
        """A connection of its own on which Redis sends no replies (CLIENT REPLY OFF), for
        `_Unanswered.send`; None for a connection that is not a plain TCP or Unix socket (TLS)."""
        options = dict(self.hosts[0])
        pool = redis.ConnectionPool.from_url(options.pop("address"), **options)
        conn = pool.make_connection()
        if type(conn) not in (redis.connection.Connection, redis.connection.UnixDomainSocketConnection):
            pool.disconnect()
            return None
        conn.connect()  # its handshake (AUTH, SELECT, ...) is answered, before replies are turned off
        # A server that refuses CLIENT REPLY (an old or a managed one) would answer every PUBLISH
        # to a reader that never reads: asked first with an answer, ON, and not used if refused.
        conn.send_command("CLIENT", "REPLY", "ON")
        try:
            conn.read_response()
        except redis.ResponseError:
            conn.disconnect()
            return None
        conn.send_command("CLIENT", "REPLY", "OFF")
        sock = conn._sock  # type: ignore[attr-defined]
        if not isinstance(sock, socket.socket):
            conn.disconnect()
            return None
        sock.setblocking(False)
        return _Unanswered(conn, sock)

    async def forget_channel(self, channel: str) -> None:
        """Unsubscribe `channel` and drop its queue. The layer does that itself only when a
        `receive` on the channel is cancelled, as a consumer's is when it ends; a `Subscription`
        ends its receive with a message instead (see there)."""
        layer = self._get_layer()
        if layer.channels.pop(channel, None) is not None:
            await layer._get_shard(channel).unsubscribe(channel)


class _Unanswered:
    """A Redis connection that gets no replies: a command written to it is done with once the
    kernel took all of its bytes. Not thread-safe: its `_Publisher` sends under its lock."""

    def __init__(self, conn: Any, sock: socket.socket) -> None:
        self.conn, self.sock = conn, sock

    def send(self, command: bytes) -> bool:
        """Write `command` without waiting; False (and the connection closed: a command cut short
        is never run) when the kernel did not take all of it at once or the connection is gone."""
        with suppress(OSError):  # the connection is gone: closed below, as a short send is
            if self.sock.send(command) == len(command):
                return True
        self.close()
        return False

    def close(self) -> None:
        with suppress(Exception):  # closing a connection that is already broken
            self.conn.disconnect()


class _Publisher(_Waiting):
    """The announcements for one `RedisPubSubLayer`: written by the poster on the connection that
    gets no replies (`direct`) when it is open and nothing waits for the thread; otherwise filed
    for the publisher thread, which publishes them with a blocking client and then opens `direct`
    (again). The poster never waits for Redis: the send is non-blocking, and one the kernel does not
    take whole closes `direct` and goes to the thread. Redis being slow or away delays the thread only."""

    def __init__(self, layer: RedisPubSubLayer) -> None:
        super().__init__()
        self.layer = layer
        self.direct: _Unanswered | None = None  # set by the thread, dropped by a failed send
        self.wake: queue.SimpleQueue[None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="ledger-publish", daemon=True).start()

    def post(self, group: str, message: Message) -> None:
        self.post_all(((group, message),))

    def post_all(self, messages: Sequence[tuple[str, Message]]) -> None:
        """Post `messages` (group, message) in order: on `direct` as one write (a batch that moves
        the runs list announces to its run and its workspace with one system call, not two)."""
        if self.direct is not None:
            command = b"".join(self.layer.publish_command(group, message) for group, message in messages)
            with self.lock:  # one writer at a time on `direct`; and nothing older still waiting
                direct = self.direct
                if direct is not None and not self.busy:
                    if direct.send(command):
                        return
                    # Cut short: the commands the kernel took whole may have run and go again
                    # from the thread (a second announcement of a sequence only wakes a reader).
                    self.direct = None
        wake = False
        for group, message in messages:
            wake = self.file(self.layer, group, message) or wake
        if wake:
            self.wake.put(None)

    def _run(self) -> None:
        self._open_direct()
        while True:
            self.wake.get()
            while batch := self.take():
                for _, group, message in batch:
                    try:
                        self.layer.publish_now(group, message)
                    except Exception:  # an announcement lost is caught up by readers; the append has committed
                        log.warning("announcement %s to %s was lost", message, group, exc_info=True)
            if self.direct is None:
                self._open_direct()

    def _open_direct(self) -> None:
        try:
            direct = self.layer.open_unanswered()
        except Exception:  # Redis away: the thread publishes meanwhile, and tries again when next woken
            log.warning("could not open the announcements' connection to Redis", exc_info=True)
            return
        with self.lock:
            self.direct = direct


_publishers: dict[RedisPubSubLayer, _Publisher] = {}  # one per layer, and a process has one layer
# A forked child has none of its parent's threads: it starts publishers of its own.
os.register_at_fork(after_in_child=_publishers.clear)


def _publisher_for(layer: RedisPubSubLayer) -> _Publisher:
    with _loop_lock:
        if layer not in _publishers:
            _publishers[layer] = _Publisher(layer)
        return _publishers[layer]


_senders: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Sender] = weakref.WeakKeyDictionary()


def _sender_on(loop: asyncio.AbstractEventLoop) -> _Sender:
    with _loop_lock:
        if loop not in _senders:
            _senders[loop] = _Sender(loop)
        return _senders[loop]


def _send(group: str, message: Message) -> None:
    """`_send_all` of one message."""
    _send_all(((group, message),))


def _send_all(messages: Sequence[tuple[str, Message]]) -> None:
    """Hand each (group, message) to the sender of the loop its readers are on, in order; never
    waits for the layer.

    The Redis pub/sub layer is published to from its publisher thread; any other network layer is
    reached from the background loop. The in-memory layer's queues belong to
    the loop that reads them, which is the server's (Daphne's, or a test's) when this runs in sync
    code under it; with no such loop nobody in this process can be waiting on one, so it is put in
    the queues here and now, if the group has any."""
    layer = get_channel_layer()
    if layer is None:
        return
    if isinstance(layer, RedisPubSubLayer) and layer.publishes_directly:
        try:
            _publisher_for(layer).post_all(messages)
        except Exception:  # an announcement lost is caught up by readers; the append has committed
            log.warning("announcements %s were lost", messages, exc_info=True)
        return
    for group, message in messages:
        try:
            if not isinstance(layer, InMemoryChannelLayer):
                _sender_on(_background_loop()).post(layer, group, message)
            elif (outer := getattr(SyncToAsync.threadlocal, "main_event_loop", None)) is not None:
                _sender_on(outer).post(layer, group, message)
            elif layer.groups.get(group):
                # A group nobody joined gets nothing: no event loop is started to send it nothing
                # (async_to_sync runs one on a new thread: ~40 % of a runtime model call without Redis).
                async_to_sync(layer.group_send)(group, message)
        except Exception:  # an announcement lost is caught up by readers; the append has committed
            log.warning("announcement %s to %s was lost", message, group, exc_info=True)


def announced_events(written: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]]) -> list[list[Any]] | None:
    """The batch as a run's message carries it: per new event `[sequence, eventId, type,
    occurrenceId, recordedAt, stored payload text]`, the columns of a read of the log
    (envelopes.log_rows; ledger.replay.follow.announced_envelope makes the envelope of one); None when the batch is too big to
    ride along."""
    if not written or len(written) != len(rows) or len(written) > ANNOUNCED_EVENTS:
        return None
    size = 0
    events = []
    for env, row in zip(written, rows, strict=True):
        text = row["payload"]
        size += len(text)
        if size > ANNOUNCED_PAYLOAD_CHARS or row["sequence"] != env["sequence"]:
            return None
        events.append([env["sequence"], env["eventId"], env["type"], env.get("occurrenceId"), env["recordedAt"], text])
    return events


def announcement(
    run: Run, sequence: int, written: Sequence[Mapping[str, Any]] = (), rows: Sequence[Mapping[str, Any]] = ()
) -> Callable[[], None]:
    """What announces a batch to the run's group, and to the workspace's group when the batch
    moved the run's row in the runs list (_LISTED); to be called only once the batch has committed (a reader woken by
    it must find the rows it is told about). `written` are the batch's new envelopes and `rows` the
    columns stored for them, in the same order (no query is made); `run` holds its status after the batch."""
    group, run_id = group_for(run.pk), run.run_id
    appended: Message = {"type": "ledger.appended", "runId": run_id, "sequence": sequence}
    events = announced_events(written, rows)
    if events is not None and events[-1][0] == sequence:
        appended["status"] = str(run.status)
        appended["events"] = events
    listed = any(e["type"] in _LISTED for e in written)
    workspace_group = workspace_group_for(run.workspace_id)

    def send() -> None:
        if listed:
            _send_all(((group, appended), (workspace_group, {"type": "ledger.run_changed", "runId": run_id})))
        else:
            _send(group, appended)

    return send


def send_after_commit(group: str, message: dict[str, Any]) -> None:
    """Send `message` to `group` once the current transaction commits (re-execution changes,
    ledger/reexecution); lossy like every announcement, readers fetch the state themselves."""
    transaction.on_commit(lambda: _send(group, message))


class Subscription:
    """A channel of this process's own in a run's group (ledger.replay.follow listens on it). Joining
    and leaving never fail the reader: without the layer it only hears nothing, and polls.

    Leaving ends a pending `receive` with None by sending the channel a message of its own:
    cancelling a channels_redis receive instead can be lost inside redis-py's read timeout
    (Python 3.11's asyncio.timeout), which left a stream hanging after its end frame."""

    def __init__(self, run_pk: int) -> None:
        self.group = group_for(run_pk)
        self.layer: BaseChannelLayer | None = None
        self.channel: str | None = None
        self.left = {"type": "ledger.subscription_left", "token": secrets.token_hex(8)}

    async def join(self) -> bool:
        layer = get_channel_layer()
        if layer is None:
            return False
        try:
            channel = await layer.new_channel()
            await layer.group_add(self.group, channel)
        except Exception:
            log.warning("could not join %s; polling the database only", self.group, exc_info=True)
            return False
        self.layer, self.channel = layer, channel
        return True

    async def receive(self) -> dict[str, Any] | None:
        """The next message on the channel; None once the subscription was left."""
        assert self.layer is not None and self.channel is not None
        message = await self.layer.receive(self.channel)
        if message != self.left:
            return message
        if isinstance(self.layer, RedisPubSubLayer):
            await self.layer.forget_channel(self.channel)
        # channels_redis drops a received message from its backup queue in a task of its own,
        # holding a lock of the layer meanwhile: wait for it, so that an event loop that closes
        # next (a test's) does not leave that lock held for the next loop.
        cleaners = list(getattr(self.layer, "receive_cleaners", ()))
        if cleaners:
            await asyncio.wait(cleaners)
        return None

    async def refresh(self) -> None:
        """Layers expire group membership (a day by default); a long reader renews it."""
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_add(self.group, self.channel)
            except Exception:
                log.warning("could not renew %s", self.group, exc_info=True)

    async def leave(self) -> None:
        if self.layer is not None and self.channel is not None:
            try:
                await self.layer.group_discard(self.group, self.channel)
                await self.layer.send(self.channel, self.left)
            except Exception:
                log.warning("could not leave %s", self.group, exc_info=True)
