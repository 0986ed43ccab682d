"""ledger/replay/follow.py: a batch that rides along with its announcement (ledger/log/announce.py) is what a
read of the log would have returned, and followers take it only where it continues exactly from
their position; everything else reads the database. Delivery end to end (every event once, in
order, across positions, bursts and lost announcements) is tested in tests/test_live_run.py and
tests/test_stream.py, where these batches ride along too."""

from __future__ import annotations

import asyncio
from typing import Any
from unittest.mock import patch

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from ledger import log
from ledger.log import announce
from ledger.log.artifacts import INLINE_LIMIT_BYTES
from ledger.log.envelopes import format_recorded_at
from ledger.models import Event, Run, Workspace
from ledger.reads import selectors
from ledger.replay import follow
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db(transaction=True)


def _append_heard(workspace: Workspace, run_id: str, *events: dict[str, Any]) -> list[dict[str, Any]]:
    """Append (one transaction) and return the run messages its commit announced."""
    sent: list[tuple[str, dict[str, Any]]] = []
    # Every announcement goes through _send_all (_send is one message of it).
    with patch.object(announce, "_send_all", side_effect=sent.extend):
        log.append(workspace=workspace, run_id=run_id, events=list(events))
    return [message for _, message in sent if message["type"] == "ledger.appended"]


def _as_read(run: Run, message: dict[str, Any]) -> tuple[str, int, list[dict[str, Any]]]:
    events = message["events"]
    return message["status"], message["sequence"], [follow.announced_envelope(e, run) for e in events]


def _read_after(run: Run, after: int) -> tuple[str, int, list[dict[str, Any]]]:
    tail = selectors.run_tail(run, after=after, limit=follow.PAGE_SIZE)
    assert tail is not None
    return tail


PAYLOADS = [
    {"stepPath": "s", "b": 1, "a": {"z": [1, 2.5, -3, 1e21, 0.1], "é": "ü\u2028\u2029", "": None}},
    {
        "stepPath": "s",
        "emoji": "\U0001f600 \ud7ff",
        "control": '\x01\x1f\n\t"\\',
        "big": 2**53 - 1,
        "neg": -(2**53) + 1,
    },
    {"stepPath": "s", "nested": {"b": {"d": [], "c": {}}, "a": [True, False, None]}, "float": 1.5e300},
    {"stepPath": "s", "order": {"10": 1, "9": 2, "a": 3, "B": 4, "\u00e9": 5, "\U0001f600": 6, "\uff61": 7}},
]


def test_an_announced_batch_is_what_a_read_after_its_start_returns(workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_carry", events=[started()])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_carry")
    batches = [
        [ev("StepScheduled", **payload) for payload in PAYLOADS],
        [{**ev("custom.login", password="hunter2", user="u"), "idempotencyKey": "k1"}],  # redacted before storage
        [{"type": "custom.tick", "occurrenceId": "occ_1", "payload": {"n": 1}}],
        [ev("RunCompleted", output={"z": 1, "a": 2})],
    ]
    for batch in batches:
        before = Run.objects.get(pk=run.pk).last_sequence
        (message,) = _append_heard(workspace, "run_carry", *batch)
        assert _as_read(run, message) == _read_after(run, before)
    assert message["status"] == "completed"


def test_a_batch_too_big_to_ride_along_is_announced_by_its_sequence_alone(workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_big", events=[started()])
    big = "x" * announce.ANNOUNCED_PAYLOAD_CHARS
    (message,) = _append_heard(workspace, "run_big", ev("StepScheduled", stepPath="s", text=big))
    assert message == {"type": "ledger.appended", "runId": "run_big", "sequence": 2}
    many = [ev("StepScheduled", stepPath=f"s{n}") for n in range(announce.ANNOUNCED_EVENTS + 1)]
    (message,) = _append_heard(workspace, "run_big", *many)
    assert "events" not in message and message["sequence"] == 3 + announce.ANNOUNCED_EVENTS
    # A payload stored as an artifact reference rides along as its reference, as it is read.
    huge = "y" * (INLINE_LIMIT_BYTES + 1)
    before = Run.objects.get(run_id="run_big").last_sequence
    (message,) = _append_heard(workspace, "run_big", ev("StepScheduled", stepPath="h", text=huge))
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_big")
    assert _as_read(run, message) == _read_after(run, before)


# What an append accepts: no NUL (PostgreSQL's jsonb), no lone surrogates.
_text = st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=12)


@hypothesis_settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.dictionaries(
        _text,
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**53) + 1, 2**53 - 1)
            | st.floats(allow_nan=False, allow_infinity=False)
            | _text,
            lambda children: st.lists(children, max_size=3) | st.dictionaries(_text, children, max_size=3),
            max_leaves=12,
        ),
        max_size=5,
    )
)
def test_any_payload_rides_along_as_it_reads_back(workspace: Workspace, payload: dict[str, Any]) -> None:
    if not Run.objects.filter(run_id="run_any").exists():
        log.append(workspace=workspace, run_id="run_any", events=[started()])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_any")
    before = Run.objects.get(pk=run.pk).last_sequence
    (message,) = _append_heard(workspace, "run_any", {"type": "custom.any", "payload": payload})
    assert _as_read(run, message) == _read_after(run, before)


def _message(run: Run, **changes: Any) -> dict[str, Any]:
    good = {
        "type": "ledger.appended",
        "runId": run.run_id,
        "sequence": 4,
        "status": "running",
        "events": [
            [3, "evt_a", "StepScheduled", None, "2026-12-01T00:00:00.000Z", '{"stepPath":"a"}'],
            [4, "evt_b", "StepScheduled", None, "2026-12-01T00:00:00.000Z", '{"stepPath":"b"}'],
        ],
    }
    return {**good, **changes}


def test_only_a_whole_dense_batch_of_this_run_is_taken(workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_shape", events=[started()])
    run = Run.objects.get(run_id="run_shape")
    events = _message(run)["events"]
    assert follow._announced(_message(run), run) == (2, "running", 4, events)
    for bad in [
        _message(run, runId="run_other"),  # another run's
        _message(run, status="finished"),  # no such status
        _message(run, sequence=5),  # does not end at its sequence
        _message(run, events=[events[1], events[0]]),  # not in order
        _message(run, events=[events[0], [5, *events[1][1:]]], sequence=5),  # a gap
        _message(run, events=[]),
        _message(run, events="[]"),
        _message(run, events=[events[0], events[1][:5]]),  # a row short
        _message(run, sequence="4"),
        {"type": "ledger.appended", "runId": run.run_id, "sequence": 4},  # the sequence alone
    ]:
        assert follow._announced(bad, run) is None, bad
    with pytest.raises(ValueError):
        follow.announced_envelope([3, "evt_a", "StepScheduled", None, None, "{}"], run)


async def _collect(follower: follow.Follower, queue: asyncio.Queue[follow.Page]) -> None:
    async for page in follower:
        await queue.put(page)


def test_followers_at_the_batch_start_take_it_and_a_follower_elsewhere_reads_the_log(
    workspace: Workspace, settings: Any
) -> None:
    settings.LEDGER_STREAM_POLL_SECONDS = 60  # only announcements make them read
    log.append(workspace=workspace, run_id="run_split", events=[started(), ev("StepScheduled", stepPath="a")])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_split")

    def append(*paths: str) -> Any:
        return database_sync_to_async(log.append)(
            workspace=workspace, run_id="run_split", events=[ev("StepScheduled", stepPath=p) for p in paths]
        )

    async def idle(*followers: follow.Follower) -> None:
        """Until each follower waits for news (its start read is over)."""
        while any(f.news.waiter is None for f in followers):
            await asyncio.sleep(0.01)

    async def scenario() -> tuple[list[list[int]], list[int], list[tuple[int, int]]]:
        async with follow.Follower(run, 2) as a, follow.Follower(run, 2) as b, follow.Follower(run, 2) as late:
            feed = a.feed
            assert feed is not None
            queues: list[asyncio.Queue[follow.Page]] = [asyncio.Queue(), asyncio.Queue()]
            # `late` is not iterated: it keeps its position while the others move on.
            tasks = [asyncio.ensure_future(_collect(f, q)) for f, q in zip((a, b), queues)]
            got: list[list[int]] = [[], []]
            reads = []
            for batch in (("b", "c"), ("d",)):
                await asyncio.wait_for(idle(a, b), 10)
                before = (feed.database_reads, feed.announced_reads)
                await append(*batch)
                for n, queue in enumerate(queues):
                    got[n] += [sequence for sequence, _ in (await asyncio.wait_for(queue.get(), 10)).items]
                reads.append((feed.database_reads - before[0], feed.announced_reads - before[1]))
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            # Its first read is a start (joins no earlier read), and it is behind the announced batches.
            before_late = feed.database_reads
            late_page = await asyncio.wait_for(late.__aiter__().__anext__(), 10)
            assert feed.database_reads == before_late + 1
            return got, [sequence for sequence, _ in late_page.items], reads

    got, late, reads = async_to_sync(scenario)()
    assert got == [[3, 4, 5], [3, 4, 5]]
    assert late == [3, 4, 5]
    assert reads == [(0, 1), (0, 1)]  # per announcement one batch taken for both, no database read


def test_an_announced_batch_does_not_answer_a_follower_woken_by_a_later_sequence(
    workspace: Workspace, settings: Any
) -> None:
    """Two threads committing to one run may announce out of order: S+1 heard before S's batch.
    That batch is as of S, so the follower reads the database for S+1 (else it waited a poll)."""
    settings.LEDGER_STREAM_POLL_SECONDS = 60  # only announcements make them read
    log.append(workspace=workspace, run_id="run_order", events=[started(), ev("StepScheduled", stepPath="a")])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_order")

    def append_unannounced() -> dict[str, Any]:
        with patch.object(announce, "_send_all"):  # announced by hand below
            log.append(workspace=workspace, run_id="run_order", events=[ev("StepScheduled", stepPath="b")])
            log.append(workspace=workspace, run_id="run_order", events=[ev("StepScheduled", stepPath="c")])
        third = Event.objects.get(run=run, sequence=3)
        return {
            "type": "ledger.appended",
            "runId": "run_order",
            "sequence": 3,
            "status": "running",
            "events": [
                [
                    3,
                    third.event_id,
                    third.type,
                    third.occurrence_id,
                    format_recorded_at(third.recorded_at),
                    third.payload,
                ]
            ],
        }

    async def scenario() -> tuple[list[int], tuple[int, int]]:
        async with follow.Follower(run, 2) as follower:
            feed = follower.feed
            assert feed is not None
            pages = follower.__aiter__()
            first = asyncio.ensure_future(pages.__anext__())
            while follower.news.waiter is None:  # its start read is over: nothing after 2
                await asyncio.sleep(0.01)
            batch = await database_sync_to_async(append_unannounced)()
            before = (feed.database_reads, feed.announced_reads)
            await feed._announce(4)  # heard first, and nothing runs in between
            feed._take_batch(batch)
            await feed._announce(3)
            got = [sequence for sequence, _ in (await asyncio.wait_for(first, 10)).items]
            while got[-1] < 4:
                got += [sequence for sequence, _ in (await asyncio.wait_for(pages.__anext__(), 10)).items]
            return got, (feed.database_reads - before[0], feed.announced_reads - before[1])

    got, reads = async_to_sync(scenario)()
    assert got == [3, 4]
    assert reads == (1, 1)  # the batch was taken, and not used: the follower read the database


def test_a_waiting_follower_with_a_push_is_handed_the_batch_and_reads_its_end_itself(
    workspace: Workspace, settings: Any
) -> None:
    """The feed sends an announced batch through the push of a follower that waits where it
    begins (the WebSocket's way), instead of waking it: the same items, once, no read of its own.
    A follower without a push, or not waiting, takes its pages as before; the page that ends the
    run is never pushed (its follower ends on it)."""
    settings.LEDGER_STREAM_POLL_SECONDS = 60  # only announcements make them read
    log.append(workspace=workspace, run_id="run_push", events=[started(), ev("StepScheduled", stepPath="a")])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_push")

    def append(*events: dict[str, Any]) -> Any:
        return database_sync_to_async(log.append)(workspace=workspace, run_id="run_push", events=list(events))

    async def scenario() -> tuple[list[list[int]], list[list[int]], list[Any], list[int], tuple[int, int, int]]:
        pushed: list[list[int]] = []

        async def until(condition: Any) -> None:
            async def poll() -> None:
                while not condition():
                    await asyncio.sleep(0.01)

            await asyncio.wait_for(poll(), 10)

        async def push(items: list[tuple[int, Any]]) -> None:
            pushed.append([sequence for sequence, _ in items])

        async with (
            follow.Follower(run, 2, push=push) as a,
            follow.Follower(run, 2) as b,
            follow.Follower(run, 2, push=push) as late,
        ):
            feed = a.feed
            assert feed is not None
            queues: list[asyncio.Queue[follow.Page]] = [asyncio.Queue(), asyncio.Queue()]
            tasks = [asyncio.ensure_future(_collect(f, q)) for f, q in zip((a, b), queues)]
            await until(lambda: a.news.waiter is not None and b.news.waiter is not None)  # start reads over
            before = (feed.database_reads, feed.announced_reads, feed.pushed)
            # `late` is not iterated: it waits for nothing, so it is woken, not pushed to.
            await append(ev("StepScheduled", stepPath="b"), ev("StepScheduled", stepPath="c"))
            from_b = [sequence for sequence, _ in (await asyncio.wait_for(queues[1].get(), 10)).items]
            await until(lambda: bool(pushed))
            reads = (feed.database_reads - before[0], feed.announced_reads - before[1], feed.pushed - before[2])
            await until(lambda: a.news.waiter is not None and b.news.waiter is not None)
            await append(ev("RunCompleted", output={}))
            ends = [await asyncio.wait_for(q.get(), 10) for q in queues]
            await asyncio.gather(*tasks)
            late_page = await asyncio.wait_for(late.__aiter__().__anext__(), 10)
            assert queues[0].empty()  # nothing but its end came to `a` as a page
            return (
                pushed,
                [from_b],
                [(p.items[0][0], p.status, p.final) for p in ends],
                [sequence for sequence, _ in late_page.items],
                reads,
            )

    pushed, from_b, ends, late, reads = async_to_sync(scenario)()
    assert pushed == [[3, 4]]  # to `a` only
    assert from_b == [[3, 4]]
    assert ends == [(5, "completed", True), (5, "completed", True)]
    assert late == [3, 4, 5]
    assert reads == (0, 1, 1)  # one announced batch, handed to `a` and taken by `b`; no database read
