"""How the append and the reads speak on the wire, through httpx into Django's whole request
handling (tests/conftest.py `http_client`): the append's NDJSON answer, `Content-Encoding` on
`/events`, one writing of a stored event's numbers on every read, `Accept` on the evidence zip,
the append's control fields (docs/api.md § Runs and events, § Conventions)."""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger.models import Event, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, started

pytestmark = pytest.mark.django_db(transaction=True)

V1 = "/api/v1"


@pytest.fixture
def api(workspace: Workspace) -> Iterator[httpx.Client]:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    with http_client(headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def post(
    api: httpx.Client, run_id: str, *events: dict[str, Any], body: dict[str, Any] | None = None, **kwargs: Any
) -> httpx.Response:
    """POST the batch `events` (with `body`'s other fields); `kwargs` go to httpx (headers, params)."""
    return api.post(f"{V1}/runs/{run_id}/events", json={"events": list(events), **(body or {})}, **kwargs)


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["code"] == code, body
    return body


# --- F3: the append answers NDJSON one envelope per line ---------------------------------------


@pytest.mark.parametrize("how", [{"headers": {"Accept": "application/x-ndjson"}}, {"params": {"format": "ndjson"}}])
def test_the_append_answers_ndjson_one_envelope_per_line(api: httpx.Client, how: dict[str, Any]) -> None:
    assert post(api, "run_a", started()).status_code == 200
    batch = [{**ev("custom.a", n=1), "idempotencyKey": "a"}, ev("custom.b", n=2)]
    answer = post(api, "run_a", *batch, **how)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.text.endswith("\n")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert [(e["sequence"], e["type"], e["replayed"]) for e in lines] == [
        (2, "custom.a", False),
        (3, "custom.b", False),
    ]
    assert answer.headers["x-last-sequence"] == "3"
    again = post(api, "run_a", batch[0], **how)  # a replay: the stored envelope, one line
    assert [json.loads(line)["replayed"] for line in again.text.splitlines()] == [True]
    assert again.headers["x-last-sequence"] == "3"
    read = api.get(f"{V1}/runs/run_a/events?after=1", headers={"Accept": "application/x-ndjson"})
    assert [json.loads(line)["eventId"] for line in read.text.splitlines()] == [e["eventId"] for e in lines]
    refused = post(api, "run_a", started(), **how)  # errors stay the JSON envelope
    error(refused, 409, "run_already_started")
    assert Event.objects.filter(run__run_id="run_a").count() == 3


# --- F10: the evidence zip honours Accept ---------------------------------------------------------


def test_the_evidence_zip_answers_406_to_an_accept_without_zip(api: httpx.Client, workspace: Workspace) -> None:
    assert post(api, "run_z", started()).status_code == 200
    url = f"{V1}/runs/run_z/evidence.zip"
    for accept in ("application/json", "text/html", "application/zip;q=0"):
        refused = error(api.get(url, headers={"Accept": accept}), 406, "not_acceptable")
        assert refused["message"]
    with http_client() as anonymous:  # refused before the credentials are looked at
        error(anonymous.get(url, headers={"Accept": "application/json"}), 406, "not_acceptable")
        error(anonymous.get(url), 401, "unauthenticated")
    for accept in ("application/zip", "application/*", "*/*", "text/html,application/xhtml+xml,*/*;q=0.8", None):
        answer = api.get(url, headers={"Accept": accept} if accept else {})
        assert answer.status_code == 200, (accept, answer.text)
        assert answer.headers["content-type"] == "application/zip" and answer.content.startswith(b"PK")
    error(api.get(f"{V1}/runs/run_nope/evidence.zip", headers={"Accept": "application/zip"}), 404, "not_found")


# --- F11: the append's control fields -------------------------------------------------------------


@pytest.mark.parametrize("expected", [2**63, 2**70, 10**30])
def test_an_expected_sequence_past_64_bits_is_bad_input_not_a_conflict(api: httpx.Client, expected: int) -> None:
    assert post(api, "run_e", started()).status_code == 200
    body = {"events": [ev("custom.x")], "expectedSequence": expected}
    details = error(api.post(f"{V1}/runs/run_e/events", json=body), 400, "invalid_event")["details"]
    assert details == {"field": "expectedSequence", "limit": 2**63 - 1}
    highest = {"events": [ev("custom.x")], "expectedSequence": 2**63 - 1}  # in range: a conflict
    assert error(api.post(f"{V1}/runs/run_e/events", json=highest), 409, "sequence_conflict")["details"] == {
        "expected": 2**63 - 1,
        "actual": 1,
    }
    assert Event.objects.filter(run__run_id="run_e").count() == 1


def test_a_fencing_token_on_a_run_never_leased_is_not_said_to_be_held(api: httpx.Client, workspace: Workspace) -> None:
    from ledger.log.leases import acquire_run_lease, release_run_lease

    assert post(api, "run_f", started()).status_code == 200
    for token in (5, "abc", "0"):
        refused = error(post(api, "run_f", ev("custom.x"), body={"fencingToken": token}), 409, "fenced")
        assert "not leased" in refused["message"] and "another executor" not in refused["message"]
        assert refused["details"] == {"runId": "run_f", "leased": False}
    first = acquire_run_lease(workspace=workspace, run_id="run_f", owner="one")
    release_run_lease(workspace=workspace, lease=first)
    second = acquire_run_lease(workspace=workspace, run_id="run_f", owner="two")
    stale = error(post(api, "run_f", ev("custom.x"), body={"fencingToken": first.fencing_token}), 409, "fenced")
    assert "another executor holds it" in stale["message"] and stale["details"] == {"runId": "run_f", "leased": True}
    held = error(post(api, "run_f", ev("custom.x")), 409, "fenced")  # no token while leased
    assert "leased to two" in held["message"] and held["details"] == {"runId": "run_f", "leased": True}
    release_run_lease(workspace=workspace, lease=second)  # a stale token, and nobody holds the run now
    after = error(post(api, "run_f", ev("custom.x"), body={"fencingToken": first.fencing_token}), 409, "fenced")
    assert "not leased now" in after["message"] and "another executor" not in after["message"]
    assert after["details"] == {"runId": "run_f", "leased": False}
    assert post(api, "run_f", ev("custom.x"), body={"fencingToken": second.fencing_token}).status_code == 200
    assert Event.objects.filter(run__run_id="run_f").count() == 2


# --- F4: Content-Encoding on /events --------------------------------------------------------------


def _raw(api: httpx.Client, run_id: str, body: bytes, encoding: str | None) -> httpx.Response:
    headers = {"Content-Type": "application/json"}
    if encoding is not None:
        headers["Content-Encoding"] = encoding
    return api.post(f"{V1}/runs/{run_id}/events", content=body, headers=headers)


@pytest.mark.parametrize(
    "encoding, squeeze",
    [
        ("gzip", gzip.compress),
        ("GZip", gzip.compress),
        ("gzip", lambda data: gzip.compress(data[:10]) + gzip.compress(data[10:])),  # two members
        ("deflate", zlib.compress),
        ("identity", lambda data: data),
    ],
)
def test_a_compressed_append_is_inflated_as_otlp_is(api: httpx.Client, encoding: str, squeeze: Any) -> None:
    body = json.dumps({"events": [started(), ev("custom.packed", n=1)]}).encode()
    answer = _raw(api, "run_c", squeeze(body), encoding)
    assert answer.status_code == 200, answer.text
    assert [e["type"] for e in answer.json()["events"]] == ["RunStarted", "custom.packed"]
    assert Event.objects.filter(run__run_id="run_c").count() == 2


def test_a_compressed_append_is_refused_as_otlp_refuses(api: httpx.Client) -> None:
    assert post(api, "run_c", started()).status_code == 200
    body = json.dumps({"events": [ev("custom.x")]}).encode()
    for encoding in ("br", "compress", "gzip, br"):  # never read as if it were plain
        assert error(_raw(api, "run_c", body, encoding), 415, "unsupported_media_type")["details"] == {
            "field": "Content-Encoding"
        }
    packed = gzip.compress(body)
    for broken in (body, packed[:-12], packed + b"trailing"):
        assert error(_raw(api, "run_c", broken, "gzip"), 400, "invalid_json")["details"] == {
            "field": "Content-Encoding"
        }
    assert error(_raw(api, "run_c", zlib.compress(body)[:-3], "deflate"), 400, "invalid_json")
    # 11 MiB once inflated, a few kilobytes on the wire: 413, counted on the inflated body.
    bomb = b'{"events": [{"type": "custom.x", "payload": {"pad": "' + b" " * (11 * 1024 * 1024) + b'"}}]}'
    squeezed = gzip.compress(bomb)
    assert len(squeezed) < 64 * 1024
    assert error(_raw(api, "run_c", squeezed, "gzip"), 413, "payload_too_large")["details"] == {
        "limit": 10 * 1024 * 1024
    }
    deep = gzip.compress(b'{"events": [{"type": "custom.x", "payload": ' + b"[" * 70 + b"]" * 70 + b"}]}")
    assert error(_raw(api, "run_c", deep, "gzip"), 400, "invalid_event")["details"]["limit"] == 64
    assert Event.objects.filter(run__run_id="run_c").count() == 1


def test_other_json_bodies_are_inflated_too(api: httpx.Client) -> None:
    """The parser inflates for every JSON body of the API, not /events alone."""
    assert post(api, "run_c", started()).status_code == 200
    url = f"{V1}/runs/run_c/feedback"
    packed = gzip.compress(json.dumps({"rating": 4}).encode())
    answer = api.post(url, content=packed, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert answer.status_code == 201, answer.text
    assert answer.json()["rating"] == 4
    plain = json.dumps({"rating": 4}).encode()
    refused = api.post(url, content=plain, headers={"Content-Type": "application/json", "Content-Encoding": "br"})
    error(refused, 415, "unsupported_media_type")


# --- F9: one stored event, written one way by every read ------------------------------------------

# Sent with its keys out of order, and numbers that Python, orjson and ECMAScript spell differently.
NUMBERS = (
    b'{"z": 1, "a": 5e-7, "b": 1e21, "c": -0.0, "d": 1.0, "e": 100.0, "f": 1152921504606847000, "g": 0.1,'
    b' "h": 123456789012345680000, "i": 1e20, "j": 1e-6, "m": {"y": 2.50, "x": [1E2, -5e-324]}}'
)


def _numbers_batch(key: str) -> bytes:
    return b'{"events": [{"type": "custom.n", "idempotencyKey": "%s", "payload": %s}]}' % (key.encode(), NUMBERS)


def _sse(api: httpx.Client, url: str) -> str:
    with api.stream("GET", url, headers={"Accept": "text/event-stream"}) as response:
        assert response.status_code == 200
        return "".join(response.iter_text())


# In process, WSGI reads the finished run's stream whole (Django warns that it does): the frames
# are the subject here; tests/test_stream.py streams through Daphne.
@pytest.mark.filterwarnings("ignore:StreamingHttpResponse must consume asynchronous iterators")
def test_a_stored_event_is_written_alike_by_the_append_and_every_read(
    api: httpx.Client, workspace: Workspace, member: Any
) -> None:
    from asgiref.sync import async_to_sync

    from tests.live_support import TIMEOUT_S, communicator, session_id

    assert post(api, "run_n", started()).status_code == 200
    json_headers = {"Content-Type": "application/json"}
    echoed = api.post(f"{V1}/runs/run_n/events", content=_numbers_batch("n1"), headers=json_headers)
    assert echoed.status_code == 200, echoed.text
    stored = Event.objects.get(run__run_id="run_n", sequence=2).payload
    # The stored text is RFC 8785: numbers in ECMAScript form, keys sorted.
    assert stored == (
        '{"a":5e-7,"b":1e+21,"c":0,"d":1,"e":100,"f":1152921504606847000,"g":0.1,"h":123456789012345680000,'
        '"i":100000000000000000000,"j":0.000001,"m":{"x":[100,-5e-324],"y":2.5},"z":1}'
    )
    written = f'"payload":{stored}'
    ndjson = {"Accept": "application/x-ndjson"}
    replayed = api.post(f"{V1}/runs/run_n/events", content=_numbers_batch("n1"), headers=json_headers)
    assert replayed.json()["events"][0]["replayed"] is True
    assert post(api, "run_n", {"type": "RunCompleted", "payload": {}}).status_code == 200  # the stream ends
    bodies = {
        "append": echoed.text,
        "append as NDJSON": api.post(
            f"{V1}/runs/run_n/events", content=_numbers_batch("n1"), headers={**json_headers, **ndjson}
        ).text,
        "replay": replayed.text,
        "events": api.get(f"{V1}/runs/run_n/events?after=1").text,
        "events as NDJSON": api.get(f"{V1}/runs/run_n/events?after=1", headers=ndjson).text,
        "export": api.get(f"{V1}/export/events?runId=run_n").text,
        "stream": _sse(api, f"{V1}/runs/run_n/stream?after=1"),
    }
    for name, body in bodies.items():
        assert written in body, (name, body)
    assert json.loads(echoed.text)["events"][0]["payload"] == json.loads(stored)

    session = session_id(member)

    async def pushed() -> str:  # the console's live view: the row it pushes shows the stored numbers
        comm = communicator("/ws/runs/run_n/?after=1&workspace=acme/support", session)
        assert (await comm.connect(timeout=TIMEOUT_S))[0]
        message = await comm.receive_json_from(timeout=TIMEOUT_S)
        await comm.disconnect()
        return str(message["html"])

    row = async_to_sync(pushed)()
    # Only the payload's block: the row's time stamp (e.g. "17:45:11.064") may hold "1.0" itself.
    shown = row[row.index('<pre class="mono json">') :]
    shown = shown[: shown.index("</pre>")]
    for number in ("5e-7", "1e+21", "123456789012345680000", "100000000000000000000", "0.000001", "-5e-324"):
        assert number in shown, (number, shown)
    for python in ("5e-07", "-0.0", "1.0", "100.0", "e+20", "1e-06", "2.5e"):
        assert python not in shown, (python, shown)


# --- a pure replay past the rate limit ------------------------------------------------------------


def test_a_pure_replay_past_the_rate_limit_answers_200(workspace: Workspace, settings: Any, clock: Any) -> None:
    """docs/api.md: 200 also when every event was a replay; the limit counts events appended."""
    settings.LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY = 4
    clock.moment = clock.moment.replace(second=0, microsecond=0)
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    with http_client(headers={"Authorization": f"Bearer {key}"}) as harness:
        batch = [{**ev("custom.a", n=1.5), "idempotencyKey": "a"}, {**ev("custom.b"), "idempotencyKey": "b"}]
        first = post(harness, "run_r", {**started(), "idempotencyKey": "s"}, *batch)
        assert first.status_code == 200, first.text
        assert post(harness, "run_r", ev("custom.c")).status_code == 200  # the minute's 4 events
        error(post(harness, "run_r", ev("custom.d")), 429, "rate_limited")  # a new event: refused
        again = post(harness, "run_r", *batch)  # the retry of a batch that landed
        assert again.status_code == 200, again.text
        assert [(e["sequence"], e["replayed"]) for e in again.json()["events"]] == [(2, True), (3, True)]
        assert again.json()["lastSequence"] == 4
        assert again.json()["events"] == [{**e, "replayed": True} for e in first.json()["events"][1:]]
        as_ndjson = post(harness, "run_r", batch[0], headers={"Accept": "application/x-ndjson"})
        assert as_ndjson.status_code == 200 and json.loads(as_ndjson.text)["replayed"] is True
        # Anything that would write stays refused: a key not logged, an event without a key.
        error(post(harness, "run_r", batch[0], {**ev("custom.e"), "idempotencyKey": "e"}), 429, "rate_limited")
        error(post(harness, "run_r", batch[0], ev("custom.e")), 429, "rate_limited")
        # A key sent with another event is the append's conflict, and a stale expectedSequence
        # does not refuse a replay (as under the limit).
        changed = {**ev("custom.a", n=2), "idempotencyKey": "a"}
        error(post(harness, "run_r", changed), 409, "idempotency_conflict")
        stale = post(harness, "run_r", *batch, body={"expectedSequence": 1})
        assert stale.status_code == 200 and stale.json()["events"][0]["replayed"] is True
        error(post(harness, "run_nope", *batch), 429, "rate_limited")  # no such run: nothing to replay
        assert Event.objects.filter(run__run_id="run_r").count() == 4
        clock.advance(60)  # the next minute: the refused event goes in
        assert post(harness, "run_r", ev("custom.d")).json()["lastSequence"] == 5


# --- token counts are whole ------------------------------------------------------------------------


def _responded(call: str, usage: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "harness.model.responded",
        "payload": {
            "turn": 1,
            "callId": call,
            "model": {"provider": "openai", "modelId": "gpt-4o"},
            "response": {"usage": usage},
        },
    }


@pytest.mark.parametrize(
    "event, field",
    [
        (_responded("c", {"inputTokens": 1.5, "outputTokens": 2}), "payload.response.usage.inputTokens"),
        (
            _responded("c", {"inputTokens": 1, "outputTokens": 2, "reasoningTokens": 0.25}),
            "payload.response.usage.reasoningTokens",
        ),
        (
            _responded("c", {"inputTokens": 3, "outputTokens": 2, "inputTokenDetails": {"cacheReadTokens": 0.5}}),
            "payload.response.usage.inputTokenDetails.cacheReadTokens",
        ),
        (
            {
                "type": "ModelCallCompleted",
                "payload": {"stepPath": "s", "usage": {"inputTokens": 1, "outputTokens": 2.5}},
            },
            "payload.usage.outputTokens",
        ),
    ],
)
def test_a_fractional_token_count_is_refused(api: httpx.Client, event: dict[str, Any], field: str) -> None:
    assert post(api, "run_t", started()).status_code == 200
    refused = error(post(api, "run_t", ev("custom.before"), event), 400, "invalid_event")
    assert refused["details"] == {"index": 1, "field": field}
    assert "not a whole number of tokens" in refused["message"]
    assert Event.objects.filter(run__run_id="run_t").count() == 1
    assert api.get(f"{V1}/runs/run_t").json()["usage"]["inputTokens"] == 0


def test_an_integral_double_is_a_whole_count(api: httpx.Client) -> None:
    """SDKs that count in floats send 12.0: taken, and stored as 12."""
    assert post(api, "run_t", started()).status_code == 200
    body = (
        b'{"events": [{"type": "harness.model.responded", "payload": {"turn": 1, "callId": "c",'
        b' "model": {"provider": "openai", "modelId": "gpt-4o"},'
        b' "response": {"usage": {"inputTokens": 12.0, "outputTokens": 3e0, "cachedInputTokens": 2.0}}}}]}'
    )
    answer = api.post(f"{V1}/runs/run_t/events", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert '"usage":{"cachedInputTokens":2,"inputTokens":12,"outputTokens":3}' in answer.text
    usage = api.get(f"{V1}/runs/run_t").json()["usage"]
    assert (usage["inputTokens"], usage["outputTokens"], usage["cachedInputTokens"]) == (12, 3, 2)


# --- a sub-run written before its parent ----------------------------------------------------------


def test_a_sub_run_before_its_parent_is_taken_and_rerooted_when_the_parent_starts(
    api: httpx.Client, workspace: Workspace, other_workspace: Workspace
) -> None:
    """A client's outbox or spool may deliver a sub-run's RunStarted before its parent's, and
    `ledger import-little` imports in id order: the named parent is taken for the root until it
    starts, then its runs below take its root; `ledger verify` agrees all along."""
    from ledger.log.verify import verify_run
    from ledger.models import Run

    def root(run_id: str) -> Any:
        return api.get(f"{V1}/runs/{run_id}").json()["rootRunId"]

    assert post(api, "run_grandchild", started(parentRunId="run_child")).status_code == 200
    assert root("run_grandchild") == "run_child"  # its parent's id, the parent not being there
    assert post(api, "run_child", started(parentRunId="run_top")).status_code == 200
    assert root("run_child") == "run_top" and root("run_grandchild") == "run_top"
    assert post(api, "run_top", started()).status_code == 200
    assert (root("run_top"), root("run_child"), root("run_grandchild")) == (None, "run_top", "run_top")
    assert [r["runId"] for r in api.get(f"{V1}/runs/run_top/children").json()["runs"]] == ["run_child"]
    for run in Run.objects.filter(workspace=workspace):
        assert all(check.status == "pass" for check in verify_run(run)), (run.run_id, verify_run(run))
    # Another workspace's run named as the parent is no run of this one: nothing of it is read.
    _, key = create_key(workspace=other_workspace, scopes=["ingest", "read"])
    with http_client(headers={"Authorization": f"Bearer {key}"}) as theirs:
        assert post(theirs, "run_theirs", started(parentRunId="run_top")).status_code == 200
        assert theirs.get(f"{V1}/runs/run_theirs").json()["rootRunId"] == "run_top"
        error(theirs.get(f"{V1}/runs/run_top"), 404, "not_found")
    assert root("run_grandchild") == "run_top"  # untouched by the other workspace


# --- the evidence, the replay plan and the state write numbers in ECMAScript form -----------------

# A string that holds what looks like numbers keeps them as they are.
ECMA_OUTPUT = b'{"a": 5e-7, "b": 1e20, "c": 1e21, "d": -0.0, "e": 1.0, "f": 1e-6, "g": 2.50, "h": "q\\":1.0,[1e20"}'
ECMA_WRITTEN = '{"a":5e-7,"b":100000000000000000000,"c":1e+21,"d":0,"e":1,"f":0.000001,"g":2.5,"h":"q\\":1.0,[1e20"}'


def test_the_evidence_the_replay_plan_and_the_state_write_numbers_in_ecmascript_form(api: httpx.Client) -> None:
    assert post(api, "run_e", started()).status_code == 200
    steps = (
        b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": "s"}},'
        b' {"type": "StepAttemptStarted", "payload": {"stepPath": "s", "attempt": 1}},'
        b' {"type": "StepCompleted", "payload": {"stepPath": "s", "attempt": 1, "output": %s}}]}' % ECMA_OUTPUT
    )
    sent = api.post(f"{V1}/runs/run_e/events", content=steps, headers={"Content-Type": "application/json"})
    assert sent.status_code == 200, sent.text
    for read in ("evidence", "replay-plan", "state"):
        for headers in ({}, {"Accept": "application/json; indent=4"}):
            body = api.get(f"{V1}/runs/run_e/{read}", headers=headers)
            assert body.status_code == 200, (read, body.text)
            unspaced = re.sub(r"\s+", "", body.text)  # indented or not, the same tokens (no space in "h")
            assert f'"output":{ECMA_WRITTEN}' in unspaced, (read, headers, body.text)
            outside_h = body.text.replace('q\\":1.0,[1e20', "")
            numbers = re.findall(r"[:\[,]\s*(-?\d[\d.]*(?:[eE][-+]?\d+)?)(?=[,\]}\s])", outside_h)
            assert numbers and "5e-7" in numbers, (read, numbers)
            for number in numbers:  # none as orjson or Python writes it (1e20, 1e21, 1e-06, -0.0, 1.0)
                assert not re.search(r"\.0$|e\d|e-0|^-0$|E", number), (read, number)
