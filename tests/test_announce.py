"""The after-commit announcer (ledger/log/announce.py): messages that wait together while its sender is
busy go out coalesced. What coalescing must never cost (an event that reaches no subscriber) is
tested end to end in tests/test_live_run.py; here, what goes out on the layer."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import patch

import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer

from ledger.log import announce
from ledger.log.announce import RedisPubSubLayer, group_for, workspace_group_for
from tests.servers import free_port


def _appended(run_id: str, sequence: int) -> dict[str, Any]:
    return {"type": "ledger.appended", "runId": run_id, "sequence": sequence}


def test_announcements_waiting_together_go_out_once_per_run_with_the_highest_sequence() -> None:
    layer = InMemoryChannelLayer()
    loop = asyncio.new_event_loop()  # not running yet: every post below waits for the sender
    try:
        channel = loop.run_until_complete(layer.new_channel())
        for group in (group_for(1), group_for(2), workspace_group_for(1)):
            loop.run_until_complete(layer.group_add(group, channel))
        sender = announce._sender_on(loop)
        # A later commit's callback may run first (two threads on one run): the highest wins.
        for sequence in (3, 5, 4):
            sender.post(layer, group_for(1), _appended("run_a", sequence))
        sender.post(layer, group_for(2), _appended("run_b", 1))
        for run_id in ("run_a", "run_a", "run_b"):
            sender.post(layer, workspace_group_for(1), {"type": "ledger.run_changed", "runId": run_id})

        async def everything_sent() -> list[dict[str, Any]]:
            received = [await layer.receive(channel) for _ in range(4)]
            # Nothing else was sent: the next message on the channel is this one.
            await layer.send(channel, {"type": "test.last"})
            return received + [await layer.receive(channel)]

        received = loop.run_until_complete(everything_sent())
    finally:
        loop.close()
    assert received == [
        _appended("run_a", 5),
        _appended("run_b", 1),
        {"type": "ledger.run_changed", "runId": "run_a"},
        {"type": "ledger.run_changed", "runId": "run_b"},
        {"type": "test.last"},
    ]


def test_run_messages_carrying_their_batch_wait_as_one_the_newest_whole() -> None:
    layer = InMemoryChannelLayer()
    loop = asyncio.new_event_loop()
    try:
        channel = loop.run_until_complete(layer.new_channel())
        loop.run_until_complete(layer.group_add(group_for(1), channel))
        sender = announce._sender_on(loop)

        def carrying(sequence: int, status: str) -> dict[str, Any]:
            event = [sequence, f"evt_{sequence}", "StepScheduled", None, "2026-12-01T00:00:00.000Z", "{}"]
            return {**_appended("run_a", sequence), "status": status, "events": [event]}

        for message in (
            carrying(3, "running"),
            carrying(5, "completed"),
            carrying(4, "running"),
            _appended("run_a", 2),
        ):
            sender.post(layer, group_for(1), message)

        async def everything_sent() -> list[dict[str, Any]]:
            received = [await layer.receive(channel)]
            await layer.send(channel, {"type": "test.last"})
            return received + [await layer.receive(channel)]

        received = loop.run_until_complete(everything_sent())
    finally:
        loop.close()
    assert received == [carrying(5, "completed"), {"type": "test.last"}]


def test_a_group_nobody_joined_on_the_in_memory_layer_starts_no_event_loop() -> None:
    """With no server loop in this thread (a command, a worker): a group with a member is sent
    to on a loop of its own (async_to_sync), a group without one is not."""
    layer = InMemoryChannelLayer()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(layer.group_add(group_for(2), loop.run_until_complete(layer.new_channel())))
    finally:
        loop.close()
    with (
        patch.object(announce, "get_channel_layer", return_value=layer),
        patch.object(announce.SyncToAsync, "threadlocal", threading.local()),
        patch.object(announce, "async_to_sync") as started,
    ):
        announce._send(group_for(1), _appended("run_a", 1))
        assert not started.called
        announce._send(group_for(2), _appended("run_b", 1))
    started.assert_called_once_with(layer.group_send)
    started.return_value.assert_called_once_with(group_for(2), _appended("run_b", 1))


# --- the Redis pub/sub layer (console/settings.py's with REDIS_URL), on a Redis of the test's own ---


class PrivateRedis:
    """A redis-server of the test's own, which it may kill and start again on the same port."""

    def __init__(self, directory: Path, *options: str) -> None:
        self.directory = directory
        self.options = options
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/3"
        self.server: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.server = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                *self.options,
            ],
            stdout=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        try:
            for _ in range(200):
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    time.sleep(0.05)
        finally:
            client.close()

    def kill(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    assert shutil.which("redis-server"), "redis-server is needed: the Redis pass starts one of its own here"
    server = PrivateRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def _pubsub_layer(url: str) -> RedisPubSubLayer:
    return RedisPubSubLayer(
        hosts=[{"address": url, "socket_timeout": 15, "socket_connect_timeout": 5}], prefix="asgi.db3."
    )


@pytest.mark.redis_only
def test_the_publisher_thread_writes_what_group_send_writes(private_redis: PrivateRedis) -> None:
    layer = _pubsub_layer(private_redis.url)

    async def heard() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(group_for(1), channel)
        assert layer.group_channel(group_for(1)) == layer._get_layer()._get_group_channel_name(group_for(1))
        await layer.group_send(group_for(1), _appended("run_a", 1))
        announce._publisher_for(layer).post(group_for(1), _appended("run_a", 2))
        return [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(2)]

    assert async_to_sync(heard)() == [_appended("run_a", 1), _appended("run_a", 2)]


@pytest.mark.redis_only
def test_the_poster_writes_on_the_unanswered_connection_what_group_send_writes(private_redis: PrivateRedis) -> None:
    layer = _pubsub_layer(private_redis.url)
    publisher = announce._publisher_for(layer)
    for _ in range(200):  # the publisher thread opens it
        if publisher.direct is not None:
            break
        time.sleep(0.05)
    direct = publisher.direct
    assert direct is not None
    assert (
        layer.publish_command(group_for(1), _appended("run_a", 1))
        == redis.connection.Connection().pack_command(
            "PUBLISH", layer.group_channel(group_for(1)), layer.serialize(_appended("run_a", 1))
        )[0]
    )

    async def heard() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(group_for(1), channel)
        await _subscribed(private_redis, layer.group_channel(group_for(1)))
        for sequence in (1, 2):
            publisher.post(group_for(1), _appended("run_a", sequence))
        return [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(2)]

    assert async_to_sync(heard)() == [_appended("run_a", 1), _appended("run_a", 2)]
    # Written by the poster, not filed for the thread; and Redis sent nothing back to read.
    assert publisher.direct is direct and not publisher.busy and not publisher.waiting
    assert _nothing_to_read(direct.sock)


class _CountedSends:
    """A socket that counts the writes made on it (the poster's system calls)."""

    def __init__(self, sock: Any) -> None:
        self.sock, self.sends = sock, 0

    def send(self, data: bytes) -> int:
        self.sends += 1
        return int(self.sock.send(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sock, name)


@pytest.mark.redis_only
def test_a_batch_announced_to_its_run_and_its_workspace_goes_out_in_one_write(private_redis: PrivateRedis) -> None:
    layer = _pubsub_layer(private_redis.url)
    publisher = announce._publisher_for(layer)
    for _ in range(200):  # the publisher thread opens it
        if publisher.direct is not None:
            break
        time.sleep(0.05)
    direct = publisher.direct
    assert direct is not None
    counted = direct.sock = _CountedSends(direct.sock)
    changed = {"type": "ledger.run_changed", "runId": "run_a"}

    async def heard() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        for group in (group_for(1), workspace_group_for(1)):
            await layer.group_add(group, channel)
            await _subscribed(private_redis, layer.group_channel(group))
        publisher.post_all(((group_for(1), _appended("run_a", 1)), (workspace_group_for(1), changed)))
        return [await asyncio.wait_for(layer.receive(channel), 10) for _ in range(2)]

    assert async_to_sync(heard)() == [_appended("run_a", 1), changed]
    assert counted.sends == 1
    assert publisher.direct is direct and not publisher.busy and not publisher.waiting


async def _subscribed(server: PrivateRedis, channel: str) -> None:
    """Until Redis has the subscription: the layer's SUBSCRIBE is not waited for, and a PUBLISH
    written at once on another connection may reach Redis first."""
    client = redis.Redis.from_url(server.url)
    try:
        for _ in range(200):
            if dict(client.pubsub_numsub(channel)).get(channel.encode(), 0):
                return
            await asyncio.sleep(0.05)
    finally:
        client.close()
    raise AssertionError(f"{channel} never subscribed")


@pytest.mark.redis_only
def test_a_redis_that_refuses_client_reply_gets_its_announcements_from_the_thread(tmp_path: Path) -> None:
    assert shutil.which("redis-server")
    server = PrivateRedis(tmp_path, "--rename-command", "CLIENT", "")
    server.start()
    try:
        layer = _pubsub_layer(server.url)
        assert layer.open_unanswered() is None
        publisher = announce._publisher_for(layer)

        async def heard() -> dict[str, Any]:
            channel = await layer.new_channel()
            await layer.group_add(group_for(1), channel)
            await _subscribed(server, layer.group_channel(group_for(1)))
            publisher.post(group_for(1), _appended("run_a", 1))
            return await asyncio.wait_for(layer.receive(channel), 10)

        assert async_to_sync(heard)() == _appended("run_a", 1)
        assert publisher.direct is None
    finally:
        server.kill()


def _nothing_to_read(sock: Any) -> bool:
    try:
        sock.recv(1)
    except BlockingIOError:
        return True
    return False


@pytest.mark.redis_only
def test_a_subscription_left_on_the_pubsub_layer_unsubscribes_its_channel(private_redis: PrivateRedis) -> None:
    layer = _pubsub_layer(private_redis.url)
    client = redis.Redis.from_url(private_redis.url)

    async def scenario() -> tuple[int, int]:
        subscription = announce.Subscription(1)
        with patch.object(announce, "get_channel_layer", return_value=layer):
            assert await subscription.join()
        during = len(client.pubsub_channels())
        await subscription.leave()
        assert await asyncio.wait_for(subscription.receive(), 10) is None
        return during, len(client.pubsub_channels())

    try:
        # Its own channel and the group's while joined; nothing once left (a leak otherwise).
        assert async_to_sync(scenario)() == (2, 0)
    finally:
        client.close()


@pytest.mark.redis_only
def test_announcements_reach_subscribers_again_once_redis_is_back(private_redis: PrivateRedis) -> None:
    """Lost while Redis is away (readers poll meanwhile); heard again once it is back, with
    nothing of ours restarted: the layer subscribes anew and the publisher reconnects."""
    layer = _pubsub_layer(private_redis.url)
    publisher = announce._publisher_for(layer)

    async def scenario() -> list[dict[str, Any] | None]:
        channel = await layer.new_channel()
        await layer.group_add(group_for(1), channel)

        async def heard(sequence: int) -> dict[str, Any] | None:
            received = asyncio.ensure_future(layer.receive(channel))
            for _ in range(60):  # pub/sub keeps nothing for later: announce until one arrives
                publisher.post(group_for(1), _appended("run_a", sequence))
                done, _ = await asyncio.wait({received}, timeout=0.5)
                if done:
                    return received.result()
            received.cancel()
            return None

        before = await heard(1)
        private_redis.kill()
        publisher.post(group_for(1), _appended("run_a", 2))  # lost: nothing raises to the committer
        private_redis.start()
        return [before, await heard(3)]

    assert async_to_sync(scenario)() == [_appended("run_a", 1), _appended("run_a", 3)]
