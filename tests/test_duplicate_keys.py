"""A JSON body whose object names a key twice is refused, 400 `invalid_json` naming the key
(`invalid_otlp` on the OTLP endpoint, whose code that is for a body that is not JSON), and nothing
is written: a proxy or validator that keeps the first value would approve another document than
the one stored (docs/api.md § Conventions). The parsers keep the last value silently, so the
check is ours: ledger.limits.may_repeat_a_key on orjson's path, the stdlib's hook otherwise."""

from __future__ import annotations

import io
import json
import random
from typing import Any

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from console.api.fastjson import BadBody, JsonParser
from ledger.limits import may_repeat_a_key
from ledger.models import Event, Run, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started


@pytest.fixture
def api(workspace: Workspace, append: Any) -> Client:
    append("run_dup", started())
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _refused(response: Any, key: str, code: str = "invalid_json") -> None:
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == code, error
    assert error["details"]["key"] == key
    assert key in error["message"]


@pytest.mark.django_db
def test_the_audits_batch_is_refused_naming_the_key_and_nothing_is_written(api: Client) -> None:
    """The last `events` would have won: custom.y stored where a first-key reader saw custom.x."""
    body = b'{"events": [{"type": "custom.x", "payload": {"a": 1, "a": 2}}], "events": [{"type": "custom.y"}]}'
    response = api.post("/api/v1/runs/run_dup/events", data=body, content_type="application/json")
    _refused(response, "a")  # the first object closed that repeats a key
    assert Run.objects.get(run_id="run_dup").last_sequence == 1
    assert list(Event.objects.filter(run__run_id="run_dup").values_list("type", flat=True)) == ["RunStarted"]


BODIES = [
    # (path, body, the key named)
    ("runs/run_dup/events", b'{"events": [{"type": "custom.x", "payload": {"a": 1, "a": 1}}]}', "a"),
    ("runs/run_dup/events", b'{"events": [{"type": "custom.x", "type": "custom.y"}]}', "type"),
    ("runs/run_dup/feedback", b'{"rating": 5, "rating": 1}', "rating"),
    ("runs/run_dup/cancel", b'{"reason": "a", "reason": "b"}', "reason"),
    ("runs/run_dup/tool-calls", b'{"callId": "c", "toolName": "t", "args": {"x": {"y": 1, "y": 2}}}', "y"),
    # A colon written as an escape, which re-encoding writes plainly: the counts alone would agree.
    ("runs/run_dup/events", b'{"events": [{"type": "custom.x", "payload": {"s": "\\u003a", "a": 1, "a": 2}}]}', "a"),
    ("runs/run_dup/events", b'{"events": [{"type": "custom.x", "payload": {"s": "\\u003A", "a": 1, "a": 2}}]}', "a"),
    # Bodies only the stdlib reads: an integer past 64 bits, a lone surrogate.
    (
        "runs/run_dup/events",
        b'{"events": [{"type": "custom.x", "payload": {"n": 184467440737095516160, "n": 1}}]}',
        "n",
    ),
    ("runs/run_dup/events", b'{"events": [{"type": "custom.x", "payload": {"s": "\\ud800", "s": "x"}}]}', "s"),
    # Keys that differ only in how they are written are the same key.
    ("runs/run_dup/feedback", b'{"rating": 5, "\\u0072ating": 1}', "rating"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body", "key"), BODIES)
def test_a_repeated_key_anywhere_in_any_body_is_refused(api: Client, path: str, body: bytes, key: str) -> None:
    before = Event.objects.count()
    _refused(api.post(f"/api/v1/{path}", data=body, content_type="application/json"), key)
    assert Event.objects.count() == before


@pytest.mark.django_db
def test_a_body_in_another_charset_is_held_to_the_same_rule(api: Client) -> None:
    body = '{"rating": 5, "rating": 1}'  # the test client encodes it in the charset named
    _refused(
        api.post("/api/v1/runs/run_dup/feedback", data=body, content_type="application/json; charset=utf-16"), "rating"
    )


@pytest.mark.django_db
def test_an_otlp_json_body_with_a_repeated_key_is_refused(api: Client) -> None:
    body = b'{"resourceSpans": [], "resourceSpans": []}'
    _refused(
        api.post("/api/v1/otlp/v1/traces", data=body, content_type="application/json"), "resourceSpans", "invalid_otlp"
    )


@pytest.mark.django_db
def test_keys_repeated_in_different_objects_are_fine(api: Client) -> None:
    body = b'{"events": [{"type": "custom.x", "payload": {"a": 1, "b": {"a": 2}}}, {"type": "custom.x", "payload": {"a": 3}}]}'
    assert api.post("/api/v1/runs/run_dup/events", data=body, content_type="application/json").status_code == 200


# --- the parser, over any document ---------------------------------------------------------------

_keys = st.sampled_from(["a", "b", "c:d", "é", ":"])
_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.sampled_from(["", "x:y", ":", "é"]))
# Objects as lists of pairs, so that a key may come twice.
_documents = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4).map(lambda items: ("array", items)),
        st.lists(st.tuples(_keys, children), max_size=4).map(lambda pairs: ("object", pairs)),
    ),
    max_leaves=25,
)


def _write(document: Any, rng: random.Random) -> str:
    """JSON text, each string written plainly or with its colons and non-ASCII escaped."""
    if isinstance(document, tuple) and document[0] == "array":
        return "[" + ", ".join(_write(item, rng) for item in document[1]) + "]"
    if isinstance(document, tuple):
        return "{" + ", ".join(f"{_string(k, rng)}: {_write(v, rng)}" for k, v in document[1]) + "}"
    return _string(document, rng) if isinstance(document, str) else json.dumps(document)


def _string(text: str, rng: random.Random) -> str:
    written = json.dumps(text, ensure_ascii=rng.random() < 0.5)
    return written.replace(":", rng.choice(["\\u003a", "\\u003A", ":"]))


def _repeats(document: Any) -> bool:
    if isinstance(document, tuple) and document[0] == "array":
        return any(_repeats(item) for item in document[1])
    if isinstance(document, tuple):
        keys = [k for k, _ in document[1]]
        return len(set(keys)) < len(keys) or any(_repeats(v) for _, v in document[1])
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents, st.randoms(use_true_random=False))
def test_the_parser_refuses_a_document_exactly_when_an_object_repeats_a_key(document: Any, rng: random.Random) -> None:
    body = _write(document, rng).encode()
    parse = lambda: JsonParser().parse(io.BytesIO(body), "application/json", {"encoding": "utf-8"})  # noqa: E731
    if _repeats(document):
        with pytest.raises(BadBody) as refused:
            parse()
        assert refused.value.code == "invalid_json"
    else:
        assert parse() == json.loads(body)


def test_the_quick_check_clears_a_body_without_repeats_and_never_one_with() -> None:
    plain = b'{"a": {"b": "x:y"}, "c": [1, {"d": ":"}]}'
    assert not may_repeat_a_key(plain, json.loads(plain))
    repeated = b'{"a": 1, "a": 2}'
    assert may_repeat_a_key(repeated, json.loads(repeated))
    escaped = b'{"s": "\\u003a", "a": 1, "a": 2}'  # a colon the re-encoding adds makes up for the key lost
    assert may_repeat_a_key(escaped, json.loads(escaped))
