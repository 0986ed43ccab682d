"""Open streams do not outlive their credentials, and one caller cannot open them without end
(console/streams.py, docs/security.md "Streams").

SSE against a real Daphne (keepalive 2 s, at most two streams per caller); the console's
WebSockets in process through the real ASGI stack (session auth, router, consumers). "Closed
within one keepalive" is checked without a clock: the server checks before every keepalive it
sends, so once the credentials are gone at most one more keepalive arrives (one checked before
they went, while the test was taking them away) before the stream ends. The keepalive is long
enough that taking them away (one UPDATE or DELETE) ends well within it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from asgiref.sync import async_to_sync, sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from console.streams import SLOTS
from ledger.log import append
from ledger.models import ApiKey, Workspace
from ledger.tenancy.services import create_key, remove_member, revoke_key
from tests.conftest import ev, started
from tests.live_support import TIMEOUT_S, communicator, session_id
from tests.servers import Daphne, start_daphne
from tests.test_stream import messages

pytestmark = pytest.mark.django_db(transaction=True)

KEEPALIVE_S = 2.0
MAX_STREAMS = 2
DEADLINE_S = 30.0  # every stream here ends long before; a loaded machine can stall for seconds
TIMEOUT = httpx.Timeout(30.0)


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    daphne = start_daphne(
        tmp_path_factory.mktemp("daphne"),
        "streams",
        {
            "LEDGER_STREAM_KEEPALIVE_SECONDS": str(KEEPALIVE_S),
            "LEDGER_STREAM_POLL_SECONDS": "0.2",
            "LEDGER_STREAM_MAX_PER_CALLER": str(MAX_STREAMS),
        },
    )
    yield daphne
    daphne.stop()


@pytest.fixture
def running(workspace: Workspace) -> str:
    append(workspace=workspace, run_id="run_live", events=[started(), ev("StepScheduled", stepPath="a")])
    return "run_live"


def _key(workspace: Workspace) -> tuple[ApiKey, dict[str, str]]:
    api_key, secret = create_key(workspace=workspace, scopes=["read"])
    return api_key, {"Authorization": f"Bearer {secret}"}


def _until_keepalive(stream: Iterator[Any]) -> list[Any]:
    """Messages up to and including the first keepalive (the catch-up is done by then)."""
    seen = []
    for message in stream:
        seen.append(message)
        if message.comment == "keepalive":
            return seen
    raise AssertionError(f"the stream ended before its first keepalive: {seen}")


def _rest_after_losing_credentials(stream: Iterator[Any]) -> list[Any]:
    """The run is still running: without the re-check, the stream would go on past its deadline."""
    rest = list(stream)  # ends when the server ends the response
    assert not any(m.event == "end" for m in rest), rest  # ended for the credentials, not the run
    assert sum(m.comment == "keepalive" for m in rest) <= 1, rest
    return rest


# --- SSE ------------------------------------------------------------------------------------


def test_a_revoked_keys_open_stream_ends_within_a_keepalive(server: Daphne, workspace: Workspace, running: str) -> None:
    api_key, headers = _key(workspace)
    with (
        httpx.Client(timeout=TIMEOUT) as http,
        http.stream("GET", f"{server.url}/api/v1/runs/{running}/stream", headers=headers) as response,
    ):
        stream = messages(response, DEADLINE_S)
        first = _until_keepalive(stream)
        assert [m.sequence for m in first if m.event == "ledger.event"] == [1, 2]
        revoke_key(api_key)
        _rest_after_losing_credentials(stream)
        again = http.get(f"{server.url}/api/v1/runs/{running}/stream", headers=headers)
        assert again.status_code == 401 and again.json()["error"]["code"] == "unauthenticated"


def test_a_logged_out_sessions_stream_ends(server: Daphne, workspace: Workspace, running: str, member: Any) -> None:
    session = session_id(member)
    with (
        httpx.Client(timeout=TIMEOUT, cookies={"sessionid": session}) as http,
        http.stream("GET", f"{server.url}/api/v1/runs/{running}/stream") as response,
    ):
        stream = messages(response, DEADLINE_S)
        _until_keepalive(stream)
        logout = Client()
        logout.cookies["sessionid"] = session
        assert logout.post("/accounts/logout/").status_code == 302
        _rest_after_losing_credentials(stream)


def test_a_removed_members_stream_ends(server: Daphne, workspace: Workspace, running: str, viewer: Any) -> None:
    with (
        httpx.Client(timeout=TIMEOUT, cookies={"sessionid": session_id(viewer)}) as http,
        http.stream("GET", f"{server.url}/api/v1/runs/{running}/stream") as response,
    ):
        stream = messages(response, DEADLINE_S)
        _until_keepalive(stream)
        remove_member(username="dave", tenant="acme")
        _rest_after_losing_credentials(stream)


def test_one_caller_holds_at_most_the_cap_and_gets_slots_back(
    server: Daphne, workspace: Workspace, running: str
) -> None:
    _, headers = _key(workspace)
    _, other = _key(workspace)
    url = f"{server.url}/api/v1/runs/{running}/stream"
    with httpx.Client(timeout=TIMEOUT) as http:
        with http.stream("GET", url, headers=headers) as one, http.stream("GET", url, headers=headers) as two:
            # Kept: a parser dropped would close its connection (httpcore closes on GeneratorExit).
            held = [messages(response, DEADLINE_S) for response in (one, two)]
            assert [next(stream).comment for stream in held] == ["connected", "connected"]
            refused = http.get(url, headers=headers)
            assert refused.status_code == 429
            assert refused.json() == {
                "error": {
                    "code": "too_many_streams",
                    "message": f"this caller already holds {MAX_STREAMS} open streams; close one first",
                    "details": {"limit": MAX_STREAMS},
                }
            }
            with http.stream("GET", url, headers=other) as another:  # another caller has slots of its own
                assert another.status_code == 200
        # Both clients went away: the server hears it and gives both slots back.
        deadline = time.monotonic() + DEADLINE_S
        opened: list[int] = []
        while time.monotonic() < deadline:
            with http.stream("GET", url, headers=headers) as first, http.stream("GET", url, headers=headers) as second:
                opened = [first.status_code, second.status_code]
            if opened == [200, 200]:
                break
            time.sleep(0.2)
        assert opened == [200, 200]


# --- WebSockets -------------------------------------------------------------------------------


async def _closed_with(comm: WebsocketCommunicator) -> tuple[int, list[dict[str, Any]]]:
    """Everything sent until the socket closes, and its close code."""
    sent = []
    while True:
        output = await comm.receive_output(timeout=DEADLINE_S)
        if output["type"] == "websocket.close":
            return output.get("code", 1000), sent
        sent.append(output)


def _logout(session: str) -> None:
    client = Client()
    client.cookies["sessionid"] = session
    assert client.post("/accounts/logout/").status_code == 302


@pytest.fixture
def short_keepalive(settings: Any) -> None:
    settings.LEDGER_STREAM_KEEPALIVE_SECONDS = 0.2


@pytest.mark.parametrize(
    "path", ["/ws/runs/run_live/", "/ws/workspaces/acme/support/runs/", "/ws/workspaces/acme/support/reexecutions/"]
)
def test_a_logged_out_users_socket_closes_4401(short_keepalive: None, running: str, member: Any, path: str) -> None:
    session = session_id(member)

    async def scenario() -> int:
        comm = communicator(path, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await sync_to_async(_logout)(session)
        code, _ = await _closed_with(comm)
        await comm.disconnect()
        return code

    assert async_to_sync(scenario)() == 4401


def test_a_removed_members_run_socket_closes_4401(
    short_keepalive: None, workspace: Workspace, running: str, viewer: Any
) -> None:
    session = session_id(viewer)

    async def scenario() -> tuple[int, list[dict[str, Any]]]:
        comm = communicator("/ws/runs/run_live/", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await sync_to_async(remove_member)(username="dave", tenant="acme")
        closed = await _closed_with(comm)
        await comm.disconnect()
        return closed

    code, sent = async_to_sync(scenario)()
    assert code == 4401
    assert len(sent) <= 2  # at most the catch-up of the run's two events


def test_a_socket_lives_on_while_its_credentials_hold(
    short_keepalive: None, workspace: Workspace, running: str, member: Any
) -> None:
    session = session_id(member)

    async def scenario() -> list[dict[str, Any]]:
        comm = communicator("/ws/runs/run_live/", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received = [await comm.receive_json_from(timeout=TIMEOUT_S) for _ in range(2)]
        assert await comm.receive_nothing(timeout=1.0)  # five re-checks pass, the socket stays open
        await sync_to_async(append)(workspace=workspace, run_id=running, events=[ev("StepScheduled", stepPath="b")])
        received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        await comm.disconnect()
        return received

    assert [m["sequence"] for m in async_to_sync(scenario)()] == [1, 2, 3]


def test_one_user_holds_at_most_the_cap_of_sockets(settings: Any, running: str, member: Any) -> None:
    settings.LEDGER_STREAM_MAX_PER_CALLER = 2
    session = session_id(member)

    async def scenario() -> None:
        first = communicator("/ws/runs/run_live/", session)
        second = communicator("/ws/workspaces/acme/support/runs/", session)
        assert (await first.connect(timeout=TIMEOUT_S))[0]
        assert (await second.connect(timeout=TIMEOUT_S))[0]
        for path in ("/ws/runs/run_live/", "/ws/workspaces/acme/support/runs/"):
            refused = communicator(path, session)
            assert not (await refused.connect(timeout=TIMEOUT_S))[0]
        assert SLOTS.open_for(f"user:{member.pk}") == 2
        await first.disconnect()
        assert SLOTS.open_for(f"user:{member.pk}") == 1
        third = communicator("/ws/runs/run_live/", session)
        assert (await third.connect(timeout=TIMEOUT_S))[0]
        await third.disconnect()
        await second.disconnect()
        assert SLOTS.open_for(f"user:{member.pk}") == 0

    async_to_sync(scenario)()


@pytest.mark.parametrize("path", ["/ws/nothing/", "/ws/runs/", "/ws/runs/run_live/extra/", "/anything"])
def test_a_socket_to_a_path_with_no_route_is_refused_not_an_error(running: str, member: Any, path: str) -> None:
    """An address no consumer serves gets the refusal any refused handshake gets, signed in or not."""

    async def scenario(session: str | None) -> bool:
        comm = communicator(path, session)
        connected, _ = await comm.connect(timeout=TIMEOUT_S)
        await comm.disconnect()
        return connected

    assert async_to_sync(scenario)(session_id(member)) is False
    assert async_to_sync(scenario)(None) is False
