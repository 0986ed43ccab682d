"""GET /api/v1/runs/{runId}/stream against a real Daphne in another process (docs/api.md "Streams").

The Daphne processes serve the test database. Events are appended from this process through
`ledger.log.append`, so their announcements go to this process's channel layer: with the in-memory
layer (the SQLite pass) they never reach Daphne, and the streams deliver by reading the database
on their timer; with Redis (the PostgreSQL pass) the main server polls only every 30 s, so what
arrives sooner arrived by announcement.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from django.db import connections
from django.test import Client

from ledger.log import append
from ledger.models import Run, Workspace
from ledger.reads import selectors
from ledger.tenancy.services import create_key
from tests.conftest import ev, started
from tests.servers import Daphne
from tests.servers import start_daphne as _start_daphne

pytestmark = pytest.mark.django_db(transaction=True)

REDIS_URL = os.environ.get("REDIS_URL", "")
KEEPALIVE_S = 0.5
STREAM_DEADLINE_S = 15.0  # no test stream runs longer than this
# Generous: a loaded 2-core CI machine can stall a read for seconds; the streams end on their own.
TIMEOUT = httpx.Timeout(15.0)


# --- Daphne in a subprocess -------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    """The pass's own channel layer; with Redis, polling so rare that announcements must deliver."""
    poll = "30" if REDIS_URL else "0.2"
    daphne = _start_daphne(
        tmp_path_factory.mktemp("daphne"),
        "main",
        {
            "LEDGER_STREAM_POLL_SECONDS": poll,
            "LEDGER_STREAM_KEEPALIVE_SECONDS": str(KEEPALIVE_S),
        },
    )
    yield daphne
    daphne.stop()  # before the test database is dropped: it holds connections to it


@pytest.fixture(scope="module")
def deaf_server(django_db_setup: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daphne]:
    """An in-memory layer of its own: no announcement from this process ever reaches it."""
    daphne = _start_daphne(
        tmp_path_factory.mktemp("daphne"),
        "deaf",
        {
            "REDIS_URL": None,
            "LEDGER_STREAM_POLL_SECONDS": "0.2",
            "LEDGER_STREAM_KEEPALIVE_SECONDS": "15",
        },
    )
    yield daphne
    daphne.stop()


# --- an SSE client ------------------------------------------------------------------------------


@dataclass
class Message:
    event: str = "message"
    id: str | None = None
    data: str = ""
    comment: str | None = None

    @property
    def sequence(self) -> int:
        return int(self.id or "")


def messages(response: httpx.Response, deadline_s: float = STREAM_DEADLINE_S) -> Iterator[Message]:
    """Parse the event stream (comments come out as their own messages); fail past the deadline."""
    assert response.status_code == 200, response.read()
    assert response.headers["content-type"].startswith("text/event-stream")
    deadline = time.monotonic() + deadline_s
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        assert time.monotonic() < deadline, "the stream ran past its deadline"
        if line == "":
            if fields:
                yield Message(**fields)  # type: ignore[arg-type]
            fields = {}
        elif line.startswith(":"):
            yield Message(event="", comment=line[1:].strip())
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            fields[name] = fields[name] + "\n" + value if name == "data" and name in fields else value


def read_to_end(stream: Iterator[Message]) -> tuple[list[Message], Message]:
    """Every ledger.event up to `end`; asserts the stream then closes."""
    events: list[Message] = []
    for message in stream:
        if message.event == "ledger.event":
            events.append(message)
        elif message.event == "end":
            assert list(stream) == [], "nothing may follow end"
            return events, message
    raise AssertionError(f"the stream closed without end after {[m.id for m in events]}")


def read_until(stream: Iterator[Message], count: int) -> list[Message]:
    events: list[Message] = []
    for message in stream:
        if message.event == "ledger.event":
            events.append(message)
            if len(events) == count:
                return events
    raise AssertionError(f"the stream closed after {len(events)} of {count} events")


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture
def read_key(workspace: Workspace) -> dict[str, str]:
    _, key = create_key(workspace=workspace, scopes=["read"])
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(timeout=TIMEOUT) as client:
        yield client


def _steps(workspace: Workspace, run_id: str, numbers: range, *, pause: float = 0.0) -> None:
    for n in numbers:
        append(workspace=workspace, run_id=run_id, events=[ev("StepScheduled", stepPath=f"step{n}")])
        time.sleep(pause)


def _in_thread(target: Any, *args: Any, **kwargs: Any) -> threading.Thread:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target(*args, **kwargs)
        except BaseException as exc:  # surfaced by join_checked
            errors.append(exc)
        finally:
            connections.close_all()  # this thread's connection, before the database is flushed

    thread = threading.Thread(target=run, daemon=True)
    thread.errors = errors  # type: ignore[attr-defined]
    thread.start()
    return thread


def _join(thread: threading.Thread) -> None:
    thread.join(timeout=STREAM_DEADLINE_S)
    assert not thread.is_alive(), "the appender did not finish"
    assert not thread.errors, thread.errors  # type: ignore[attr-defined]


def _url(server: Daphne, run_id: str, query: str = "") -> str:
    return f"{server.url}/api/v1/runs/{run_id}/stream{query}"


# --- catch-up and live --------------------------------------------------------------------------


def test_reconnect_with_last_event_id_gets_the_rest_exactly_once(
    server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    run_id = "run_reconnect"
    append(workspace=workspace, run_id=run_id, events=[started()])
    _steps(workspace, run_id, range(2, 6))

    def twenty_more() -> None:
        _steps(workspace, run_id, range(6, 25), pause=0.02)
        append(workspace=workspace, run_id=run_id, events=[ev("RunCompleted", output="done")])

    with http.stream("GET", _url(server, run_id), headers=read_key) as response:
        stream = messages(response)
        first = read_until(stream, 5)
        appender = _in_thread(twenty_more)
    # Leaving the block dropped the connection after event 5, while the appends go on.
    with http.stream("GET", _url(server, run_id), headers={**read_key, "Last-Event-ID": "5"}) as response:
        rest, end = read_to_end(messages(response))
    _join(appender)

    assert [m.sequence for m in first] == [1, 2, 3, 4, 5]
    assert [m.sequence for m in rest] == list(range(6, 26))
    run = Run.objects.get(workspace=workspace, run_id=run_id)
    assert [json.loads(m.data) for m in rest] == selectors.events(run, after=5)
    assert json.loads(rest[-1].data)["type"] == "RunCompleted"
    assert json.loads(end.data) == {"status": "completed"}
    assert end.id is None


def test_after_starts_past_the_given_sequence_and_a_failed_run_ends(
    server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    append(
        workspace=workspace,
        run_id="run_after",
        events=[
            started(),
            ev("StepScheduled", stepPath="a"),
            ev("StepScheduled", stepPath="b"),
            ev("RunFailed", error={"message": "boom"}),
        ],
    )
    with http.stream("GET", _url(server, "run_after", "?after=2"), headers=read_key) as response:
        events, end = read_to_end(messages(response))
    assert [m.sequence for m in events] == [3, 4]
    assert json.loads(end.data) == {"status": "failed"}


def test_last_event_id_wins_over_after(
    server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    append(
        workspace=workspace,
        run_id="run_both",
        events=[
            started(),
            ev("StepScheduled", stepPath="a"),
            ev("RunCompleted"),
        ],
    )
    headers = {**read_key, "Last-Event-ID": "2"}
    with http.stream("GET", _url(server, "run_both", "?after=0"), headers=headers) as response:
        events, _ = read_to_end(messages(response))
    assert [m.sequence for m in events] == [3]


def test_live_events_arrive_without_reconnecting(
    server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    append(workspace=workspace, run_id="run_live", events=[started()])
    with http.stream("GET", _url(server, "run_live"), headers=read_key) as response:
        stream = messages(response)
        assert [m.sequence for m in read_until(stream, 1)] == [1]
        appender = _in_thread(_steps, workspace, "run_live", range(2, 5), pause=0.05)
        live = read_until(stream, 3)
        _join(appender)
        # Within 5 s: in the Redis pass this server polls every 30 s, so announcements delivered.
        assert [m.sequence for m in live] == [2, 3, 4]
        append(workspace=workspace, run_id="run_live", events=[ev("RunCompleted")])
        events, end = read_to_end(stream)
    assert [m.sequence for m in events] == [5]
    assert json.loads(end.data) == {"status": "completed"}


def test_delivers_by_polling_when_announcements_cannot_reach_the_server(
    deaf_server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    append(workspace=workspace, run_id="run_deaf", events=[started()])
    with http.stream("GET", _url(deaf_server, "run_deaf"), headers=read_key) as response:
        stream = messages(response)
        read_until(stream, 1)
        _steps(workspace, "run_deaf", range(2, 4))
        append(workspace=workspace, run_id="run_deaf", events=[ev("RunCompleted")])
        events, end = read_to_end(stream)
    assert [m.sequence for m in events] == [2, 3, 4]
    assert json.loads(end.data) == {"status": "completed"}


def test_keepalive_comments_while_nothing_happens(
    server: Daphne, http: httpx.Client, workspace: Workspace, read_key: dict[str, str]
) -> None:
    append(workspace=workspace, run_id="run_quiet", events=[started()])
    # Before the request: the server's keepalive clock starts when it writes `: connected`, after
    # the request reached it (a `began` taken once the headers are read came 0.02 to 0.05 s after
    # that, and later by as long as a loaded machine left this process waiting).
    began = time.monotonic()
    with http.stream("GET", _url(server, "run_quiet"), headers=read_key) as response:
        keepalives = 0
        for message in messages(response):
            if message.comment == "keepalive":
                keepalives += 1
                if keepalives == 2:
                    break
    assert KEEPALIVE_S * 2 <= time.monotonic() - began < KEEPALIVE_S * 2 + 5


def test_stream_joins_the_group_before_reading_and_leaves_it_when_closed(workspace: Workspace) -> None:
    """In-process, on whichever channel layer the settings give (in-memory, or Redis)."""
    from asgiref.sync import async_to_sync
    from channels.layers import InMemoryChannelLayer, get_channel_layer

    from console.api.stream import _event_stream, _Opened
    from console.streams import SLOTS, Grant
    from ledger.log.announce import group_for

    append(workspace=workspace, run_id="run_group", events=[started()])
    run = Run.objects.get(workspace=workspace, run_id="run_group")
    layer = get_channel_layer()
    group = group_for(run.pk)

    async def members() -> int:
        if isinstance(layer, InMemoryChannelLayer):
            return len(layer.groups.get(group, {}))
        import redis

        # A plain client, outside channels_redis's per-loop connection pools. On the pub/sub layer
        # a process listens to a group once, however many of its channels are in it; and a
        # channel left must not stay subscribed (ledger.log.announce.Subscription).
        client = redis.Redis.from_url(REDIS_URL)
        try:
            [(_, listening)] = client.pubsub_numsub(layer.group_channel(group))
            return int(listening) + len(layer._get_layer().channels)
        finally:
            client.close()

    async def scenario() -> tuple[int, int, int]:
        before = await members()
        slot = SLOTS.take("test:group", 1)
        assert slot is not None
        grant = Grant(None, None, None, None, run.run_id, workspace.pk, run.pk)
        stream = _event_stream(_Opened(run, 0, None, grant), slot)
        first = await stream.__anext__()  # sent after subscribing and before the first read
        assert first == b": connected\n\n"
        during = await members()
        await stream.aclose()
        assert not slot.held  # closing the stream gave its slot back
        return before, during, await members()

    before, during, after = async_to_sync(scenario)()
    # Deltas: group names come from run ids, and another test session may share the Redis.
    assert (during - before, after - before) == ((1 if isinstance(layer, InMemoryChannelLayer) else 2), 0)


# --- who may read -------------------------------------------------------------------------------


def _error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body["error"]["code"] == code
    assert set(body["error"]) == {"code", "message", "details"}
    return body


@pytest.fixture
def finished_run(workspace: Workspace) -> str:
    append(workspace=workspace, run_id="run_done", events=[started(), ev("RunCompleted")])
    return "run_done"


def test_no_credentials_is_401(server: Daphne, http: httpx.Client, finished_run: str) -> None:
    response = http.get(_url(server, finished_run))
    _error(response, 401, "unauthenticated")
    assert response.headers["www-authenticate"] == "Bearer"


def test_unknown_key_is_401(server: Daphne, http: httpx.Client, finished_run: str) -> None:
    response = http.get(_url(server, finished_run), headers={"Authorization": "Bearer rl_nope_nope"})
    _error(response, 401, "unauthenticated")


def test_key_without_read_scope_is_403(
    server: Daphne, http: httpx.Client, workspace: Workspace, finished_run: str
) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest"])
    response = http.get(_url(server, finished_run), headers={"Authorization": f"Bearer {key}"})
    _error(response, 403, "insufficient_scope")


def test_run_of_another_workspace_is_404(
    server: Daphne, http: httpx.Client, other_workspace: Workspace, finished_run: str
) -> None:
    _, key = create_key(workspace=other_workspace, scopes=["read"])
    response = http.get(_url(server, finished_run), headers={"Authorization": f"Bearer {key}"})
    _error(response, 404, "not_found")


def test_unknown_run_is_404(server: Daphne, http: httpx.Client, read_key: dict[str, str]) -> None:
    _error(http.get(_url(server, "run_absent"), headers=read_key), 404, "not_found")


def test_bad_run_id_is_400(server: Daphne, http: httpx.Client, read_key: dict[str, str]) -> None:
    _error(http.get(_url(server, "not-a-run"), headers=read_key), 400, "invalid_run_id")


@pytest.mark.parametrize(
    "query, headers",
    [
        ("?after=x", {}),
        ("?after=-1", {}),
        ("", {"Last-Event-ID": "five"}),
        ("?after=1", {"Last-Event-ID": "-3"}),
    ],
)
def test_bad_position_is_400(
    server: Daphne,
    http: httpx.Client,
    read_key: dict[str, str],
    finished_run: str,
    query: str,
    headers: dict[str, str],
) -> None:
    response = http.get(_url(server, finished_run, query), headers={**read_key, **headers})
    _error(response, 400, "invalid_parameter")


def test_member_session_streams_and_an_outsider_session_gets_404(
    server: Daphne, http: httpx.Client, member: Any, outsider: Any, finished_run: str
) -> None:
    def session_cookie(user: Any) -> dict[str, str]:
        client = Client()
        client.force_login(user)
        return {"sessionid": client.cookies["sessionid"].value}

    with httpx.Client(timeout=TIMEOUT, cookies=session_cookie(member)) as alice:
        with alice.stream("GET", _url(server, finished_run)) as response:
            events, end = read_to_end(messages(response))
        assert [m.sequence for m in events] == [1, 2]
    with httpx.Client(timeout=TIMEOUT, cookies=session_cookie(outsider)) as olga:
        _error(olga.get(_url(server, finished_run)), 404, "not_found")


def test_other_methods_are_405_with_the_envelope(
    server: Daphne, http: httpx.Client, read_key: dict[str, str], finished_run: str
) -> None:
    _error(http.post(_url(server, finished_run), headers=read_key), 405, "method_not_allowed")
    answer = http.delete(_url(server, finished_run), headers=read_key)
    _error(answer, 405, "method_not_allowed")
    assert answer.headers["allow"] == "GET, HEAD, OPTIONS"


def test_head_and_options_answer_as_on_every_other_get_path(
    server: Daphne, http: httpx.Client, read_key: dict[str, str], finished_run: str, other_workspace: Workspace
) -> None:
    """HEAD is GET's checks and headers without a body (no stream held open), OPTIONS the methods
    in Allow once the caller is authenticated (nothing looked up), as DRF answers them on the other
    paths; both were 405 here."""
    head = http.head(_url(server, finished_run), headers=read_key)
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"].startswith("text/event-stream")
    assert head.headers["cache-control"] == "no-cache"
    options = http.options(_url(server, finished_run), headers=read_key)
    assert options.status_code == 200 and options.headers["allow"] == "GET, HEAD, OPTIONS"
    assert options.json()["renders"] == ["text/event-stream"]
    # The same refusals as GET: no credentials, another tenant's key, an unknown run, an Accept.
    assert http.head(_url(server, finished_run)).status_code == 401
    _error(http.options(_url(server, finished_run)), 401, "unauthenticated")
    _, outsider_key = create_key(workspace=other_workspace, scopes=["read"])
    assert http.head(_url(server, finished_run), headers={"Authorization": f"Bearer {outsider_key}"}).status_code == 404
    assert http.head(_url(server, "run_nowhere"), headers=read_key).status_code == 404
    assert http.head(_url(server, finished_run), headers={**read_key, "Accept": "application/json"}).status_code == 406


@pytest.mark.parametrize(
    "accept",
    [
        "text/event-stream",  # an EventSource, and the Python client (client/runledger/client)
        "*/*",  # curl
        "text/*",
        "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",  # a browser's address bar
        None,  # no Accept at all
    ],
)
def test_an_accept_that_admits_the_stream_gets_it(
    server: Daphne, read_key: dict[str, str], finished_run: str, accept: str | None
) -> None:
    with httpx.Client(timeout=TIMEOUT) as client:
        if accept is None:
            del client.headers["Accept"]
        else:
            client.headers["Accept"] = accept
        with client.stream("GET", _url(server, finished_run), headers=read_key) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events, end = read_to_end(messages(response))
    assert [m.sequence for m in events] == [1, 2]


@pytest.mark.parametrize(
    "accept",
    [
        "application/json",
        "application/x-ndjson",
        "text/event-stream;q=0",
        "*/*, text/event-stream;q=0",
        "text/*;q=0",
        "garbage",
    ],
)
def test_an_accept_that_does_not_admit_the_stream_is_406(
    server: Daphne, http: httpx.Client, read_key: dict[str, str], finished_run: str, accept: str
) -> None:
    """docs/api.md: an Accept no representation satisfies is 406 not_acceptable."""
    response = http.get(_url(server, finished_run), headers={**read_key, "Accept": accept})
    _error(response, 406, "not_acceptable")


def test_the_schema_documents_the_stream(client: Client) -> None:
    schema = client.get("/api/schema/", {"format": "json"}).json()
    operation = schema["paths"]["/api/v1/runs/{runId}/stream"]["get"]
    assert "text/event-stream" in operation["responses"]["200"]["content"]
    assert "not_acceptable" in operation["responses"]["406"]["description"]
    assert {p["name"] for p in operation["parameters"]} >= {"runId", "after", "Last-Event-ID"}
