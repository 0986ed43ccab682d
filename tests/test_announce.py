"""The after-commit announcer (ledger/announce.py): messages that wait together while its sender is
busy go out coalesced. What coalescing must never cost (an event that reaches no subscriber) is
tested end to end in tests/test_live_run.py; here, what goes out on the layer."""

from __future__ import annotations

import asyncio
from typing import Any

from channels.layers import InMemoryChannelLayer

from ledger import announce
from ledger.announce import group_for, workspace_group_for


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
        _appended("run_a", 5), _appended("run_b", 1),
        {"type": "ledger.run_changed", "runId": "run_a"}, {"type": "ledger.run_changed", "runId": "run_b"},
        {"type": "test.last"},
    ]
