"""The orjson fast path of ledger.canonical writes exactly what rfc8785 writes, for every value,
and refuses exactly what rfc8785 refuses. The vectors (test_canonical_vectors.py) go through the
same canonical_bytes."""

from __future__ import annotations

import enum
from typing import Any

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ledger.canonical import NotCanonicalizable, _orjson_is_canonical, canonical_bytes

pytestmark = pytest.mark.backend_independent

# Every code point, surrogates included (lone surrogates must be refused the same way), with extra
# weight on the places where escaping and ordering differ: controls, DEL, quotes, backslash, the
# line/paragraph separators, the private-use block above the surrogates, and the astral planes
# whose UTF-16 order differs from code-point order.
_tricky = st.sampled_from(
    [
        "\x00",
        "\x08",
        "\x0c",
        "\x1f",
        "\x7f",
        '"',
        "\\",
        "/",
        "\u2028",
        "\u2029",
        "\ue000",
        "\uffff",
        "\U00010000",
        "\U0001f600",
        "\ud800",
        "\udfff",
        "é",
    ]
)
_chars = st.one_of(st.characters(codec=None, min_codepoint=0, max_codepoint=0x10FFFF), _tricky)
_text = st.text(alphabet=_chars, max_size=12)
_numbers = st.one_of(
    st.integers(min_value=-(2**53) - 5, max_value=2**53 + 5),
    st.integers(),
    st.sampled_from([0, 1, -1, 2**53 - 1, -(2**53 - 1), 2**53, -(2**53), 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1.0, 1e21, 1e-7, 5e-324, 1.7976931348623157e308, 0.1, 100.0, 123456789.125]),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, _text)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(_text, children, max_size=5),
    ),
    max_leaves=40,
)


def _js_doubles(value: Any) -> Any:
    """An integer beyond ±(2**53 - 1) as the double it denotes when its digits are that double's
    shortest ECMAScript form (docs/design.md § 3, The event log: canonical JSON); any other stays, and rfc8785 refuses it."""
    if type(value) is int and abs(value) > 2**53 - 1:
        try:
            double = float(value)
        except OverflowError:
            return value
        return double if rfc8785.dumps(double) == str(value).encode() else value
    if isinstance(value, dict):
        return {k: _js_doubles(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_js_doubles(v) for v in value]
    return value


def _rfc8785(value: Any) -> bytes | None:
    try:
        return rfc8785.dumps(value)
    except rfc8785.IntegerDomainError:
        try:
            return rfc8785.dumps(_js_doubles(value))
        except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError, RecursionError):
            return None
    except (rfc8785.CanonicalizationError, TypeError, UnicodeEncodeError, RecursionError):
        return None


def _ours(value: Any) -> bytes | None:
    try:
        return canonical_bytes(value)
    except NotCanonicalizable:
        return None


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_fast_path_equals_rfc8785_for_arbitrary_json(value: Any) -> None:
    assert _ours(value) == _rfc8785(value)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(_text, st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1), max_size=8))
def test_keys_sort_by_utf16_code_units(value: dict[str, int]) -> None:
    assert _ours(value) == _rfc8785(value)


def test_astral_keys_sort_as_utf16_not_code_points() -> None:
    # U+1F600 is D83D DE00 in UTF-16, so it sorts before U+E000 there, after it by code point.
    value = {"\ue000": 1, "\U0001f600": 2}
    assert not _orjson_is_canonical(value)
    assert canonical_bytes(value) == rfc8785.dumps(value) == '{"\U0001f600":2,"\ue000":1}'.encode()


def test_values_the_fast_path_hands_on() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    for value in (1.0, 2**53, [1, 2.5], {"a": {"b": -(2**53)}}, Colour.RED, {"k": "\ud800"}):
        assert not _orjson_is_canonical(value) or _ours(value) is None
        assert _ours(value) == _rfc8785(value)


def test_deep_nesting_is_refused_not_crashed() -> None:
    value: Any = 0
    for _ in range(3000):
        value = [value]
    assert _ours(value) is None
