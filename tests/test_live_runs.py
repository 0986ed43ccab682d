"""The runs list's live feed, `ws/workspaces/<tenant>/<workspace>/runs/` (console/live/runs.py), and
the workspace announcements behind it (ledger/log/announce.py).

In process through the real ASGI stack (origin check, session auth, router) with
WebsocketCommunicator; and once against a live Daphne with a browser-like client, the run appended
through that server's HTTP API so its announcement crosses its own channel layer on both passes.
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import websocket
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from django.test import Client

from console.live import runs as runs_feed
from ledger.log import append
from ledger.log.announce import workspace_group_for
from ledger.models import Workspace
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import ev, started
from tests.live_support import TIMEOUT_S
from tests.live_support import communicator as _communicator
from tests.live_support import session_id as _session_id
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

PATH = "/ws/workspaces/acme/support/runs/"


def _append(workspace: Workspace, run_id: str, *events: dict[str, Any]) -> Any:
    return database_sync_to_async(append)(workspace=workspace, run_id=run_id, events=list(events))


def test_a_new_run_is_announced_and_the_rows_fragment_shows_it(member: Any, workspace: Workspace) -> None:
    """The socket says which run moved; the page fetches its rows again (static/js/live.js), the
    fragment a reload renders."""
    session = _session_id(member)

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator(PATH, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await _append(workspace, "run_new", started("wf_live", label="fresh"))
        received = [await comm.receive_json_from(timeout=TIMEOUT_S)]
        await comm.disconnect()
        return received

    [message] = async_to_sync(scenario)()
    assert message == {"type": "run", "runId": "run_new"}
    client = Client()
    client.force_login(member)
    rows = client.get("/w/acme/support/", headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in rows
    assert re.search(r'<tr class="run" data-run-id="run_new".*?status-running', rows, re.S)


def test_a_finished_run_is_pushed_again_and_ordinary_appends_are_not(member: Any, workspace: Workspace) -> None:
    session = _session_id(member)
    append(workspace=workspace, run_id="run_busy", events=[started()])

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator(PATH, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await _append(workspace, "run_busy", ev("StepScheduled", stepPath="a"))
        await _append(workspace, "run_busy", ev("custom.note", text="hi"))
        assert await comm.receive_nothing(timeout=0.3)
        await _append(workspace, "run_busy", ev("StepScheduled", stepPath="b"), ev("RunFailed", error={"m": "x"}))
        received = [await comm.receive_json_from(timeout=TIMEOUT_S)]
        await _append(workspace, "run_quick", started(), ev("RunCompleted"))  # one batch: one push
        received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return received

    failed, quick = async_to_sync(scenario)()
    assert failed == {"type": "run", "runId": "run_busy"} and quick == {"type": "run", "runId": "run_quick"}


def test_a_running_runs_cost_and_attention_are_pushed_as_they_move(member: Any, workspace: Workspace) -> None:
    """The row's tokens and cost move with each answered model call, its attention with a retry
    scheduled and started: each is pushed, so the list follows a running run, not only its ends."""
    session = _session_id(member)
    append(workspace=workspace, run_id="run_spending", events=[started(), ev("StepScheduled", stepPath="s")])
    responded = ev(
        "harness.model.responded",
        turn=1,
        callId="c1",
        model={"provider": "openai", "modelId": "gpt-4o"},
        response={"text": "ok", "usage": {"inputTokens": 1200, "outputTokens": 300}},
    )

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator(PATH, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received = []
        for moved in (
            responded,
            ev("StepFailed", stepPath="s", attempt=1, error={"message": "x", "retryAt": "2030-01-01T00:00:00Z"}),
            ev("StepAttemptStarted", stepPath="s", attempt=2),
        ):
            await _append(workspace, "run_spending", moved)
            received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        await _append(workspace, "run_spending", ev("custom.note", text="nothing listed moves"))
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return received

    assert async_to_sync(scenario)() == [{"type": "run", "runId": "run_spending"}] * 3
    client = Client()
    client.force_login(member)
    rows = client.get("/w/acme/support/", headers={"HX-Request": "true"}).content.decode()
    row = re.search(r'<tr class="run" data-run-id="run_spending".*?</tr>', rows, re.S)
    assert row is not None and "1,500" in row[0]  # the tokens the push told the page to fetch


def test_other_workspaces_runs_are_not_pushed(member: Any, workspace: Workspace) -> None:
    research = bootstrap(tenant="acme", workspace="research")
    session = _session_id(member)

    async def scenario() -> None:
        comm = _communicator(PATH, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await _append(research, "run_elsewhere", started())
        assert await comm.receive_nothing(timeout=0.3)
        # A made-up announcement for a run this workspace does not hold sends nothing either.
        await get_channel_layer().group_send(
            workspace_group_for(workspace.pk), {"type": "ledger.run_changed", "runId": "run_elsewhere"}
        )
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    async_to_sync(scenario)()


def test_a_run_is_looked_up_once_a_socket_however_often_it_moves(
    member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy run is announced at every model call, to every open list: a socket checks that the
    run is its workspace's the first time only (a run never moves to another). An id it does not
    hold is checked each time, so a run made under it later is pushed."""
    looked_up: list[str] = []
    holds = runs_feed._holds
    monkeypatch.setattr(runs_feed, "_holds", lambda ws, run_id: looked_up.append(run_id) or holds(ws, run_id))
    session = _session_id(member)
    append(workspace=workspace, run_id="run_busy", events=[started()])

    def responded(turn: int) -> dict[str, Any]:
        usage = {"inputTokens": 10, "outputTokens": 5}
        model = {"provider": "openai", "modelId": "gpt-4o"}
        return ev("harness.model.responded", turn=turn, callId=f"c{turn}", model=model, response={"usage": usage})

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator(PATH, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received = []
        for turn in (1, 2, 3):
            await _append(workspace, "run_busy", responded(turn))
            received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        await get_channel_layer().group_send(
            workspace_group_for(workspace.pk), {"type": "ledger.run_changed", "runId": "run_later"}
        )
        assert await comm.receive_nothing(timeout=0.3)
        await _append(workspace, "run_later", started())
        received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        await comm.disconnect()
        return received

    pushed = async_to_sync(scenario)()
    assert pushed == [{"type": "run", "runId": "run_busy"}] * 3 + [{"type": "run", "runId": "run_later"}]
    assert looked_up == ["run_busy", "run_later", "run_later"]


def test_a_batch_that_starts_or_finishes_a_run_is_announced_to_its_workspace(workspace: Workspace) -> None:
    layer = get_channel_layer()

    async def scenario() -> list[dict[str, Any]]:
        channel = await layer.new_channel()
        await layer.group_add(workspace_group_for(workspace.pk), channel)
        await _append(workspace, "run_told", started())
        first = await layer.receive(channel)
        await _append(workspace, "run_told", ev("StepScheduled", stepPath="a"), ev("custom.x"))
        await _append(workspace, "run_told", ev("RunCompleted"))
        second = await layer.receive(channel)
        await layer.group_discard(workspace_group_for(workspace.pk), channel)
        return [first, second]

    assert async_to_sync(scenario)() == [{"type": "ledger.run_changed", "runId": "run_told"}] * 2


def _refused(path: str, session_id: str | None, origin: str = "http://testserver") -> bool:
    async def scenario() -> bool:
        comm = _communicator(path, session_id, origin)
        connected, _ = await comm.connect(timeout=TIMEOUT_S)
        await comm.disconnect()  # a refused consumer still runs until the socket is gone
        return not connected

    return async_to_sync(scenario)()


def test_anonymous_outsiders_unknown_workspaces_and_foreign_pages_are_refused(
    member: Any, outsider: Any, workspace: Workspace
) -> None:
    assert _refused(PATH, None)
    assert _refused(PATH, _session_id(outsider))
    assert not _refused("/ws/workspaces/globex/main/runs/", _session_id(outsider))
    alice = _session_id(member)
    assert _refused("/ws/workspaces/acme/nope/runs/", alice)
    assert _refused("/ws/workspaces/globex/main/runs/", alice)
    assert _refused(PATH, alice, origin="http://evil.example")
    assert not _refused(PATH, alice)


# --- a live Daphne -------------------------------------------------------------------------


def test_live_daphne_pushes_a_run_appended_through_its_api(
    server: Daphne, member: Any, outsider: Any, workspace: Workspace
) -> None:
    url = server.url.replace("http://", "ws://") + PATH
    with pytest.raises(websocket.WebSocketBadStatusException) as refused:
        websocket.create_connection(
            url, cookie=f"sessionid={_session_id(outsider)}", origin=server.url, timeout=TIMEOUT_S
        )
    assert refused.value.status_code == 403
    sock = websocket.create_connection(
        url, cookie=f"sessionid={_session_id(member)}", origin=server.url, timeout=TIMEOUT_S * 2
    )
    try:
        _, key = create_key(workspace=workspace, scopes=["ingest"])
        response = httpx.post(
            f"{server.url}/api/v1/runs/run_over_http/events",
            timeout=30,
            headers={"Authorization": f"Bearer {key}"},
            json={"events": [started("wf_http")]},
        )
        assert response.status_code == 200, response.text
        message = json.loads(sock.recv())
    finally:
        sock.close()
    assert message == {"type": "run", "runId": "run_over_http"}
