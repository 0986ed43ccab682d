"""Hostile bodies at the write endpoints (issue 17's fuzzing): hypothesis throws arbitrary JSON and
JSON-like text at append, the tool gateway, feedback and re-execution requests through a real HTTP
client (httpx) into Django's whole request handling, in the test's process (the server that carries
the bytes is not the subject: tests/test_body_limit.py is Daphne's). Whatever comes in, the answer
is a 4xx with the error envelope of docs/api.md or a clean write — never a 500 — and the log is checked
after every example: a refusal wrote nothing, an acknowledged append wrote exactly what it
acknowledged, every run stays dense 1..N.

Bounded: FUZZ_EXAMPLES examples per endpoint (default 40). Raw texts cover what a JSON encoder
never produces: NaN/Infinity literals, lone surrogates, NUL, duplicate keys, nesting far past the
depth limit, megabyte strings, truncated and non-UTF-8 bodies.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from django.db.models import Count, Max
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.models import Event, Run, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, started

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
RUN = "run_fuzz"
V1 = "/api/v1"

# --- what is thrown ---------------------------------------------------------------------------

numbers = st.one_of(
    st.integers(),
    st.integers(min_value=2**53 - 2, max_value=2**70),
    st.integers(min_value=-(2**70), max_value=-(2**53)),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, -0.0, 1e308, 5e-324, 2**63, -(2**63) - 1]),
)
texts = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            "\x00",
            "a\x00b",
            "\ud800",
            "\udfff",
            "\U0001f600",
            "=cmd|' /C calc'!A0",
            "run_fuzz\n",
            "../../etc/passwd",
            " ",
            "null",
            "-1",
            "9" * 400,
        ]
    ),
)
leaves = st.one_of(st.none(), st.booleans(), numbers, texts)
json_values = st.recursive(
    leaves,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=20,
)

RAW = [
    b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": NaN}}]}',
    b'{"events": [{"type": "StepScheduled", "payload": {"x": Infinity}}]}',
    b'{"events": [{"type": "StepScheduled", "payload": {"x": -Infinity}}]}',
    b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": "\\ud800"}}]}',
    b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": "a\\u0000b"}}]}',
    b'{"events": [], "events": [{"type": "StepScheduled", "payload": {"stepPath": "dup"}}]}',
    b'{"rating": 5, "rating": "five"}',
    b'{"callId": "c", "callId": 1, "toolName": "t", "args": {}, "effect": "read", "owner": "o"}',
    b"[" * 100_000 + b"]" * 100_000,
    b'{"a":' * 5000 + b"1" + b"}" * 5000,
    b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": "' + b"x" * 1_048_576 + b'"}}]}',
    b'{"comment": "' + b"y" * 1_048_576 + b'", "rating": 3}',
    b'{"events": [{"type": "StepScheduled", "payload": {"n": 1e400}}]}',
    b'{"events": [{"type": "StepScheduled", "payload": {"n": 123456789012345678901234567890}}]}',
    b'{"events": [{"type": "StepSch',
    b"\xff\xfe{\x00}\x00",
    b"\x00",
    b"",
    b"null",
    b"[]",
    b'"events"',
    b"1e999999",
    b'{"events": [{"type": "StepScheduled", "payload": {"stepPath": "s"}}], "\\ud800": {"\\u0000": null}}',
]


def mutations(template: dict[str, Any]) -> st.SearchStrategy[Any]:
    """`template` with one place (a value anywhere, or the whole of it) replaced by arbitrary JSON,
    a key added or dropped: bodies that get past the first checks and reach the deeper ones."""
    paths: list[tuple[Any, ...]] = []

    def walk(value: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, (*path, k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, (*path, i))

    walk(template, ())

    def replace(value: Any, path: tuple[Any, ...], new: Any) -> Any:
        if not path:
            return new
        copy = dict(value) if isinstance(value, dict) else list(value)
        copy[path[0]] = replace(value[path[0]], path[1:], new)  # type: ignore[index]
        return copy

    def drop(value: Any, path: tuple[Any, ...]) -> Any:
        if not path:
            return value
        copy = dict(value) if isinstance(value, dict) else list(value)
        if len(path) == 1:
            del copy[path[0]]  # type: ignore[arg-type]
        else:
            copy[path[0]] = drop(value[path[0]], path[1:])  # type: ignore[index]
        return copy

    return st.one_of(
        st.builds(lambda p, new: replace(template, p, new), st.sampled_from(paths), json_values),
        st.builds(lambda p: drop(template, p), st.sampled_from(paths)),
        st.builds(lambda k, v: {**template, k: v}, texts, json_values),
    )


def bodies(template: dict[str, Any]) -> st.SearchStrategy[bytes]:
    def encode(value: Any) -> bytes:
        return json.dumps(value, allow_nan=True).encode()  # NaN/Infinity literals when a float is one

    return st.one_of(
        st.builds(encode, mutations(template)),
        st.builds(encode, json_values),
        st.sampled_from(RAW),
    )


# --- the log's invariants -----------------------------------------------------------------------


def log_state() -> tuple[int, dict[str, tuple[int, int, int]]]:
    """Total events, and per run (count, max sequence, run row's last_sequence)."""
    per_run = {
        row["run__run_id"]: (row["n"], row["top"])
        for row in Event.objects.values("run__run_id").annotate(n=Count("id"), top=Max("sequence"))
    }
    runs = {
        r.run_id: (per_run.get(r.run_id, (0, 0))[0], per_run.get(r.run_id, (0, 0))[1], r.last_sequence)
        for r in Run.objects.all()
    }
    return sum(n for n, _, _ in runs.values()), runs


def check_answer(response: httpx.Response, before: tuple[int, dict[str, Any]], body: bytes) -> None:
    status = response.status_code
    assert status < 500, f"{status} for {body[:300]!r}: {response.text[:500]}"
    after = log_state()
    for run_id, (count, top, last) in after[1].items():
        assert count == top == last, (
            f"run {run_id} is not dense after {body[:300]!r}: {count} events, max {top}, row {last}"
        )
    if status >= 400:
        error = response.json()["error"]
        assert isinstance(error["code"], str) and error["code"], response.text
        assert isinstance(error["message"], str) and error["message"], response.text
        assert isinstance(error["details"], dict), response.text
        assert after[0] == before[0], (
            f"a refused request ({status} {error['code']}) wrote {after[0] - before[0]} event(s)"
        )
    elif response.request.url.path.endswith("/events"):
        acknowledged = [e for e in response.json()["events"] if not e["replayed"]]
        assert after[0] - before[0] == len(acknowledged), "the log holds other than what was acknowledged"


@pytest.fixture
def post(workspace: Workspace, append: Callable[..., Any], admin: Any) -> Any:
    append(RUN, started(), ev("StepScheduled", stepPath="s"))
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    client = http_client(headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}, timeout=120)

    statuses: list[int] = []

    def send(path: str, body: bytes) -> None:
        before = log_state()
        response = client.post(path, content=body)
        statuses.append(response.status_code)
        check_answer(response, before, body)

    yield send
    client.close()
    print(
        f"fuzz: {len(statuses)} requests, {sum(s < 300 for s in statuses)} written, "
        f"{sum(400 <= s < 500 for s in statuses)} refused"
    )
    assert any(400 <= s < 500 for s in statuses)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))

APPEND = {"events": [{"type": "StepScheduled", "payload": {"stepPath": "fuzz"}}]}
CLAIM = {
    "callId": "c1",
    "toolName": "lookup",
    "args": {"q": 1},
    "idempotencyKey": "i1",
    "effect": "write",
    "timeoutS": 30,
    "owner": "fuzzer",
}
FEEDBACK = {"rating": 4, "category": "accuracy", "comment": "fine"}
REEXECUTE = {"mode": "simulate", "fromStep": "s", "input": {"a": 1}, "modelOverrides": {}, "reason": "fuzz"}
BATCH = {"runIds": [RUN], "reason": "fuzz", "modelOverrides": {}}


@FUZZ
@given(body=bodies(APPEND), fresh=st.booleans())
def _append(post: Any, body: bytes, fresh: bool) -> None:
    post(f"{V1}/runs/{'run_fuzz_new' if fresh else RUN}/events", body)


def test_append(post: Any) -> None:
    _append(post)


@FUZZ
@given(body=bodies(CLAIM))
def _claim(post: Any, body: bytes) -> None:
    post(f"{V1}/runs/{RUN}/tool-calls", body)


def test_gateway_claim(post: Any) -> None:
    _claim(post)


@FUZZ
@given(body=bodies({"leaseToken": "t", "result": {"ok": True}}), step=st.sampled_from(["outbound", "complete"]))
def _gateway_step(post: Any, body: bytes, step: str) -> None:
    post(f"{V1}/runs/{RUN}/tool-calls/c1/{step}", body)


def test_gateway_outbound_and_complete(post: Any) -> None:
    _gateway_step(post)


@FUZZ
@given(body=bodies(FEEDBACK))
def _feedback(post: Any, body: bytes) -> None:
    post(f"{V1}/runs/{RUN}/feedback", body)


def test_feedback(post: Any) -> None:
    _feedback(post)


@FUZZ
@given(body=st.one_of(bodies(REEXECUTE), bodies(BATCH)), batch=st.booleans())
def _reexecute(post: Any, body: bytes, batch: bool) -> None:
    post(f"{V1}/reexecutions/batches" if batch else f"{V1}/runs/{RUN}/reexecutions", body)


def test_reexecution_requests(post: Any) -> None:
    _reexecute(post)


ENDPOINTS = [
    f"{V1}/runs/{RUN}/events",
    f"{V1}/runs/run_fuzz_new/events",
    f"{V1}/runs/{RUN}/tool-calls",
    f"{V1}/runs/{RUN}/tool-calls/c1/outbound",
    f"{V1}/runs/{RUN}/tool-calls/c1/complete",
    f"{V1}/runs/{RUN}/feedback",
    f"{V1}/runs/{RUN}/reexecutions",
    f"{V1}/reexecutions/batches",
]


def test_every_raw_body_at_every_endpoint(post: Any) -> None:
    """The texts no encoder writes, each once at each endpoint (the examples above only sample them)."""
    for path in ENDPOINTS:
        for body in RAW:
            post(path, body)
