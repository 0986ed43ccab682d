"""runledger.client against a live Daphne (real HTTP): the low-level append, a run's batching and
keys, expectedSequence and fencing tokens, SSE follow with Last-Event-ID reconnection, the tool
gateway helpers and the harness session recorder. Resilience (retries, a killed server) is in
test_client_retry.py, the asyncio flavour in test_client_async.py."""

from __future__ import annotations

import io
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.core.management import call_command

from ledger.log import append
from ledger.log.leases import acquire_run_lease
from ledger.models import Run as RunRow
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from runledger.client import (
    Client,
    Fenced,
    IdempotencyConflict,
    NotFound,
    RetryPolicy,
    RunFinished,
    SequenceConflict,
    ToolCallFailed,
    UnknownEventType,
    current_session,
)
from tests.client_support import FaultyProxy, logged
from tests.conftest import ev, started
from tests.servers import Daphne, start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

FAST = RetryPolicy(attempts=40, backoff_s=0.05, max_backoff_s=1.0, deadline_s=120)


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    daphne = start_daphne(tmp_path_factory.mktemp("daphne"), "client", {"LEDGER_STREAM_KEEPALIVE_SECONDS": "1"})
    yield daphne
    daphne.stop()  # before the test database is dropped: it holds connections to it


@pytest.fixture
def key(workspace: Workspace) -> str:
    return create_key(workspace=workspace, scopes=["ingest", "read"])[1]


@pytest.fixture
def client(server: Daphne, key: str) -> Iterator[Client]:
    with Client(server.url, key, retry=FAST) as c:
        yield c


def verify(run_id: str) -> None:
    call_command("ledger", "verify", run_id, "--workspace", "acme/support", stdout=io.StringIO())  # exits 1 on failure


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


# --- the low-level append ---------------------------------------------------------------------


def test_append_returns_the_envelopes_and_a_keyed_retry_is_a_replay(client: Client, workspace: Workspace) -> None:
    batch = [{**started(), "idempotencyKey": "s"}, {**ev("StepScheduled", stepPath="a"), "idempotencyKey": "a"}]
    first = client.append("run_low", batch)
    again = client.append("run_low", batch)

    assert [e["sequence"] for e in first] == [1, 2] and first.last_sequence == 2
    assert [e["replayed"] for e in first] == [False, False]
    assert [e["replayed"] for e in again] == [True, True]
    assert [e["eventId"] for e in again] == [e["eventId"] for e in first]
    assert [e["eventId"] for e in logged(workspace, "run_low")] == [e["eventId"] for e in first]
    client.append("run_low", [ev("StepScheduled", stepPath=f"p{n}") for n in range(3)])
    assert [e["sequence"] for e in client.events("run_low", after=1, page_size=2)] == [2, 3, 4, 5]


def test_expected_sequence_refuses_a_stale_writer_with_the_actual_end(client: Client, workspace: Workspace) -> None:
    client.append("run_seq", [started()], expected_sequence=0)
    client.append("run_seq", [ev("StepScheduled", stepPath="a")], expected_sequence=1)
    with pytest.raises(SequenceConflict) as refused:
        client.append("run_seq", [ev("StepScheduled", stepPath="b")], expected_sequence=1)
    assert refused.value.status == 409 and refused.value.code == "sequence_conflict"
    assert refused.value.details == {"expected": 1, "actual": 2} and refused.value.actual == 2
    assert len(logged(workspace, "run_seq")) == 2


def test_errors_are_typed_by_their_code(client: Client, workspace: Workspace) -> None:
    client.append("run_err", [{**started(), "idempotencyKey": "s"}])
    with pytest.raises(UnknownEventType) as unknown:
        client.append("run_err", [ev("NoSuchType")])
    assert unknown.value.status == 400 and unknown.value.details["index"] == 0
    with pytest.raises(IdempotencyConflict):
        client.append("run_err", [{**started(workflow="wfver_other"), "idempotencyKey": "s"}])
    with pytest.raises(NotFound) as missing:
        client.get_run("run_never")
    assert missing.value.code == "not_found"
    assert len(logged(workspace, "run_err")) == 1


def test_another_tenants_run_is_not_found(client: Client, server: Daphne, other_workspace: Workspace) -> None:
    append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    with pytest.raises(NotFound):
        client.get_run("run_theirs")
    with pytest.raises(NotFound):
        list(client.follow("run_theirs"))


# --- a run: keys, batching, ending ----------------------------------------------------------


def test_a_run_batches_by_size_and_keys_every_event(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_batch", run_id="run_batch", input={"n": 1}, batch_size=3, flush_interval=600)
    for n in range(4):
        run.emit("StepScheduled", {"stepPath": f"s{n}"})
    # three go as one batch, in the background, once the third is emitted; the fourth waits for its batch
    wait_for(lambda: len(logged(workspace, "run_batch")) == 4, "the full batch")
    time.sleep(0.3)
    assert [e["type"] for e in logged(workspace, "run_batch")] == ["RunStarted"] + ["StepScheduled"] * 3
    sent = run.flush()
    assert [e["payload"]["stepPath"] for e in sent] == ["s3"]
    keys = [e.idempotency_key for e in RunRow.objects.get(run_id="run_batch").events.order_by("sequence")]
    assert keys == ["main:0", "main:1", "main:2", "main:3", "main:4"]


def test_a_run_flushes_on_time(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_batch", run_id="run_timed", batch_size=100, flush_interval=0.2)
    run.emit("StepScheduled", {"stepPath": "late"})
    wait_for(lambda: len(logged(workspace, "run_timed")) == 2, "the time flush")
    assert logged(workspace, "run_timed")[1]["payload"] == {"stepPath": "late"}


def test_a_restarted_writer_replays_instead_of_writing_twice(client: Client, workspace: Workspace) -> None:
    def harness() -> None:
        run = client.start_run("wfver_det", run_id="run_det", batch_size=2, flush_interval=0)
        for n in range(5):
            run.emit("StepScheduled", {"stepPath": f"s{n}"})
        run.flush()

    harness()
    harness()  # a harness restarted from the top: same writer, same events, same keys
    assert len(logged(workspace, "run_det")) == 6
    verify("run_det")


def test_the_run_context_ends_the_run(client: Client, workspace: Workspace) -> None:
    with client.start_run("wfver_ctx", run_id="run_ok") as run:
        run.emit("StepScheduled", {"stepPath": "a"})
        run.output = {"answer": 42}
    with pytest.raises(ZeroDivisionError), client.start_run("wfver_ctx", run_id="run_boom") as run:
        run.emit("StepScheduled", {"stepPath": "a"})
        1 / 0  # noqa: B018

    assert client.get_run("run_ok")["status"] == "completed" and client.get_run("run_ok")["output"] == {"answer": 42}
    failed = client.get_run("run_boom")
    assert failed["status"] == "failed" and failed["error"]["name"] == "ZeroDivisionError"
    assert [e["type"] for e in logged(workspace, "run_boom")] == ["RunStarted", "StepScheduled", "RunFailed"]
    with pytest.raises(RunFinished):
        client.run("run_ok", writer="late").append([ev("StepScheduled", stepPath="after")])


def test_check_sequence_refuses_when_another_writer_got_in_between(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_seq", run_id="run_two_writers", check_sequence=True)
    run.append([ev("StepScheduled", stepPath="mine")])
    append(workspace=workspace, run_id="run_two_writers", events=[ev("StepScheduled", stepPath="theirs")])
    with pytest.raises(SequenceConflict) as refused:
        run.append([ev("StepScheduled", stepPath="mine again")])
    assert refused.value.actual == 3
    other = client.run("run_two_writers", writer="second", check_sequence=True)
    assert other.last_sequence == 3
    assert other.append([ev("StepScheduled", stepPath="second")]).last_sequence == 4


def test_a_fencing_token_is_sent_with_every_write(client: Client, workspace: Workspace) -> None:
    client.start_run("wfver_fence", run_id="run_fenced")
    lease = acquire_run_lease(workspace=workspace, run_id="run_fenced", owner="executor-1")
    with pytest.raises(Fenced):
        client.run("run_fenced", writer="nofence").append([ev("StepScheduled", stepPath="x")])
    holder = client.run("run_fenced", fencing_token=lease.fencing_token)
    holder.append([ev("StepScheduled", stepPath="fenced")])
    with holder.tool_call("lookup", {"q": 1}, effect="read") as call:
        call.result = {"hit": True}
    stale = client.run("run_fenced", writer="stale", fencing_token=lease.fencing_token - 1)
    with pytest.raises(Fenced):
        stale.append([ev("StepScheduled", stepPath="stale")])
    assert [e["type"] for e in logged(workspace, "run_fenced")] == [
        "RunStarted",
        "StepScheduled",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
    ]


# --- follow -----------------------------------------------------------------------------------


def test_follow_reads_every_event_after_n_then_live_ones_until_the_end(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_follow", run_id="run_follow", batch_size=1)
    for n in range(4):
        run.emit("StepScheduled", {"stepPath": f"s{n}"})
    follow = client.follow("run_follow", after=2)
    seen = []
    for envelope in follow:
        seen.append(envelope["sequence"])
        if envelope["sequence"] == 5:
            run.complete({"done": True})  # live, while the stream is open
    assert seen == [3, 4, 5, 6] and follow.status == "completed"
    assert seen == [e["sequence"] for e in logged(workspace, "run_follow")][2:]


def test_follow_reconnects_with_last_event_id_when_the_connection_drops(
    server: Daphne, key: str, client: Client, workspace: Workspace
) -> None:
    run = client.start_run("wfver_follow", run_id="run_cut", batch_size=1)
    for n in range(3):
        run.emit("StepScheduled", {"stepPath": f"s{n}"})
    proxy = FaultyProxy(int(server.url.rsplit(":", 1)[1]))
    try:
        with Client(proxy.url, key, retry=FAST) as through_proxy:
            follow = through_proxy.follow("run_cut")
            seen = []
            for envelope in follow:
                seen.append(envelope["sequence"])
                if envelope["sequence"] == 4:
                    proxy.cut()  # the network drops the stream after event 4, the last one so far
                    for n in range(3):
                        run.emit("StepScheduled", {"stepPath": f"while away {n}"})
                    run.complete()
        streams = proxy.requests("GET", "/stream")
    finally:
        proxy.close()
    assert seen == list(range(1, 9)) and follow.status == "completed" and follow.reconnects >= 1
    assert "last-event-id" not in streams[0].headers
    assert streams[1].headers["last-event-id"] == "4"


# --- the tool gateway --------------------------------------------------------------------------


def test_tool_call_claims_marks_outbound_and_completes(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_tools", run_id="run_tools", batch_size=50, flush_interval=600)
    run.emit("StepScheduled", {"stepPath": "refund"})
    with run.tool_call("refunds.create", {"orderId": "A-1"}, effect="write", idempotency_key="refund-A-1") as call:
        assert not call.replayed and call.lease_token
        call.result = {"refundId": "r1"}

    rows = client._json("GET", "/api/v1/runs/run_tools/tool-calls")["toolCalls"]
    assert [(r["callId"], r["status"], r["outboundAt"] is not None) for r in rows] == [
        (call.call_id, "succeeded", True)
    ]
    assert call.status == "succeeded" and call.result == {"refundId": "r1"}
    # the buffered step was logged before the call's own events
    assert [e["type"] for e in logged(workspace, "run_tools")] == [
        "RunStarted",
        "StepScheduled",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
    ]


def test_a_finished_call_is_replayed_from_the_record_without_running(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_tools", run_id="run_replay")
    executed: list[str] = []

    def refund() -> dict[str, str]:
        executed.append("refund")
        return {"refundId": "r1"}

    first = run.call_tool("refunds.create", {"orderId": "A-1"}, refund, idempotency_key="refund-A-1")
    events = len(logged(workspace, "run_replay"))
    with run.tool_call("refunds.create", {"orderId": "A-1"}, idempotency_key="refund-A-1") as call:
        assert call.replayed
    second = run.call_tool("refunds.create", {"orderId": "A-1"}, refund, idempotency_key="refund-A-1")

    assert first == second == call.result == {"refundId": "r1"} and executed == ["refund"]
    assert len(logged(workspace, "run_replay")) == events
    with pytest.raises(IdempotencyConflict):
        run.call_tool("refunds.create", {"orderId": "B-2"}, refund, idempotency_key="refund-A-1")


def test_a_failing_tool_is_recorded_failed_and_its_replay_raises(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_tools", run_id="run_tool_fails")

    def broken() -> None:
        raise ConnectionError("payment service down")

    with pytest.raises(ConnectionError):
        run.call_tool("payments.charge", {"cents": 100}, broken, idempotency_key="charge-1")
    with pytest.raises(ToolCallFailed) as replayed:
        run.call_tool("payments.charge", {"cents": 100}, broken, idempotency_key="charge-1")
    assert replayed.value.error == {"name": "ConnectionError", "message": "payment service down"}
    failed = logged(workspace, "run_tool_fails")[-1]
    assert failed["type"] == "harness.tool_call.failed" and failed["payload"]["error"]["name"] == "ConnectionError"


# --- harness sessions ----------------------------------------------------------------------------


def test_a_session_records_model_and_tool_calls_around_user_code(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_agent", run_id="run_session")

    @run.session(role="agent", step_path="answer")
    def agent(question: str) -> str:
        session = current_session()
        assert session is not None
        with session.model_call(
            {"messages": [{"role": "user", "content": question}]}, provider="openai", model_id="gpt-4o-mini"
        ) as call:
            call.respond(
                tool_calls=[{"name": "search", "args": {"q": question}}], usage={"inputTokens": 100, "outputTokens": 10}
            )
        with session.tool_call("search", {"q": question}, effect="read") as tool:
            tool.result = {"hits": 3}
        with session.model_call({"messages": ["..."]}, provider="openai", model_id="gpt-4o-mini") as call:
            call.respond("three hits", usage={"inputTokens": 150, "outputTokens": 5})
        return "three hits"

    assert agent("how many?") == "three hits"
    run.complete()

    events = logged(workspace, "run_session")
    assert [e["type"] for e in events] == [
        "RunStarted",
        "harness.session.started",
        "harness.model.called",
        "harness.model.responded",
        "harness.tool_call.started",
        "harness.tool_call.succeeded",
        "harness.model.called",
        "harness.model.responded",
        "harness.session.completed",
        "RunCompleted",
    ]
    assert events[1]["payload"]["manifestHash"].startswith("sha256:") and events[1]["payload"]["role"] == "agent"
    assert [e["payload"]["turn"] for e in events if e["type"].startswith("harness.model.")] == [1, 1, 2, 2]
    assert events[4]["payload"]["turn"] == 1 and events[4]["payload"]["caller"] == "agent"
    assert events[8]["payload"]["output"] == "three hits"
    usage = client.get_run("run_session")["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["pricedCalls"]) == (250, 15, 2)
    verify("run_session")


def test_a_failing_model_call_and_session_are_recorded_failed(client: Client, workspace: Workspace) -> None:
    run = client.start_run("wfver_agent", run_id="run_session_fails")
    with pytest.raises(TimeoutError), run.session(role="agent") as session:
        with session.model_call({"messages": []}, provider="openai", model_id="gpt-4o") as call:
            raise TimeoutError("the provider did not answer")
    assert call.response is None
    run.flush()
    assert [e["type"] for e in logged(workspace, "run_session_fails")] == [
        "RunStarted",
        "harness.session.started",
        "harness.model.called",
        "harness.model.failed",
        "harness.session.failed",
    ]
    assert logged(workspace, "run_session_fails")[-1]["payload"]["error"]["name"] == "TimeoutError"
    # A timeout comes after the request left: the provider may bill it, a call of unknown cost.
    assert logged(workspace, "run_session_fails")[-2]["payload"]["requestLeft"] is True
    usage = client.get_run("run_session_fails")["usage"]
    assert (usage["pricedCalls"], usage["unpricedCalls"], usage["inputTokens"]) == (0, 1, 0)
    verify("run_session_fails")


def test_a_failed_model_call_says_whether_its_request_left(client: Client, workspace: Workspace) -> None:
    """`requestLeft` of harness.model.failed: as the block says (`call.request_left`), else from
    what it raised: httpx failing to connect sent nothing, one losing the connection may have; an
    exception that says nothing counts as one that may have left. Only those count as unpriced."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        nowhere = f"http://127.0.0.1:{closed.getsockname()[1]}/v1/chat/completions"
        with client.start_run("wfver_agent", run_id="run_request_left") as run, run.session(role="agent") as session:
            with pytest.raises(httpx.ConnectError), session.model_call({"n": 1}, provider="openai", model_id="gpt-4o"):
                httpx.post(nowhere, json={"model": "gpt-4o"})
            with (
                pytest.raises(RuntimeError),
                session.model_call({"n": 2}, provider="openai", model_id="gpt-4o") as call,
            ):
                call.request_left = False  # a guard of the harness's own refused it
                raise RuntimeError("over the harness's budget")
            with pytest.raises(httpx.RemoteProtocolError):
                with session.model_call({"n": 3}, provider="openai", model_id="gpt-4o"):
                    try:
                        raise ConnectionResetError("the provider hung up")
                    except ConnectionResetError as exc:
                        raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from exc
            with pytest.raises(ValueError), session.model_call({"n": 4}, provider="openai", model_id="gpt-4o"):
                raise ValueError("the answer could not be read")
            with pytest.raises(TimeoutError), session.model_call({"n": 5}, provider="openai", model_id="gpt-4o"):
                try:
                    raise ConnectionRefusedError("the fallback endpoint is down")
                except ConnectionRefusedError:
                    raise TimeoutError("then the main endpoint timed out")  # noqa: B904  (raised while handling it)
    failures = [
        (e["payload"]["error"]["name"], e["payload"]["requestLeft"])
        for e in logged(workspace, "run_request_left")
        if e["type"] == "harness.model.failed"
    ]
    assert failures == [
        ("ConnectError", False),
        ("RuntimeError", False),
        ("RemoteProtocolError", True),
        ("ValueError", True),
        ("TimeoutError", True),  # the refused connection before it is not this call's failure
    ]
    row = RunRow.objects.get(run_id="run_request_left")
    assert (row.priced_calls, row.unpriced_calls, row.cost_usd) == (0, 3, None)
    verify("run_request_left")
