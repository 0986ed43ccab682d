"""An append prepares a plain payload in one walk (ledger.log.redaction.Redactor.plain: redaction, the
recorded-cost rule and the canonical fast path's conditions together) and any other payload in
the three walks it always took. Both must store exactly what the three walks store and refuse
exactly what they refuse, with the same error: checked here for arbitrary JSON against the three
walks written out (validate_payload, redact, canonical_bytes), with and without workspace rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.canonical import NotCanonicalizable, canonical_bytes
from ledger.errors import InvalidEvent, LedgerError
from ledger.log.prepare import item as _prepare
from ledger.log.redaction import NotPlain, Redactor
from ledger.log.vocabulary import validate_payload

pytestmark = pytest.mark.backend_independent

_tricky_text = st.sampled_from(
    [
        "",
        "x",
        "\x00",
        "\ud800",
        "é",
        "\U0001f600",
        "a=b",
        "k: v",
        "Bearer abcdefghijklmnop1234",
        "sk-proj-4f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c",
        "AKIAIOSFODNN7EXAMPLE",
        "postgres://app:hunter2@db/app",
        "password=hunter2",
        "ticket-4711",
        "short",
        "x" * 20,
    ]
)
_text = st.one_of(st.text(max_size=10), _tricky_text)
# Key names: ordinary, secret, the ones the walk treats specially, and ones outside the BMP.
_keys = st.one_of(
    st.text(max_size=6),
    st.sampled_from(
        [
            "usage",
            "costUsd",
            "apiKey",
            "password",
            "token",
            "maxTokens",
            "inputTokens",
            "note",
            "\U0001f600",
            "\U00010000a",
            "ticket",
            "X-Api-Key",
        ]
    ),
)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    _text,
    st.integers(min_value=-(2**53) - 2, max_value=2**53 + 2),
    st.sampled_from([2**64, -(2**70)]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=2).map(tuple),
        st.dictionaries(_keys, children, max_size=4),
    ),
    max_leaves=25,
)
_payloads = st.dictionaries(_keys, _json, max_size=5)

_REDACTORS = (Redactor(), Redactor(["ticket"], [r"ticket-\d+"]))


def _three_walks(index: int, payload: Any, redact: Redactor) -> tuple[Any, bytes]:
    """What an append did before the one walk (ledger/log/append.py at 9a3c648)."""
    try:
        validate_payload(index, "custom.x", payload)
        payload = redact(payload)
    except RecursionError:
        raise InvalidEvent(f"event {index}: payload is nested too deeply", index=index, field="payload") from None
    try:
        canonical = canonical_bytes(payload)
    except NotCanonicalizable as exc:
        raise InvalidEvent(
            f"event {index}: payload has no canonical JSON form: {exc}", index=index, field="payload"
        ) from exc
    return payload, canonical


def _outcome(call: Any) -> Any:
    try:
        return call()
    except LedgerError as exc:
        return (type(exc), exc.message, exc.details)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_payloads)
def test_one_walk_stores_and_refuses_as_three_walks(payload: dict[str, Any]) -> None:
    for redact in _REDACTORS:
        expected = _outcome(lambda: _three_walks(3, payload, redact))
        got = _outcome(lambda: _prepare(3, {"type": "custom.x", "payload": payload}, redact))
        if isinstance(expected, tuple) and len(expected) == 3 and isinstance(expected[0], type):
            assert got == expected
        elif isinstance(got, tuple):
            # The three walks accepted it; the append may still refuse NUL characters after them.
            assert b"\\u0000" in expected[1] and "NUL" in got[1]
        else:
            assert (got.payload, got.canonical) == expected


@pytest.mark.parametrize(
    "payload",
    [
        {"a": 1.5},
        {"n": 2**53},
        {"\U0001f600": 1},
        {"apiKey": {"nested": 1}},
        {"usage": {"costUsd": 1}},
        {"t": (1, 2)},
        {1: "x"},
    ],
)
def test_payloads_outside_the_one_walk_take_the_three(payload: dict[Any, Any]) -> None:
    with pytest.raises(NotPlain):
        Redactor().plain(payload)


def test_a_plain_payload_is_redacted_in_its_one_walk() -> None:
    payload = {
        "apiKey": "abc",
        "note": "password=hunter2",
        "list": ["Bearer abcdefghijklmnop1234", 1, None],
        "usage": {"inputTokens": 3},
    }
    assert Redactor().plain(payload) == Redactor()(payload)
