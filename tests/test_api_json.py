"""The API's JSON parser and renderer (console/api/fastjson.py) give what DRF's own give: the same
values in, the same bytes out (floats below 1e-4 aside: the same number, spelt orjson's way), and
the same 4xx error bodies for bad bodies, never a 500."""

from __future__ import annotations

import io
import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import pytest
from django.test import Client
from django.utils.translation import gettext_lazy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.renderers import JSONRenderer

from console.api.fastjson import BadBody, JsonParser, JsonRenderer
from ledger.limits import has_nul
from ledger.tenancy.services import create_key

_text = st.text(
    alphabet=st.one_of(
        st.characters(codec="utf-8"),
        st.sampled_from(["\x00", "\x1f", "\x7f", '"', "\\", "/", "\u2028", "\u2029", "\U0001f600", "é"]),
    ),
    max_size=10,
)
_numbers = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, -(2**63), 2**64 - 1, 2**64, -(2**63) - 1, 10**30]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, -0.0, 1e21, 1e-7, 2.5e-5, 5e-324, 0.1, 100.0]),
)
_json = st.recursive(
    st.one_of(st.none(), st.booleans(), _numbers, _text),
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(_text, children, max_size=5)),
    max_leaves=30,
)


def typed(value: Any) -> Any:
    """The value with every number tagged by its type, so 1 == 1.0 == True no longer holds."""
    if isinstance(value, dict):
        return [("dict", k, typed(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", *[typed(v) for v in value]]
    if isinstance(value, float):
        return ("float", math.copysign(1, value), value)
    return (type(value).__name__, value)


def drf_parse(body: bytes, encoding: str = "utf-8") -> Any:
    return JSONParser().parse(io.BytesIO(body), "application/json", {"encoding": encoding})


def our_parse(body: bytes, encoding: str = "utf-8") -> Any:
    return JsonParser().parse(io.BytesIO(body), "application/json", {"encoding": encoding})


def has_small_float(value: Any) -> bool:
    if isinstance(value, dict):
        return any(has_small_float(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_small_float(v) for v in value)
    return isinstance(value, float) and 0 < abs(value) < 1e-4


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_any_json_body_parses_to_the_same_value(value: Any) -> None:
    """The same value, or (ledger.limits) a refusal when a string holds a NUL character."""
    body = json.dumps(value, ensure_ascii=False).encode()
    if has_nul(value):
        with pytest.raises(BadBody) as refused:
            our_parse(body)
        assert refused.value.code == "invalid_request"
        return
    assert typed(our_parse(body)) == typed(drf_parse(body))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_any_response_renders_to_the_same_document(value: Any) -> None:
    value = {"data": value}  # a bare None renders as an empty body
    ours, drf = JsonRenderer().render(value), JSONRenderer().render(value)
    assert typed(json.loads(ours)) == typed(json.loads(drf))
    if not has_small_float(value):
        assert ours == drf


def test_what_orjson_does_not_know_is_written_as_drf_writes_it() -> None:
    value = {
        "cost": Decimal("0.0027"),
        "at": datetime(2026, 11, 30, 10, 0, 0, 123456, tzinfo=UTC),
        "lazy": gettext_lazy("run"),
        "raw": b"bytes",
        "tuple": (1, "\u2028"),
        "big": 2**70,
        "none": None,
    }
    assert JsonRenderer().render(value) == JSONRenderer().render(value)
    assert JsonRenderer().render(value, "application/json; indent=4") == JSONRenderer().render(
        value, "application/json; indent=4"
    )
    assert JsonRenderer().render(None) == b""
    deep: Any = []
    for _ in range(300):  # deeper than orjson writes
        deep = [deep]
    assert JsonRenderer().render(deep) == JSONRenderer().render(deep)


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"",
        b"[1,]",
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b"\xef\xbb\xbf{}",
        b'{"a": "\xff"}',
        b'{"a": "\x00"}',
        b'{"a": 1} x',
    ],
)
def test_a_body_that_is_not_json_fails_with_the_stdlib_message(body: bytes) -> None:
    with pytest.raises(ParseError) as drf:
        drf_parse(body)
    with pytest.raises(ParseError) as ours:
        our_parse(body)
    assert str(ours.value.detail) == str(drf.value.detail)


def test_what_only_the_stdlib_decodes_is_decoded_by_it() -> None:
    for body in (b'{"a": "\\ud800"}', b'{"a": 1e400}', b'{"a": 184467440737095516160}', b"[-9999999999999999999]"):
        assert typed(our_parse(body)) == typed(drf_parse(body))
    assert typed(our_parse('{"a": "é"}'.encode("latin-1"), "latin-1")) == typed(
        drf_parse('{"a": "é"}'.encode("latin-1"), "latin-1")
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        (b"{not json", 400, "invalid_json"),
        (b'{"events": [{"type": "RunStarted", "payload": {"n": NaN}}]}', 400, "invalid_json"),
        # Refused before parsing: deeper than ledger.limits.MAX_JSON_DEPTH.
        (
            b'{"events": [{"type": "RunStarted", "payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}]}",
            400,
            "invalid_event",
        ),
        (b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w\x00"}}]}', 400, "invalid_json"),
        (
            b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "n": 184467440737095516160}}]}',
            400,
            "invalid_event",
        ),
        (b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w\\ud800"}}]}', 400, "invalid_event"),
        (b"[]", 400, "invalid_request"),
        # Deeper than ledger.limits.MAX_JSON_DEPTH: refused before parsing.
        *(
            (
                b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "deep": '
                + b"[" * depth
                + b"]" * depth
                + b"}}]}",
                400,
                "invalid_event",
            )
            for depth in (61, 500, 1000)
        ),
        # A NUL character: PostgreSQL could not store it, so neither backend does.
        (b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w\\u0000"}}]}', 400, "invalid_event"),
    ],
)
def test_bad_bodies_get_the_error_body_never_a_500(workspace, body: bytes, status: int, code: str) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)
    response = client.post("/api/v1/runs/run_bad/events", data=body, content_type="application/json")
    assert (response.status_code, response["Content-Type"]) == (status, "application/json")
    assert response.json()["error"]["code"] == code
    assert client.get("/api/v1/runs/run_bad/events").status_code == 404  # nothing was written


@pytest.mark.django_db
def test_an_appended_batch_comes_back_as_drf_would_render_it(workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    events = [
        {"type": "RunStarted", "payload": {"workflowVersionId": "w", "text": "caf\u00e9 \u2028 \U0001f600", "f": 0.5}}
    ]
    response = client.post(
        "/api/v1/runs/run_ok/events", data=json.dumps({"events": events}), content_type="application/json"
    )
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    assert response.content == JSONRenderer().render(response.json())
    assert b"\\u2028" in response.content


_brackety_text = st.text(alphabet=st.sampled_from(['"', "\\", "[", "]", "{", "}", "a", "é", "\n", "/"]), max_size=12)
_brackety_json = st.recursive(
    st.one_of(st.none(), st.integers(), _brackety_text),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(_brackety_text, children, max_size=4)),
    max_leaves=40,
)


@settings(max_examples=500)
@given(_brackety_json, st.booleans(), st.integers(min_value=0, max_value=8))
def test_the_depth_of_valid_json_is_found_as_the_general_check_finds_it(
    value: Any, ascii_only: bool, limit: int
) -> None:
    """valid_json_too_deep (the parser's path for what orjson read) answers as json_depth_exceeds
    does, for strings full of quotes, backslashes and brackets, at every limit around the depth."""
    from console.api.fastjson import valid_json_too_deep
    from ledger.limits import json_depth_exceeds

    body = json.dumps(value, ensure_ascii=ascii_only).encode()
    assert valid_json_too_deep(body, limit) == json_depth_exceeds(body, limit)
    spaced = json.dumps(value, ensure_ascii=ascii_only, indent=1).encode()
    assert valid_json_too_deep(spaced, limit) == json_depth_exceeds(spaced, limit)


def _nested(depth: int, mixed: bool) -> Any:
    value: Any = "x"
    for level in range(depth):
        value = {"k": value, "[": "]"} if mixed and level % 2 else [value, "{"]
    return value


@pytest.mark.parametrize("mixed", [False, True])
@pytest.mark.parametrize("depth", range(10, 21))
def test_the_depth_of_deep_valid_json_is_found_around_the_peeling_passes(depth: int, mixed: bool) -> None:
    # valid_json_too_deep peels up to eight levels-or-pairs of levels off before it counts: at and
    # around that point (limits 14 to 18), and at the real limit, it answers as the general check.
    from console.api.fastjson import valid_json_too_deep
    from ledger.limits import json_depth_exceeds

    body = json.dumps({"events": [_nested(depth, mixed), _nested(depth // 2, not mixed)]}).encode()
    for limit in (*range(14, 19), 21, 64):
        assert valid_json_too_deep(body, limit) == json_depth_exceeds(body, limit), limit


@pytest.mark.parametrize(
    "body",
    [
        b'{"events": ' + b"[" * 64 + b"]" * 64 + b"}",
        b'{"events": [{"type": "x", "payload": {"s": "\\\\\\"[[[[", "t": ' + b"[" * 63 + b"]" * 63 + b"}}]}",
        b"[" * 65 + b"]" * 65,
        b"[" * 2000 + b"]" * 2000,  # beyond orjson's own limit: refused by the general check
        b"[" * 65,  # malformed: refused before the stdlib's parser sees it
    ],
)
def test_a_body_nested_too_deep_is_refused_whichever_parser_reads_it(body: bytes) -> None:
    from ledger.limits import json_depth_exceeds

    if json_depth_exceeds(body):
        with pytest.raises(BadBody) as refused:
            our_parse(body)
        assert refused.value.details == {"limit": 64}
    else:
        assert typed(our_parse(body)) == typed(drf_parse(body))
