"""runledger.client's asyncio flavour (AsyncClient) against a live Daphne: the same features as the
blocking client (test_client.py), and the same resilience: retries, 4xx final, a server SIGKILLed
and restarted mid-batch. The database is checked outside the event loop."""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import (
    AsyncClient,
    IdempotencyConflict,
    NotFound,
    RetryPolicy,
    SequenceConflict,
    ToolCallFailed,
    UnknownEventType,
    current_async_session,
)
from tests.client_support import Fault, FaultyProxy, logged
from tests.conftest import ev, started
from tests.servers import Daphne, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

# Tries until the deadline, not a count: a restarted Daphne can take a minute on a loaded machine.
FAST = RetryPolicy(backoff_s=0.05, max_backoff_s=0.5, deadline_s=180)


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    daphne = start_daphne(tmp_path_factory.mktemp("daphne"), "client-async", {"LEDGER_STREAM_KEEPALIVE_SECONDS": "1"})
    yield daphne
    daphne.stop()


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


@pytest.fixture
def proxy(server: Daphne) -> Iterator[FaultyProxy]:
    p = FaultyProxy(int(server.url.rsplit(":", 1)[1]))
    yield p
    p.close()


def test_async_append_run_batches_and_ending(server: Daphne, key: str, workspace: Workspace) -> None:
    async def main() -> tuple[Any, Any, Any]:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            low = await client.append("run_alow", [{**started(), "idempotencyKey": "s"}], expected_sequence=0)
            again = await client.append("run_alow", [{**started(), "idempotencyKey": "s"}])
            with pytest.raises(SequenceConflict):
                await client.append("run_alow", [ev("StepScheduled", stepPath="x")], expected_sequence=0)
            with pytest.raises(UnknownEventType):
                await client.append("run_alow", [ev("NoSuchType")])
            with pytest.raises(NotFound):
                await client.get_run("run_never")
            async with await client.start_run(
                "wfver_async", run_id="run_async", batch_size=3, flush_interval=0.2
            ) as run:
                for n in range(4):
                    await run.emit("StepScheduled", {"stepPath": f"s{n}"})
                while run.last_sequence != 5:  # the fourth goes with the time flush
                    await asyncio.sleep(0.05)
                run.output = {"ok": True}
            return low, again, await client.get_run("run_async")

    low, again, run = asyncio.run(main())
    assert low[0]["replayed"] is False and again[0]["replayed"] is True and low.last_sequence == 1
    assert run["status"] == "completed" and run["output"] == {"ok": True}
    keys = [e.idempotency_key for e in RunRow.objects.get(run_id="run_async").events.order_by("sequence")]
    assert keys == [f"main:{n}" for n in range(6)]


def test_async_tool_calls_and_sessions(server: Daphne, key: str, workspace: Workspace) -> None:
    executed: list[str] = []

    async def main() -> tuple[Any, Any]:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            run = await client.start_run("wfver_async", run_id="run_async_agent")

            async def lookup() -> dict[str, int]:
                executed.append("lookup")
                return {"hits": 1}

            @run.session(role="agent", step_path="answer")
            async def agent(question: str) -> str:
                session = current_async_session()
                assert session is not None
                async with session.model_call(
                    {"messages": [question]}, provider="openai", model_id="gpt-4o-mini"
                ) as call:
                    call.respond("let me look", usage={"inputTokens": 10, "outputTokens": 2})

                first = await run.call_tool("search", {"q": question}, lookup, effect="read", idempotency_key="q1")
                second = await run.call_tool("search", {"q": question}, lookup, effect="read", idempotency_key="q1")
                assert first == second == {"hits": 1}
                return "one hit"

            assert await agent("where?") == "one hit"
            with pytest.raises(IdempotencyConflict):
                await run.call_tool("search", {"q": "other"}, lookup, effect="read", idempotency_key="q1")

            async def broken() -> None:
                raise ConnectionError("down")

            with pytest.raises(ConnectionError):
                await run.call_tool("charge", {"cents": 1}, broken, idempotency_key="c1")
            with pytest.raises(ToolCallFailed):
                await run.call_tool("charge", {"cents": 1}, broken, idempotency_key="c1")
            await run.complete()
            follow = client.follow("run_async_agent", after=1)
            followed = [e async for e in follow]
            return followed, follow.status

    followed, status = asyncio.run(main())
    events = logged(workspace, "run_async_agent")
    assert [e["type"] for e in events] == [
        "RunStarted",
        "harness.session.started",
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "harness.session.completed",
        "harness.tool_call.started",
        "harness.tool_call.failed",
        "RunCompleted",
    ]
    assert executed == ["lookup"] and status == "completed"
    assert [e["sequence"] for e in followed] == list(range(2, 11))
    call_command("ledger", "verify", "run_async_agent", "--workspace", "acme/support", stdout=io.StringIO())


def test_async_follow_reconnects_with_last_event_id(
    proxy: FaultyProxy, server: Daphne, key: str, workspace: Workspace
) -> None:
    async def main() -> tuple[list[int], Any]:
        async with (
            AsyncClient(server.url, key, retry=FAST) as direct,
            AsyncClient(proxy.url, key, retry=FAST) as through_proxy,
        ):
            run = await direct.start_run("wfver_async", run_id="run_async_cut", batch_size=1)
            await run.emit("StepScheduled", {"stepPath": "a"})
            follow = through_proxy.follow("run_async_cut")
            seen = []
            async for envelope in follow:
                seen.append(envelope["sequence"])
                if envelope["sequence"] == 2:
                    proxy.cut()
                    await run.emit("StepScheduled", {"stepPath": "b"})
                    await run.complete()
            return seen, follow

    seen, follow = asyncio.run(main())
    streams = proxy.requests("GET", "/stream")
    assert seen == [1, 2, 3, 4] and follow.status == "completed" and follow.reconnects >= 1
    assert streams[1].headers["last-event-id"] == "2"


def test_async_retries_5xx_never_4xx(proxy: FaultyProxy, key: str, workspace: Workspace) -> None:
    proxy.add(Fault("POST", status=502), Fault("POST", status=429, retry_after="0"))

    async def main() -> None:
        async with AsyncClient(proxy.url, key, retry=FAST) as client:
            await client.start_run("wfver_async", run_id="run_async_busy")
            with pytest.raises(UnknownEventType):
                await client.append("run_async_busy", [{**ev("NoSuchType"), "idempotencyKey": "x"}])

    asyncio.run(main())
    assert len(proxy.requests("POST")) == 4  # three tries of the start, one of the refused batch
    assert len(logged(workspace, "run_async_busy")) == 1


def test_async_server_killed_and_restarted_mid_batch(
    django_db_setup: None, workspace: Workspace, key: str, tmp_path: Path
) -> None:
    servers = [start_daphne(tmp_path, "async-victim", {})]
    port = int(servers[0].url.rsplit(":", 1)[1])
    proxy = FaultyProxy(port)
    restarting: list[threading.Thread] = []

    def kill_and_restart() -> None:
        servers[-1].process.kill()
        servers[-1].process.wait()
        restart = threading.Thread(target=lambda: servers.append(start_daphne(tmp_path, "async-victim", {}, port=port)))
        restart.start()
        restarting.append(restart)

    async def main() -> list[bool]:
        async with AsyncClient(proxy.url, key, retry=FAST) as client:
            run = await client.start_run("wfver_kill", run_id="run_async_killed", batch_size=10, flush_interval=0)
            for n in range(15):
                await run.emit("StepScheduled", {"stepPath": f"s{n}"})
            proxy.add(Fault("POST", drop=True, action=kill_and_restart))
            resent = await run.append([ev("StepScheduled", stepPath=f"s{n}") for n in range(15, 20)])
            proxy.add(Fault("POST", kill=True, action=kill_and_restart))
            for n in range(20, 40):
                await run.emit("StepScheduled", {"stepPath": f"s{n}"})
            await run.complete()
            return [e["replayed"] for e in resent]

    try:
        replayed = asyncio.run(main())
    finally:
        proxy.close()
        for thread in restarting:
            thread.join(timeout=120)
        for daphne in servers:
            if daphne.process.poll() is None:
                daphne.stop()
    assert replayed == [True] * 10 and len(restarting) == 2
    events = logged(workspace, "run_async_killed")
    assert [e["sequence"] for e in events] == list(range(1, 43))
    assert [e["payload"].get("stepPath") for e in events[1:-1]] == [f"s{n}" for n in range(40)]
    call_command("ledger", "verify", "run_async_killed", "--workspace", "acme/support", stdout=io.StringIO())


def test_async_a_failed_model_call_says_whether_its_request_left(
    server: Daphne, key: str, workspace: Workspace
) -> None:
    """As the blocking client's: from what the block raised (a timeout: it may have left, the call
    is of unknown cost), or as the block says (`call.request_left`)."""

    async def main() -> None:
        async with AsyncClient(server.url, key, retry=FAST) as client:
            run = await client.start_run("wfver_async", run_id="run_async_request_left")
            async with run.session(role="agent") as session:
                with pytest.raises(TimeoutError):
                    async with session.model_call({"n": 1}, provider="openai", model_id="gpt-4o"):
                        raise TimeoutError("no answer in 30 s")
                with pytest.raises(RuntimeError):
                    async with session.model_call({"n": 2}, provider="openai", model_id="gpt-4o") as call:
                        call.request_left = False
                        raise RuntimeError("refused by the harness before sending")
            await run.complete()

    asyncio.run(main())
    failures = [
        (e["payload"]["error"]["name"], e["payload"]["requestLeft"])
        for e in logged(workspace, "run_async_request_left")
        if e["type"] == "harness.model.failed"
    ]
    assert failures == [("TimeoutError", True), ("RuntimeError", False)]
    row = RunRow.objects.get(run_id="run_async_request_left")
    assert (row.priced_calls, row.unpriced_calls) == (0, 1)
