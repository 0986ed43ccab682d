"""runledger.client when the server refuses part of what a harness records, against a live Daphne:
an event it refuses (400), a body over its 10 MiB, a run at its size limit, a batch over the key's
events per minute, and a start answered 429 or 503. What it refuses is reported (or, in asyncio,
raised), that event alone: the others of its batch, and the run's ending, are stored."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.core.management import call_command

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import (
    AsyncClient,
    Client,
    InvalidEvent,
    PayloadTooLarge,
    RetryPolicy,
    Undelivered,
    UnknownEventType,
)
from tests.client_support import Fault, FaultyProxy, logged
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy(backoff_s=0.05, max_backoff_s=0.5, deadline_s=180)
OVER_10_MIB = "x" * (11 * 1024 * 1024)


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


@pytest.fixture
def proxy(server: Daphne) -> Iterator[FaultyProxy]:
    p = FaultyProxy(int(server.url.rsplit(":", 1)[1]))
    yield p
    p.close()


def limits(*options: str) -> None:
    call_command("ledger", "limits", "acme/support", *options, stdout=io.StringIO())


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())


def test_an_event_the_server_refuses_is_reported_alone_and_the_rest_of_its_batch_is_stored(
    server: Daphne, key: str, workspace: Workspace
) -> None:
    undelivered: list[Undelivered] = []
    with Client(server.url, key, retry=FAST, on_undelivered=undelivered.append) as client:
        with client.start_run("wfver_refused", run_id="run_refused", batch_size=50, flush_interval=0) as run:
            run.emit("custom.tick", {"n": 0})
            run.emit("NoSuchType", {"n": "unknown"})
            run.emit("custom.tick", {"n": 1})
            run.emit("StepCompleted", {"attempt": 1})  # no stepPath
            run.emit("custom.tick", {"n": 2})
            run.emit("custom.big", {"text": OVER_10_MIB})  # alone over the 10 MiB of a body
            run.emit("custom.tick", {"n": 3})
            run.output = {"done": True}

    events = logged(workspace, "run_refused")
    assert [e["type"] for e in events] == ["RunStarted"] + ["custom.tick"] * 4 + ["RunCompleted"]
    assert [e["payload"]["n"] for e in events[1:-1]] == [0, 1, 2, 3]
    assert events[-1]["payload"] == {"output": {"done": True}}
    assert [(type(u.error), [e["type"] for e in u.events]) for u in undelivered] == [
        (UnknownEventType, ["NoSuchType"]),
        (InvalidEvent, ["StepCompleted"]),
        (PayloadTooLarge, ["custom.big"]),
    ]
    assert RunRow.objects.get(run_id="run_refused").status == "completed"
    verify("run_refused")


def test_a_run_at_its_size_limit_still_gets_its_ending(server: Daphne, key: str, workspace: Workspace) -> None:
    limits("--events-per-run", "5")
    undelivered: list[Undelivered] = []
    with Client(server.url, key, retry=FAST, on_undelivered=undelivered.append) as client:
        with client.start_run("wfver_full", run_id="run_full", batch_size=100, flush_interval=0) as run:
            for n in range(8):
                run.emit("custom.tick", {"n": n})

    events = logged(workspace, "run_full")
    assert [e["type"] for e in events] == ["RunStarted"] + ["custom.tick"] * 4 + ["RunCompleted"]
    assert [[e["payload"]["n"] for e in u.events] for u in undelivered] == [[4, 5, 6, 7]]
    assert undelivered[0].error.code == "run_too_large"  # type: ignore[attr-defined]
    verify("run_full")


def test_a_batch_over_the_keys_events_per_minute_is_sent_in_parts(
    server: Daphne, key: str, workspace: Workspace
) -> None:
    """No wait lets three events through a limit of two a minute: the batch goes in parts, the
    second in the next minute (this test may wait up to a minute)."""
    limits("--events-per-minute-per-key", "2")
    undelivered: list[Undelivered] = []
    starter = create_key(workspace=workspace, scopes=["ingest"])[1]  # the start counts against its own key
    with Client(server.url, starter, retry=FAST) as client:
        client.start_run("wfver_rate", run_id="run_rate")
    with Client(server.url, key, retry=RetryPolicy(deadline_s=150), on_undelivered=undelivered.append) as client:
        run = client.run("run_rate", batch_size=10, flush_interval=0)
        for n in range(3):
            run.emit("custom.tick", {"n": n})
        run.flush()

    assert undelivered == []
    assert [e["payload"].get("n") for e in logged(workspace, "run_rate")] == [None, 0, 1, 2]


@pytest.mark.parametrize("status", [429, 503])
def test_a_start_the_server_cannot_take_yet_waits_in_the_outbox(
    proxy: FaultyProxy, key: str, workspace: Workspace, status: int
) -> None:
    """Recording never raises into the agent: a start answered 429 or 503 with a Retry-After
    past `start_timeout` is sent later, like any event."""
    proxy.add(Fault("POST", status=status, retry_after="2"))
    undelivered: list[Undelivered] = []
    with Client(proxy.url, key, retry=FAST, on_undelivered=undelivered.append) as client:
        with client.start_run("wfver_busy", run_id="run_busy_start", start_timeout=1) as run:
            assert not run.restarted
            run.emit("custom.tick", {"n": 0})

    assert undelivered == []
    assert [e["type"] for e in logged(workspace, "run_busy_start")] == ["RunStarted", "custom.tick", "RunCompleted"]


def test_an_async_run_goes_on_after_an_event_the_server_refused(server: Daphne, key: str, workspace: Workspace) -> None:
    raised: list[BaseException] = []

    async def main() -> None:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            run = await client.start_run("wfver_async_refused", run_id="run_async_refused", batch_size=10)
            await run.emit("custom.tick", {"n": 0})
            await run.emit("NoSuchType", {"n": "unknown"})
            await run.emit("custom.tick", {"n": 1})
            try:
                await run.flush()
            except UnknownEventType as exc:
                raised.append(exc)
            await run.emit("custom.tick", {"n": 2})
            await run.complete({"done": True})  # the refused event no longer stands in the way

    asyncio.run(main())

    assert len(raised) == 1 and "NoSuchType" in str(raised[0])
    events = logged(workspace, "run_async_refused")
    assert [e["type"] for e in events] == ["RunStarted"] + ["custom.tick"] * 3 + ["RunCompleted"]
    assert [e["payload"]["n"] for e in events[1:-1]] == [0, 1, 2]


def test_a_spooled_batch_the_server_refuses_does_not_hold_back_the_others(
    proxy: FaultyProxy, key: str, workspace: Workspace, tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    with Client(proxy.url, key, retry=FAST, spool_dir=spool) as client:
        with client.start_run("wfver_spool", run_id="run_spool_refused", flush_interval=0) as run:
            run.emit("NoSuchType", {"n": "unknown"})  # refused: kept on disk, the oldest file
    proxy.stop()
    with Client(proxy.url, key, retry=RetryPolicy(deadline_s=0.5), spool_dir=spool) as client:
        with client.start_run("wfver_spool", run_id="run_spool_later", start_timeout=0.2) as run:
            run.emit("custom.tick", {"n": 0})
    assert len(list(spool.glob("*.json"))) == 2
    proxy.start()

    undelivered: list[Undelivered] = []
    with Client(proxy.url, key, retry=FAST, spool_dir=spool, on_undelivered=undelivered.append) as client:
        assert client.deliver_spooled() == 3
        assert client.deliver_spooled() == 0  # the refused event is never sent again
    assert [e["type"] for e in logged(workspace, "run_spool_later")] == ["RunStarted", "custom.tick", "RunCompleted"]
    assert [e["type"] for e in logged(workspace, "run_spool_refused")] == ["RunStarted", "RunCompleted"]
    assert [(type(u.error), [e["type"] for e in u.events]) for u in undelivered] == [(UnknownEventType, ["NoSuchType"])]
    (kept,) = spool.iterdir()
    assert undelivered[0].spooled == kept and kept.name.endswith(".json.refused")
    assert json.loads(kept.read_bytes())["events"] == undelivered[0].events


def test_an_async_runs_ending_is_sent_after_its_background_flush_was_refused(
    server: Daphne, key: str, workspace: Workspace
) -> None:
    """The time flush's refusal is raised at the writer's next call, after what waits was sent:
    the run's ending is not held back by it."""
    raised: list[BaseException] = []

    async def main() -> None:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            try:
                async with await client.start_run(
                    "wfver_async_timer", run_id="run_async_timer", flush_interval=0.05
                ) as run:
                    await run.emit("custom.tick", {"n": 0})
                    await run.emit("NoSuchType", {"n": "unknown"})
                    while run.last_sequence != 2:  # the time flush sent the tick, the server refused the other
                        await asyncio.sleep(0.05)
                    run.output = {"done": True}
            except UnknownEventType as exc:
                raised.append(exc)

    asyncio.run(main())

    assert len(raised) == 1
    events = logged(workspace, "run_async_timer")
    assert [e["type"] for e in events] == ["RunStarted", "custom.tick", "RunCompleted"]
    assert events[-1]["payload"] == {"output": {"done": True}}


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "localhost", "ftp://127.0.0.1:8000", "http://"])
def test_a_base_url_without_http_is_refused_when_the_client_is_made(url: str) -> None:
    """Not at the first request, where an httpx error (no RunledgerError) came out of start_run."""
    with pytest.raises(ValueError, match="base_url must be http://"):
        Client(url, "rl_key")
    with pytest.raises(ValueError, match="base_url must be http://"):
        AsyncClient(url, "rl_key")


def test_an_event_json_cannot_hold_is_reported_alone(server: Daphne, key: str, workspace: Workspace) -> None:
    undelivered: list[Undelivered] = []
    with Client(server.url, key, retry=FAST, on_undelivered=undelivered.append) as client:
        with client.start_run("wfver_json", run_id="run_not_json", flush_interval=0) as run:
            run.emit("custom.tick", {"n": 0})
            run.emit("custom.when", {"at": datetime(2026, 1, 1, tzinfo=UTC)})
            run.emit("custom.ratio", {"x": float("nan")})
            run.emit("custom.tick", {"n": 1})

    assert [e["type"] for e in logged(workspace, "run_not_json")] == ["RunStarted"] + ["custom.tick"] * 2 + [
        "RunCompleted"
    ]
    assert [(type(u.error), [e["type"] for e in u.events]) for u in undelivered] == [
        (TypeError, ["custom.when"]),
        (ValueError, ["custom.ratio"]),
    ]


def test_an_async_event_json_cannot_hold_leaves_the_buffer(server: Daphne, key: str, workspace: Workspace) -> None:
    raised: list[BaseException] = []

    async def main() -> None:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            run = await client.start_run("wfver_json", run_id="run_async_not_json", batch_size=10)
            await run.emit("custom.tick", {"n": 0})
            await run.emit("custom.when", {"at": datetime(2026, 1, 1, tzinfo=UTC)})
            try:
                await run.flush()
            except TypeError as exc:
                raised.append(exc)
            await run.complete()

    asyncio.run(main())

    assert len(raised) == 1 and "custom.when" in str(raised[0])
    assert [e["type"] for e in logged(workspace, "run_async_not_json")] == ["RunStarted", "custom.tick", "RunCompleted"]
