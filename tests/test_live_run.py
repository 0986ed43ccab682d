"""The run consumer, `/ws/runs/<runId>/?after=N&workspace=T/W` (console/live/run.py).

In process through the real ASGI stack (origin check, session auth, router) with
WebsocketCommunicator; and against two Daphne processes, each with a browser-like WebSocket
client, while events are appended through the HTTP API of either. With Redis (the PostgreSQL
pass) the two share the channel layer and poll the database only every 30 s, so what arrives
sooner crossed processes by announcement; without Redis (the SQLite pass) each has its own
in-memory layer, so an append through one reaches the other's socket only by its database
poll, which is the lossy-layer path: both must still deliver every event once, in order.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import websocket
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import transaction
from django.test import Client

from console.live import run as live_run
from ledger import log
from ledger.log import announce
from ledger.log.announce import group_for
from ledger.models import Event, Run, Workspace
from ledger.replay import follow
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import ev, started
from tests.live_support import TIMEOUT_S
from tests.live_support import communicator as _communicator
from tests.live_support import session_id as _session_id
from tests.servers import Daphne
from tests.servers import start_daphne as _start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("REDIS_URL", "")


async def _events(comm: WebsocketCommunicator, count: int) -> list[dict[str, Any]]:
    return [await comm.receive_json_from(timeout=TIMEOUT_S) for _ in range(count)]


def _append(workspace: Workspace, run_id: str, *events: dict[str, Any]) -> Any:
    return database_sync_to_async(log.append)(workspace=workspace, run_id=run_id, events=list(events))


async def _idle(feed: follow.RunFeed) -> None:
    """Until every follower of the feed waits for news."""
    while any(f.news.waiter is None for f in feed.positions):
        await asyncio.sleep(0.01)


# --- in process ------------------------------------------------------------------------------------


def test_catch_up_after_n_then_live_rows_in_order_without_duplicates(member: Any, workspace: Workspace) -> None:
    log.append(
        workspace=workspace,
        run_id="run_ws",
        events=[started()] + [ev("StepScheduled", stepPath=f"s{n}") for n in range(2, 6)],
    )
    run = Run.objects.get(run_id="run_ws")
    session = _session_id(member)

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator("/ws/runs/run_ws/?after=2&workspace=acme/support", session)
        connected, _ = await comm.connect(timeout=TIMEOUT_S)
        assert connected
        received = await _events(comm, 3)
        await _append(workspace, "run_ws", ev("StepScheduled", stepPath="s6"))
        await _append(workspace, "run_ws", ev("StepScheduled", stepPath="s7"), ev("StepScheduled", stepPath="s8"))
        received += await _events(comm, 3)
        # An announcement is only a wake-up: one for old sequences (or a made-up one) sends nothing.
        await get_channel_layer().group_send(
            group_for(run.pk), {"type": "ledger.appended", "runId": "run_ws", "sequence": 4}
        )
        await get_channel_layer().group_send(
            group_for(run.pk), {"type": "ledger.appended", "runId": "run_ws", "sequence": 99}
        )
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert [m["sequence"] for m in received] == [3, 4, 5, 6, 7, 8]
    assert {m["type"] for m in received} == {"event"}
    for message in received:
        assert (
            f'<tr class="event" id="event-{message["sequence"]}" data-sequence="{message["sequence"]}">'
            in message["html"]
        )
    assert "s7" in received[4]["html"]


def test_pushed_rows_are_the_rows_the_page_renders(client: Client, member: Any, workspace: Workspace) -> None:
    log.append(
        workspace=workspace,
        run_id="run_same",
        events=[started(), ev("StepCompleted", stepPath="a", attempt=1, output={"answer": "<b>42</b>"})],
    )
    session = _session_id(member)

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator("/ws/runs/run_same/", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        messages = await _events(comm, 2)
        await comm.disconnect()
        return messages

    pushed = async_to_sync(scenario)()
    client.force_login(member)
    page = client.get("/w/acme/support/runs/run_same/").content.decode()
    fragment = client.get("/w/acme/support/runs/run_same/timeline/rows/?after=1").content.decode()
    assert pushed[1]["html"].strip() == fragment.strip()
    assert pushed[1]["html"].strip() in page
    assert "&lt;b&gt;42&lt;/b&gt;" in pushed[1]["html"]  # payloads are escaped


def test_live_rows_from_an_announced_batch_are_the_rows_a_read_renders(
    client: Client, member: Any, workspace: Workspace
) -> None:
    log.append(workspace=workspace, run_id="run_live_same", events=[started()])
    session = _session_id(member)
    run_pk = Run.objects.get(run_id="run_live_same").pk

    async def scenario() -> tuple[list[dict[str, Any]], list[dict[str, Any]], int]:
        live = _communicator("/ws/runs/run_live_same/?after=1", session)
        assert (await live.connect(timeout=TIMEOUT_S))[0]
        feed = live_run.feeds_here()[run_pk]
        await asyncio.wait_for(_idle(feed), TIMEOUT_S)  # its start read is over
        await _append(
            workspace,
            "run_live_same",
            ev("StepCompleted", stepPath="a", attempt=1, output={"z": "<b>42</b>", "a": ["é", 1.5, None]}),
            {"type": "custom.note", "occurrenceId": "occ_1", "payload": {"b": {"y": 1, "x": 2}, "a": "\u2028"}},
        )
        pushed = await _events(live, 2)
        announced = feed.announced_reads
        await live.disconnect()
        caught_up = _communicator("/ws/runs/run_live_same/?after=1", session)  # a read of the log
        assert (await caught_up.connect(timeout=TIMEOUT_S))[0]
        read = await _events(caught_up, 2)
        await caught_up.disconnect()
        return pushed, read, announced

    pushed, read, announced = async_to_sync(scenario)()
    assert announced == 1
    assert pushed == read
    client.force_login(member)
    fragment = client.get("/w/acme/support/runs/run_live_same/timeline/rows/?after=1").content.decode()
    assert 0 <= fragment.index(pushed[0]["html"].strip()) < fragment.index(pushed[1]["html"].strip())


def test_end_is_sent_when_the_run_finishes_and_the_socket_closes(member: Any, workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_end", events=[started()])
    session = _session_id(member)

    async def scenario() -> tuple[list[dict[str, Any]], dict[str, Any]]:
        comm = _communicator("/ws/runs/run_end/?after=0", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received = await _events(comm, 1)
        await _append(workspace, "run_end", ev("StepScheduled", stepPath="a"), ev("RunFailed", error={"m": "x"}))
        received += await _events(comm, 3)
        closed = await comm.receive_output(timeout=TIMEOUT_S)
        await comm.disconnect()
        return received, closed

    received, closed = async_to_sync(scenario)()
    assert [m.get("sequence") for m in received] == [1, 2, 3, None]
    assert received[-1] == {"type": "end", "status": "failed"}
    assert closed["type"] == "websocket.close"


def test_a_finished_run_sends_what_is_after_n_then_end(member: Any, workspace: Workspace) -> None:
    log.append(
        workspace=workspace, run_id="run_old", events=[started(), ev("StepScheduled", stepPath="a"), ev("RunCompleted")]
    )
    session = _session_id(member)

    async def scenario() -> list[dict[str, Any]]:
        comm = _communicator("/ws/runs/run_old/?after=1", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received = await _events(comm, 3)
        assert (await comm.receive_output(timeout=TIMEOUT_S))["type"] == "websocket.close"
        await comm.disconnect()
        return received

    received = async_to_sync(scenario)()
    assert [m.get("sequence") for m in received] == [2, 3, None]
    assert received[-1] == {"type": "end", "status": "completed"}


def test_what_a_client_sends_is_ignored_and_writes_nothing(member: Any, workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_quiet", events=[started()])
    session = _session_id(member)

    async def scenario() -> None:
        comm = _communicator("/ws/runs/run_quiet/", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        await _events(comm, 1)
        await comm.send_json_to({"type": "append", "events": [{"type": "RunCompleted", "payload": {}}]})
        await comm.send_to(text_data="not json either")
        assert await comm.receive_nothing(timeout=0.3)
        await comm.disconnect()

    async_to_sync(scenario)()
    assert Event.objects.filter(run__run_id="run_quiet").count() == 1


def _refused(path: str, session_id: str | None, origin: str = "http://testserver") -> bool:
    async def scenario() -> bool:
        comm = _communicator(path, session_id, origin)
        connected, _ = await comm.connect(timeout=TIMEOUT_S)
        # Finish the consumer here, as a browser's closed socket would: left running, it is
        # cancelled only when async_to_sync closes the loop, in the middle of a channel-layer read.
        await comm.disconnect()
        return not connected

    return async_to_sync(scenario)()


def test_anonymous_is_refused(workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_anon", events=[started()])
    assert _refused("/ws/runs/run_anon/", None)
    assert _refused("/ws/runs/run_anon/?workspace=acme/support", None)


def test_an_outsider_is_refused_as_for_an_unknown_run(member: Any, outsider: Any, workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_private", events=[started()])
    olga = _session_id(outsider)
    assert _refused("/ws/runs/run_private/", olga)
    assert _refused("/ws/runs/run_private/?workspace=acme/support", olga)
    assert _refused("/ws/runs/run_private/?workspace=globex/main", olga)
    assert _refused("/ws/runs/run_nope/", _session_id(member))


@pytest.mark.parametrize("query", ["?after=-1", "?after=x", "?workspace=acme", "?workspace=acme/nope"])
def test_bad_parameters_are_refused(member: Any, workspace: Workspace, query: str) -> None:
    log.append(workspace=workspace, run_id="run_params", events=[started()])
    assert _refused(f"/ws/runs/run_params/{query}", _session_id(member))


def test_another_sites_page_is_refused(member: Any, workspace: Workspace) -> None:
    log.append(workspace=workspace, run_id="run_origin", events=[started()])
    assert _refused("/ws/runs/run_origin/", _session_id(member), origin="http://evil.example")


def test_workspace_picks_the_run_when_two_workspaces_hold_the_same_id(member: Any, workspace: Workspace) -> None:
    second = bootstrap(tenant="acme", workspace="research")
    log.append(workspace=workspace, run_id="run_twin", events=[started("wf_support")])
    log.append(workspace=second, run_id="run_twin", events=[started("wf_research")])
    session = _session_id(member)
    assert _refused("/ws/runs/run_twin/", session)  # ambiguous without it

    async def first_row(path: str) -> str:
        comm = _communicator(path, session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        message = await comm.receive_json_from(timeout=TIMEOUT_S)
        await comm.disconnect()
        return message["html"]

    assert "wf_research" in async_to_sync(first_row)("/ws/runs/run_twin/?workspace=acme/research")
    assert "wf_support" in async_to_sync(first_row)("/ws/runs/run_twin/?workspace=acme/support")


# --- one read per run per process, shared by its subscribers -------------------------------------


def test_subscribers_at_different_positions_each_get_their_sequences_once_in_order_while_events_land(
    member: Any, workspace: Workspace, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Subscribers that connect at different `after`s while events are appended (and poll, and
    page through small reads) share reads; each still gets exactly the sequences after its own
    position, once, in order, then `end`."""
    monkeypatch.setattr(follow, "PAGE_SIZE", 4)  # catch-up over several pages
    settings.LEDGER_STREAM_POLL_SECONDS = 0.05  # polls interleave with announcements
    log.append(
        workspace=workspace,
        run_id="run_many",
        events=[started()] + [ev("StepScheduled", stepPath=f"s{n}") for n in range(2, 13)],
    )
    run_pk = Run.objects.get(run_id="run_many").pk
    session = _session_id(member)
    positions = [0, 3, 7, 7, 12, 12, 5]

    async def listen(after: int) -> list[dict[str, Any]]:
        comm = _communicator(f"/ws/runs/run_many/?after={after}&workspace=acme/support", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        received: list[dict[str, Any]] = []
        while not received or received[-1]["type"] != "end":
            received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        assert (await comm.receive_output(timeout=TIMEOUT_S))["type"] == "websocket.close"
        await comm.disconnect()
        return received

    async def write() -> None:
        n = 13
        for size in (1, 3, 1, 2, 5, 1, 1, 4, 2):
            await _append(workspace, "run_many", *(ev("StepScheduled", stepPath=f"s{n + i}") for i in range(size)))
            n += size
            await asyncio.sleep(0.01)
        await _append(workspace, "run_many", ev("RunCompleted"))

    async def scenario() -> tuple[list[list[dict[str, Any]]], bool]:
        listeners = [asyncio.ensure_future(listen(after)) for after in positions]
        await asyncio.sleep(0)
        await write()
        received = [await asyncio.wait_for(listener, 60) for listener in listeners]
        return received, run_pk in live_run.feeds_here()

    received, feed_left_behind = async_to_sync(scenario)()
    last = Run.objects.get(run_id="run_many").last_sequence
    assert last == 33
    for after, messages in zip(positions, received):
        assert [m["sequence"] for m in messages[:-1]] == list(range(after + 1, last + 1)), after
        assert messages[-1] == {"type": "end", "status": "completed"}
        assert all(f'data-sequence="{m["sequence"]}"' in m["html"] for m in messages[:-1])
    assert not feed_left_behind  # the last subscriber to end took the run's feed with it


def test_one_read_per_announcement_serves_every_subscriber_of_the_run(
    member: Any, workspace: Workspace, settings: Any
) -> None:
    """The announcement of a small batch carries it: that is the read; a big one is read once."""
    settings.LEDGER_STREAM_POLL_SECONDS = 60  # only announcements make them read
    log.append(workspace=workspace, run_id="run_fan", events=[started(), ev("StepScheduled", stepPath="a")])
    run_pk = Run.objects.get(run_id="run_fan").pk
    session = _session_id(member)
    subscribers = 12

    big = "x" * announce.ANNOUNCED_PAYLOAD_CHARS

    async def scenario() -> tuple[list[tuple[int, int]], list[list[int]], bool]:
        comms = [_communicator("/ws/runs/run_fan/?after=1&workspace=acme/support", session) for _ in range(subscribers)]
        for comm in comms:
            assert (await comm.connect(timeout=TIMEOUT_S))[0]
            # Its connect read is over once it sent what it found.
            assert (await comm.receive_json_from(timeout=TIMEOUT_S))["sequence"] == 2
        feed = live_run.feeds_here()[run_pk]
        reads, got = [], []
        for batch in (
            [ev("StepScheduled", stepPath="b")],
            [ev("StepScheduled", stepPath="c"), ev("StepScheduled", stepPath="d")],
            [ev("StepScheduled", stepPath="e", text=big)],
        ):
            before = (feed.database_reads, feed.announced_reads)
            await _append(workspace, "run_fan", *batch)
            got.append([(await comm.receive_json_from(timeout=TIMEOUT_S))["sequence"] for comm in comms for _ in batch])
            for comm in comms:
                assert await comm.receive_nothing(timeout=0.05)
            reads.append((feed.database_reads - before[0], feed.announced_reads - before[1]))
        for comm in comms:
            await comm.disconnect()
        return reads, got, run_pk in live_run.feeds_here()

    reads, got, feed_left_behind = async_to_sync(scenario)()
    assert got == [[3] * subscribers, [4, 5] * subscribers, [6] * subscribers]
    # (database reads, announced batches taken)
    assert reads == [(0, 1), (0, 1), (1, 0)]
    assert not feed_left_behind


def test_a_burst_of_appends_reaches_every_subscriber_once_and_in_order_though_its_announcements_coalesce(
    member: Any, workspace: Workspace, settings: Any
) -> None:
    """Forty appends back to back, twenty of them five to a transaction (whose announcements are
    filed together at its commit): announcements that wait together go out as one, the run's
    highest sequence standing for the ones before it. Polls are off, so only announcements make
    the subscribers read: each must still get every event after its own position, once, in
    order, then `end`."""
    settings.LEDGER_STREAM_POLL_SECONDS = 60
    log.append(workspace=workspace, run_id="run_burst", events=[started(), ev("StepScheduled", stepPath="a")])
    session = _session_id(member)
    positions = [2, 2, 0, 1, 2]

    async def connect(after: int) -> WebsocketCommunicator:
        comm = _communicator(f"/ws/runs/run_burst/?after={after}&workspace=acme/support", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        return comm

    async def until_end(comm: WebsocketCommunicator) -> list[dict[str, Any]]:
        received: list[dict[str, Any]] = []
        while not received or received[-1]["type"] != "end":
            received.append(await comm.receive_json_from(timeout=TIMEOUT_S))
        await comm.disconnect()
        return received

    def append(n: int) -> None:
        log.append(workspace=workspace, run_id="run_burst", events=[ev("StepScheduled", stepPath=f"b{n}")])

    def burst() -> None:
        for n in range(20):
            append(n)
        for first in range(20, 40, 5):
            with transaction.atomic():
                for n in range(first, first + 5):
                    append(n)
        log.append(workspace=workspace, run_id="run_burst", events=[ev("RunCompleted")])

    async def scenario() -> list[list[dict[str, Any]]]:
        comms = [await connect(after) for after in positions]
        listeners = [asyncio.ensure_future(until_end(comm)) for comm in comms]
        await database_sync_to_async(burst)()
        return [await asyncio.wait_for(listener, 60) for listener in listeners]

    received = async_to_sync(scenario)()
    assert Run.objects.get(run_id="run_burst").last_sequence == 43
    for after, messages in zip(positions, received):
        assert [m["sequence"] for m in messages[:-1]] == list(range(after + 1, 44)), after
        assert messages[-1] == {"type": "end", "status": "completed"}


# --- two Daphne processes -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_servers(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daphne, Daphne]]:
    poll = "30" if REDIS_URL else "0.2"
    log_dir = tmp_path_factory.mktemp("daphne")
    servers = [_start_daphne(log_dir, name, {"LEDGER_STREAM_POLL_SECONDS": poll}) for name in ("a", "b")]
    yield servers[0], servers[1]
    for server in servers:
        server.stop()  # before the test database is dropped: they hold connections to it


def _ws_url(server: Daphne, run_id: str) -> str:
    return server.url.replace("http://", "ws://") + f"/ws/runs/{run_id}/?after=0&workspace=acme/support"


def _collect(server: Daphne, run_id: str, session_id: str, out: list[dict[str, Any]], ready: threading.Event) -> None:
    """A browser's view: every message until `end`, then the server's close."""
    sock = websocket.create_connection(
        _ws_url(server, run_id), cookie=f"sessionid={session_id}", origin=server.url, timeout=TIMEOUT_S * 2
    )
    try:
        while True:
            message = json.loads(sock.recv())
            out.append(message)
            if message.get("sequence") == 1:
                ready.set()
            if message["type"] == "end":
                return
    finally:
        ready.set()
        sock.close()


def test_two_daphne_processes_each_deliver_every_event_appended_through_either(
    two_servers: tuple[Daphne, Daphne], member: Any, workspace: Workspace
) -> None:
    a, b = two_servers
    _, key = create_key(workspace=workspace, scopes=["ingest"])
    headers = {"Authorization": f"Bearer {key}"}
    session = _session_id(member)
    with httpx.Client(headers=headers, timeout=30) as http:

        def post(server: Daphne, *events: dict[str, Any]) -> None:
            response = http.post(f"{server.url}/api/v1/runs/run_two/events", json={"events": list(events)})
            assert response.status_code == 200, response.text

        post(a, started())
        seen: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        threads = []
        for name, server in (("a", a), ("b", b)):
            ready = threading.Event()
            thread = threading.Thread(
                target=_collect, args=(server, "run_two", session, seen[name], ready), daemon=True
            )
            thread.start()
            assert ready.wait(TIMEOUT_S * 2), f"the socket on {name} never caught up"
            threads.append(thread)
        for n in range(2, 12):
            post(a if n % 2 else b, ev("StepScheduled", stepPath=f"s{n}"))
        post(b, ev("StepScheduled", stepPath="s12"), ev("StepScheduled", stepPath="s13"))
        post(a, ev("RunCompleted", output={"ok": True}))
        for thread in threads:
            thread.join(timeout=60)
            assert not thread.is_alive(), "a socket never received end"

    for name in ("a", "b"):
        events = [m for m in seen[name] if m["type"] == "event"]
        assert [m["sequence"] for m in events] == list(range(1, 15)), name
        assert seen[name][-1] == {"type": "end", "status": "completed"}
        assert "RunCompleted" in events[-1]["html"]


def test_live_daphne_refuses_an_outsider_and_anonymous(
    two_servers: tuple[Daphne, Daphne], outsider: Any, workspace: Workspace
) -> None:
    log.append(workspace=workspace, run_id="run_guarded", events=[started()])
    a, _ = two_servers
    for cookie in (f"sessionid={_session_id(outsider)}", None):
        with pytest.raises(websocket.WebSocketBadStatusException) as refused:
            websocket.create_connection(_ws_url(a, "run_guarded"), cookie=cookie, origin=a.url, timeout=TIMEOUT_S)
        assert refused.value.status_code == 403


# --- the browser side: a gap in the pushed sequences is filled from the database ------------------

CHROMIUM = "/usr/bin/chromium"


def test_the_page_fills_a_gap_in_pushed_sequences_from_the_database(
    two_servers: tuple[Daphne, Daphne], member: Any, workspace: Workspace
) -> None:
    """A message lost between server and page (here: dropped by a WebSocket route in the browser)
    shows as a gap at the next one; the page fetches the missing rows from `timeline/rows/`
    before applying it, and the pushed duplicate is ignored."""
    from playwright.sync_api import expect, sync_playwright

    if not os.path.exists(CHROMIUM):
        pytest.fail(f"this test needs Debian's Chromium at {CHROMIUM} (.ci/run installs it)", pytrace=False)
    server, _ = two_servers
    log.append(
        workspace=workspace,
        run_id="run_gap",
        events=[started(), ev("StepScheduled", stepPath="a"), ev("StepScheduled", stepPath="b")],
    )
    _, key = create_key(workspace=workspace, scopes=["ingest"])
    session = _session_id(member)
    dropped: list[int] = []
    fetched: list[str] = []

    def post(*events: dict[str, Any]) -> None:
        response = httpx.post(
            f"{server.url}/api/v1/runs/run_gap/events",
            json={"events": list(events)},
            headers={"Authorization": f"Bearer {key}"},
            timeout=30,
        )
        assert response.status_code == 200, response.text

    def lose_sequence_5(route: Any) -> None:
        upstream = route.connect_to_server()

        def forward(message: str | bytes) -> None:
            if json.loads(message).get("sequence") == 5 and not dropped:
                dropped.append(5)
                return
            route.send(message)

        upstream.on_message(forward)

    # No ORM call from here on: Playwright's sync API runs an event loop in this thread.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            context = browser.new_context()
            context.add_cookies([{"name": "sessionid", "value": session, "url": server.url}])
            page = context.new_page()
            page.route_web_socket("**/ws/runs/**", lose_sequence_5)
            page.on(
                "request", lambda request: fetched.append(request.url) if "/timeline/rows/" in request.url else None
            )
            page.goto(f"{server.url}/w/acme/support/runs/run_gap/")
            rows = page.locator("#timeline-rows tr.event")
            expect(page.locator("#live-status")).to_have_attribute("data-state", "live", timeout=15_000)
            post(ev("StepScheduled", stepPath="c"))
            expect(page.locator('#timeline-rows tr.event[data-sequence="4"]')).to_have_count(1, timeout=15_000)
            post(ev("StepScheduled", stepPath="d"))  # 5: lost on the way
            post(ev("StepScheduled", stepPath="e"))  # 6: a gap, so the page reads 5 and 6 itself
            expect(rows).to_have_count(6, timeout=15_000)
            post(ev("RunCompleted"))
            expect(page.locator("#live-status")).to_have_attribute("data-state", "finished", timeout=15_000)
            shown = rows.evaluate_all("rows => rows.map(row => Number(row.dataset.sequence))")
            last = page.evaluate("window.runledgerLive.lastSequence")
        finally:
            browser.close()

    assert dropped == [5]
    assert shown == [1, 2, 3, 4, 5, 6, 7] and last == 7
    assert any("after=4" in url for url in fetched), fetched
