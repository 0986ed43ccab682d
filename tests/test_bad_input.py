"""Bad input is a 4xx with the error body (API) or a 400 page (console), never a 500, and the same
answer on SQLite and PostgreSQL: NUL characters, deep nesting, cursors that are not ours, dates at
the calendar's edge, ids with a trailing newline (docs/security.md "Input limits")."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.db.models import Model
from django.test import Client

from console import cursors
from ledger.errors import InvalidEvent, InvalidRunId
from ledger.limits import MAX_JSON_DEPTH
from ledger.log import append
from ledger.log.prepare import validate_run_id
from ledger.models import Run
from ledger.tenancy.services import create_key
from tests.conftest import ev, started
from tests.live_support import TIMEOUT_S, communicator, session_id

DEEP = 900


def _cursor(value: Any) -> str:
    raw = value if isinstance(value, bytes) else json.dumps(value).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.fixture
def api(workspace, append) -> Client:
    append("run_a", started(), ev("StepScheduled", stepPath="s"))
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


@pytest.fixture
def console(client: Client, admin, append) -> Client:
    append("run_a", started(), ev("StepScheduled", stepPath="s"))
    client.force_login(admin)
    client.raise_request_exception = False
    return client


def _assert_api_error(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    if code is not None:
        assert body["error"]["code"] == code, body
    return body


API_GETS = [
    # a format no renderer has: 400 on every view, DRF's plain APIView included (it answered 404)
    *(
        (f"/api/v1/{path}?format=xml", "invalid_parameter")
        for path in (
            "runs",
            "runs/run_a",
            "runs/run_a/reexecutions",
            "runs/run_a/tool-calls",
            "reexecutions",
            "reexecutions/batches",
            "datasets",
            "evaluations",
            "evaluation-policies",
        )
    ),
    # cursors that are not ours: unsealed (the format before console/cursors.py), whatever they hold
    ("/api/v1/runs?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": 1e400}), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor(b'{"t": "2026-01-01T00:00:00+00:00", "id": Infinity}'), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor(b'{"t": "2026-01-01T00:00:00+00:00", "id": NaN}'), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": 10**30}), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": True}), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor({"t": "9999-12-31T23:59:59.999999-23:59", "id": 1}), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor({"t": "0001-01-01T00:00:00+23:59", "id": 1}), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor(_deep(DEEP).encode()), "invalid_cursor"),
    ("/api/v1/runs?cursor=" + _cursor(b'{"t": ' + _deep(DEEP).encode() + b', "id": 1}'), "invalid_cursor"),
    ("/api/v1/usage?cursor=" + _cursor({"o": 1e400}), "invalid_cursor"),
    ("/api/v1/usage?cursor=" + _cursor({"o": 10**30}), "invalid_cursor"),
    ("/api/v1/usage?cursor=" + _cursor(_deep(DEEP).encode()), "invalid_cursor"),
    ("/api/v1/runs/run_a/tool-calls?cursor=" + _cursor({"after": 1e400}), "invalid_cursor"),
    ("/api/v1/runs/run_a/tool-calls?cursor=" + _cursor({"after": 10**30}), "invalid_cursor"),
    ("/api/v1/reexecutions?cursor=" + _cursor({"after": 10**30}), "invalid_cursor"),
    # dates at the calendar's edge
    ("/api/v1/usage?to=9999-12-31", "invalid_parameter"),
    ("/api/v1/usage?from=9999-12-31&to=9999-12-31", "invalid_parameter"),
    ("/api/v1/usage?to=0001-01-05", "invalid_parameter"),
    ("/api/v1/usage?from=0001-01-01&to=0001-01-01", "invalid_parameter"),
    ("/api/v1/usage?from=0001-01-01", "invalid_parameter"),
    ("/api/v1/usage?from=0001-01-01&to=9999-12-31&groupBy=day", "invalid_parameter"),
    # NUL characters in query parameters
    ("/api/v1/runs?q=a%00b", "invalid_parameter"),
    ("/api/v1/runs?workflow=a%00b", "invalid_parameter"),
    ("/api/v1/runs?parentRunId=run_%00", "invalid_parameter"),
    ("/api/v1/runs?workspace=acme%00/support", "invalid_parameter"),
    ("/api/v1/runs/run_a?workspace=acme/sup%00port", "invalid_parameter"),
    ("/api/v1/runs/run_a/events?after=1%00", "invalid_parameter"),
    ("/api/v1/runs/run_a/tool-calls?status=a%00", "invalid_parameter"),
    ("/api/v1/usage?workspace=%00", "invalid_parameter"),
    ("/api/v1/reexecutions?status=%00", "invalid_parameter"),
    ("/api/v1/artifacts/sha256:%00", "invalid_parameter"),
    # integers past a bigint
    ("/api/v1/runs/run_a/events?after=99999999999999999999", "invalid_parameter"),
    ("/api/v1/runs/run_a/stream?after=99999999999999999999", "invalid_parameter"),
    ("/api/v1/runs/run_a/events?after=-1", "invalid_parameter"),
    # ids with a trailing newline
    ("/api/v1/runs/run_a%0A", "invalid_run_id"),
    ("/api/v1/runs/run_a%0A/events", "invalid_run_id"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "code"), API_GETS)
def test_bad_query_is_an_api_error_never_a_500(api: Client, url: str, code: str | None) -> None:
    response = api.get(url)
    _assert_api_error(response, 400, code)


def _append(events: list[dict[str, Any]], **extra: Any) -> bytes:
    return json.dumps({"events": events, **extra}).encode()


API_POSTS = [
    (
        "/api/v1/runs/run_b/events",
        _append([{"type": "RunStarted\u0000", "payload": {"workflowVersionId": "w"}}]),
        "invalid_event",
    ),
    ("/api/v1/runs/run_b/events", _append([{**started(), "idempotencyKey": "k\u0000"}]), "invalid_event"),
    ("/api/v1/runs/run_b/events", _append([{**started(), "occurrenceId": "o\u0000"}]), "invalid_event"),
    ("/api/v1/runs/run_b/events", _append([started(note="a\u0000b")]), "invalid_event"),
    ("/api/v1/runs/run_b/events", _append([started(**{"k\u0000": 1})]), "invalid_event"),
    ("/api/v1/runs/run_b/events", _append([started(deep={"x": ["\u0000"]})]), "invalid_event"),
    ("/api/v1/runs/run_b/events", _append([started()], fencingToken="\u0000"), "invalid_event"),
    (
        "/api/v1/runs/run_b/events",
        b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "deep": '
        + _deep(DEEP).encode()
        + b"}}]}",
        "invalid_event",
    ),
    ("/api/v1/runs/run_b/events", b'{"events": ' + _deep(DEEP).encode() + b"}", "invalid_event"),
    ("/api/v1/runs/run_a/feedback", json.dumps({"rating": 3, "comment": "a\u0000b"}).encode(), "invalid_request"),
    ("/api/v1/runs/run_a/feedback", json.dumps({"rating": 3, "category": "\u0000"}).encode(), "invalid_request"),
    ("/api/v1/runs/run_a/feedback", b'{"rating": 3, "comment": ' + _deep(DEEP).encode() + b"}", "invalid_request"),
    (
        "/api/v1/runs/run_a/tool-calls",
        json.dumps({"callId": "c1", "toolName": "t", "args": {"q": "\u0000"}, "effect": "read", "owner": "w"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/tool-calls",
        json.dumps({"callId": "c\u0000", "toolName": "t", "args": {}, "effect": "read", "owner": "w"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/tool-calls",
        json.dumps({"callId": "c1", "toolName": "t\u0000", "args": {}, "effect": "read", "owner": "w"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/tool-calls",
        json.dumps({"callId": "c1\n", "toolName": "t", "args": {}, "effect": "read", "owner": "w"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/tool-calls",
        b'{"callId": "c1", "toolName": "t", "effect": "read", "owner": "w", "args": ' + _deep(DEEP).encode() + b"}",
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/tool-calls/c1/complete",
        json.dumps({"leaseToken": "x", "result": "\u0000"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/reexecutions",
        json.dumps({"mode": "simulate", "reason": "r\u0000"}).encode(),
        "invalid_request",
    ),
    (
        "/api/v1/runs/run_a/reexecutions",
        json.dumps({"mode": "fork", "reason": "r", "input": {"a": "\u0000"}, "fromStep": "s"}).encode(),
        "invalid_request",
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "body", "code"), API_POSTS)
def test_bad_body_is_an_api_error_never_a_500(api: Client, url: str, body: bytes, code: str | None) -> None:
    response = api.post(url, data=body, content_type="application/json")
    _assert_api_error(response, 400, code)
    assert api.get("/api/v1/runs/run_b").status_code == 404
    assert api.get("/api/v1/runs/run_a").json()["eventCount"] == 2


CONSOLE_GETS = [
    "/w/acme/support/?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": 1e400}),
    "/w/acme/support/?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": 10**30}),
    "/w/acme/support/?cursor=" + _cursor(_deep(DEEP).encode()),
    "/w/acme/support/?cursor=" + _cursor({"t": "9999-12-31T23:59:59.999999-23:59", "id": 1}),
    "/w/acme/support/?to=9999-12-31",
    "/w/acme/support/?from=9999-12-31",
    "/w/acme/support/?to=0001-01-05",
    "/w/acme/support/?from=0001-01-01&to=0001-01-01",
    "/w/acme/support/?model=*&from=9999-12-31",
    "/w/acme/support/?model=*&to=0001-01-01",
    "/w/acme/support/?q=a%00b",
    "/w/acme/support/?workflow=%00",
    "/w/acme/support/?model=a/%00",
    "/w/acme/support/usage/?to=9999-12-31",
    "/w/acme/support/usage/?from=9999-12-31&to=9999-12-31",
    "/w/acme/support/usage/?to=0001-01-05",
    "/w/acme/support/usage/?from=0001-01-01&to=0001-01-01",
    "/w/acme/support/usage/?from=0001-01-01&to=9999-12-31",
    "/w/acme/support/usage/?scope=%00",
    "/t/acme/audit/?to=9999-12-31",
    "/t/acme/audit/?from=0001-01-01&to=0001-01-01",
    "/t/acme/audit/?actor=%00",
    "/t/acme/audit/?cursor=" + _cursor(_deep(DEEP).encode()),
    "/t/acme/audit/?cursor=" + _cursor({"t": "2026-01-01T00:00:00+00:00", "id": 10**30}),
    "/w/acme/support/runs/run_a/?q=%00",
    "/w/acme/support/runs/run_a/?type=%00",
    "/w/acme/support/runs/run_a/?step=%00",
    "/w/acme/support/runs/run_a/?workspace=%00",
    "/w/acme/support/runs/run_a/waterfall/rows/?from=0001-01-01T00:00:00&to=9999-12-31T23:59:59",
    "/w/acme/support/runs/run_a/waterfall/rows/?from=%00&to=%00",
    "/w/acme/support/approvals/?status=%00",
    "/w/acme/support/runs/run_a/?after=99999999999999999999",
    "/w/acme/support/runs/run_a/timeline/rows/?after=99999999999999999999",
    "/w/acme/support/runs/run_a/steps/?start=99999999999999999999",
]


T = "2026-01-01T00:00:00+00:00"
# Positions sealed for the list they are sent to, so that what they hold is what is refused:
# (path, the list's cursor kind, what it is of, a position we could give out, ones we could not).
SEALED = [
    (
        "/api/v1/runs",
        "runs",
        "workspace",
        {"t": T, "id": 1},
        [
            {"t": T, "id": 1e400},
            b'{"t": "2026-01-01T00:00:00+00:00", "id": Infinity}',
            b'{"t": "2026-01-01T00:00:00+00:00", "id": NaN}',
            {"t": T, "id": 10**30},
            {"t": T, "id": True},
            {"t": "9999-12-31T23:59:59.999999-23:59", "id": 1},
            {"t": "0001-01-01T00:00:00+23:59", "id": 1},
            _deep(DEEP).encode(),
            b'{"t": ' + _deep(DEEP).encode() + b', "id": 1}',
            [1, 2],
        ],
    ),
    ("/api/v1/usage", "usage", "workspace", {"o": 0}, [{"o": 1e400}, {"o": 10**30}, _deep(DEEP).encode()]),
    ("/api/v1/runs/run_a/tool-calls", "tool-calls", "run", {"after": 0}, [{"after": 1e400}, {"after": 10**30}]),
    ("/api/v1/reexecutions", "reexecutions", "workspace", {"after": 0}, [{"after": 10**30}, {"after": -1}]),
    ("/w/acme/support/", "page:runs", "workspace", {"t": T, "id": 1}, [{"t": T, "id": 1e400}, {"t": T, "id": 10**30}]),
    (
        "/w/acme/support/",
        "page:runs",
        "workspace",
        {"t": T, "id": 1},
        [{"t": "9999-12-31T23:59:59.999999-23:59", "id": 1}],
    ),
    ("/t/acme/audit/", "page:audit", "tenant", {"t": T, "id": 1}, [_deep(DEEP).encode(), {"t": T, "id": 10**30}]),
]


def _sealed(position: Any, kind: str, scope: Model) -> str:
    return cursors.seal(
        position if isinstance(position, bytes) else json.dumps(position).encode(), kind=kind, scope=scope
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "kind", "of", "good", "bad"), [(*case[:4], bad) for case in SEALED for bad in case[4]]
)
def test_a_sealed_cursor_holding_what_we_never_give_out_is_a_400(
    client: Client, admin, workspace, path: str, kind: str, of: str, good: Any, bad: Any
) -> None:
    """What a cursor holds is checked after it is opened too (a key can leak): a 400, never a 500."""
    append(workspace=workspace, run_id="run_a", events=[started()])
    scope = {"workspace": workspace, "tenant": workspace.tenant, "run": Run.objects.get(run_id="run_a")}[of]
    if path.startswith("/api/"):
        _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
        client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)
    else:
        client.force_login(admin)
        client.raise_request_exception = False
    assert client.get(path, {"cursor": _sealed(good, kind, scope)}).status_code == 200  # the list's own kind
    response = client.get(path, {"cursor": _sealed(bad, kind, scope)})
    if path.startswith("/api/"):
        _assert_api_error(response, 400, "invalid_cursor")
    else:
        assert response.status_code == 400, response.content[:300]


@pytest.mark.django_db
@pytest.mark.parametrize("url", CONSOLE_GETS)
def test_bad_query_is_a_console_400_never_a_500(console: Client, url: str) -> None:
    response = console.get(url)
    assert response.status_code == 400, response.content[:300]


OVER_A_THOUSAND = "&".join(f"p{n}=1" for n in range(1001))


@pytest.mark.django_db
def test_over_a_thousand_query_parameters_is_an_api_error(api: Client) -> None:
    body = _assert_api_error(api.get(f"/api/v1/runs?{OVER_A_THOUSAND}"), 400, "invalid_parameter")
    assert "1,000 query parameters" in body["error"]["message"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path", ["/api/v1/runs?status=running&status=failed", "/api/v1/runs?limit=5&sort=cost&limit=500"]
)
def test_a_query_parameter_given_twice_is_an_api_error(api: Client, path: str) -> None:
    """Every API parameter takes one value: the last of two would answer another question."""
    body = _assert_api_error(api.get(path), 400, "invalid_parameter")
    name = "status" if "status" in path else "limit"
    assert body["error"]["details"] == {"parameter": name} and "more than once" in body["error"]["message"]
    assert api.get(path.split("&")[0]).status_code == 200


@pytest.mark.django_db
def test_over_a_thousand_query_parameters_is_the_consoles_styled_400(console: Client) -> None:
    page = console.get(f"/w/acme/support/?{OVER_A_THOUSAND}")
    assert page.status_code == 400 and b'data-status="400"' in page.content


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["get", "post"])
def test_a_host_not_allowed_is_an_api_error_under_api(api: Client, method: str) -> None:
    response = getattr(api, method)("/api/v1/runs", HTTP_HOST="evil.example")
    _assert_api_error(response, 400, "invalid_request")


CONSOLE_POSTS = [
    ("/w/acme/support/runs/run_a/feedback/", {"rating": "3", "comment": "a\u0000b"}),
    ("/w/acme/support/runs/run_a/feedback/", {"rating": "3", "category": "\u0000"}),
    ("/w/acme/support/runs/run_a/tool-calls/c1/reconcile/", {"outcome": "succeeded", "note": "n\u0000"}),
    (
        "/w/acme/support/runs/run_a/tool-calls/c1/reconcile/",
        {"outcome": "succeeded", "note": "n", "value": json.dumps({"a": "\u0000"})},
    ),
    (
        "/w/acme/support/runs/run_a/tool-calls/c1/reconcile/",
        {"outcome": "succeeded", "note": "n", "value": _deep(DEEP)},
    ),
    ("/w/acme/support/runs/run_a/tool-calls/c1%0A/reconcile/", {"outcome": "succeeded", "note": "n"}),
    ("/w/acme/support/runs/run_a/reexecute/", {"mode": "simulate", "reason": "r\u0000"}),
    ("/w/acme/support/runs/run_a/reexecute/", {"mode": "fork", "reason": "r", "fromStep": "s", "input": _deep(DEEP)}),
    (
        "/w/acme/support/runs/run_a/reexecute/",
        {"mode": "fork", "reason": "r", "fromStep": "s", "input": json.dumps({"a": "\u0000"})},
    ),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("url", "data"), CONSOLE_POSTS)
def test_bad_form_is_a_console_400_never_a_500(console: Client, url: str, data: dict[str, str]) -> None:
    response = console.post(url, data=data)
    assert response.status_code in (400, 404), (response.status_code, response.content[:300])
    assert console.get("/w/acme/support/runs/run_a/").status_code == 200


@pytest.mark.django_db
def test_a_nul_names_the_event_and_field(api: Client) -> None:
    body = _append([started(), ev("StepScheduled", stepPath="s", notes=["ok", "a\u0000b"])])
    error = _assert_api_error(
        api.post("/api/v1/runs/run_b/events", data=body, content_type="application/json"), 400, "invalid_event"
    )["error"]
    assert error["details"] == {"index": 1, "field": "payload.notes.1"}


@pytest.mark.django_db
def test_the_depth_limit_is_exact(api: Client) -> None:
    """MAX_JSON_DEPTH counts the whole body: {events: [{payload: {deep: …}}]} is four levels."""

    def body(depth: int) -> bytes:
        return (
            b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "deep": '
            + _deep(depth - 4).encode()
            + b"}}]}"
        )

    refused = api.post("/api/v1/runs/run_b/events", data=body(MAX_JSON_DEPTH + 1), content_type="application/json")
    assert _assert_api_error(refused, 400, "invalid_event")["error"]["details"] == {"limit": MAX_JSON_DEPTH}
    accepted = api.post("/api/v1/runs/run_b/events", data=body(MAX_JSON_DEPTH), content_type="application/json")
    assert accepted.status_code == 200, accepted.content
    # Brackets inside strings are text, not depth.
    text = api.post(
        "/api/v1/runs/run_c/events",
        content_type="application/json",
        data=_append([started(text="[" * 5000 + "{" * 5000)]),
    )
    assert text.status_code == 200, text.content


@pytest.mark.django_db
def test_the_write_path_refuses_nul_whoever_calls_it(workspace) -> None:
    for events, field in [
        ([{"type": "RunStarted\u0000", "payload": {}}], "type"),
        ([{**started(), "idempotencyKey": "\u0000"}], "idempotencyKey"),
        ([started(x={"y\u0000": 1})], "payload.x.y\u0000"),
    ]:
        with pytest.raises(InvalidEvent) as refused:
            append(workspace=workspace, run_id="run_n", events=events)
        assert refused.value.details["field"] == field
    assert not Run.objects.filter(run_id="run_n").exists()


@pytest.mark.parametrize("run_id", ["run_a\n", "run_a\r\n", "\nrun_a", "run_a\x00"])
def test_a_run_id_must_match_whole(run_id: str) -> None:
    with pytest.raises(InvalidRunId):
        validate_run_id(run_id)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("after", ["99999999999999999999", "-1", "x"])
def test_a_socket_after_no_sequence_is_refused(admin, append, after: str) -> None:
    append("run_a", started())
    session = session_id(admin)

    async def scenario() -> tuple[bool, Any]:
        comm = communicator(f"/ws/runs/run_a/?after={after}", session)
        connected, code = await comm.connect(timeout=TIMEOUT_S)
        await comm.disconnect()
        return connected, code

    assert async_to_sync(scenario)() == (False, 4400)


@pytest.mark.django_db
def test_a_malformed_after_is_refused_even_beside_a_last_event_id(api: Client) -> None:
    response = api.get("/api/v1/runs/run_a/stream?after=abc", HTTP_LAST_EVENT_ID="1")
    assert _assert_api_error(response, 400, "invalid_parameter")["error"]["details"] == {"parameter": "after"}


@pytest.mark.django_db
def test_a_key_asked_for_a_role_is_told_which_in_plain_words(api: Client) -> None:
    # (on its own workspace's run: a request or run it cannot see is 404 before anything is asked)
    body = _assert_api_error(api.post("/api/v1/runs/run_a/tool-calls/c1/reconcile"), 403)
    assert "needs an operator in a console session" in body["error"]["message"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "path",
    [
        "/ws/runs/%00/",
        "/ws/runs/run_a/?workspace=acme%00/support",
        "/ws/runs/run_x%00/?workspace=acme/support",
        "/ws/runs/run_a/?workspace=%00",
        "/ws/runs/run_a/?after=1%00",
        "/ws/workspaces/acme%00/support/runs/",
        "/ws/workspaces/acme/support/runs/?x=%00",
    ],
)
def test_a_nul_in_a_sockets_path_or_query_is_refused_like_any_refused_handshake(admin, append, path: str) -> None:
    """PostgreSQL cannot take U+0000 in a parameter: looked up, it failed the handshake with an
    error (a 500 and a traceback under Daphne)."""
    append("run_a", started())
    session = session_id(admin)

    async def scenario() -> tuple[bool, Any]:
        comm = communicator(path, session)
        connected, code = await comm.connect(timeout=TIMEOUT_S)
        await comm.disconnect()
        return connected, code

    # The refusal any refused handshake gets (channels' WebsocketDenier: a close, 403 under Daphne).
    assert async_to_sync(scenario)() == (False, 1000)


@pytest.mark.django_db
@pytest.mark.parametrize("call_id", [["a", "b"], {"id": "a"}])
def test_a_call_id_that_is_not_a_string_is_data_unless_the_type_says_string(api: Client, call_id: Any) -> None:
    """Where the vocabulary does not list `callId` (custom types, a step, a model call's request)
    it is data like any other field; once it failed the projection (an unhashable list) with a 500."""
    for item in [
        ev("custom.note", callId=call_id),
        ev("StepScheduled", stepPath="t", callId=call_id),
        ev("harness.model.called", turn=1, promptHash="h", request={}, callId=call_id),
    ]:
        response = api.post("/api/v1/runs/run_a/events", data=_append([item]), content_type="application/json")
        assert response.status_code == 200, response.content[:300]
    started_tool = ev("harness.tool_call.started", callId=call_id, caller="model", toolName="lookup", args={})
    before = Run.objects.get(run_id="run_a").last_sequence
    refused = api.post("/api/v1/runs/run_a/events", data=_append([started_tool]), content_type="application/json")
    assert _assert_api_error(refused, 400, "invalid_event")["error"]["details"] == {
        "index": 0,
        "field": "payload.callId",
    }
    assert Run.objects.get(run_id="run_a").last_sequence == before
