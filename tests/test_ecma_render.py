"""console.api.fastjson.ecma_numbers_in: the evidence, replay plan and state answers' numbers
respelt in ECMAScript form, every other byte kept (tests/test_api_wire.py reads them over HTTP)."""

from __future__ import annotations

import json

import orjson
import pytest

from console.api.fastjson import ecma_numbers_in
from ledger.canonical import ecma_dumps

VALUE = {
    "a": 5e-7,
    "b": 1e20,
    "c": 1e21,
    "d": -0.0,
    "e": 1.0,
    "f": [1e-6, 0.5, 100, 1.05, 2.0, 1e16, 9007199254740993],
    "s": 'x":1e20, [1.0, \\ "1e-6',
    "t": "2026-12-05T17:10:21.0Z sha256:3e4f",
    "n": {"deep": [[-1e-7]]},
}


@pytest.mark.backend_independent
def test_orjsons_and_pythons_numbers_are_respelt_as_ecma_dumps_writes_them() -> None:
    expected = ecma_dumps(VALUE)
    assert b'"b":100000000000000000000' in expected and b'"c":1e+21' in expected
    assert ecma_numbers_in(orjson.dumps(VALUE)) == expected
    assert ecma_numbers_in(json.dumps(VALUE, separators=(",", ":"), ensure_ascii=False).encode()) == expected
    indented = ecma_numbers_in(json.dumps(VALUE, indent=4).encode())
    assert json.loads(indented) == json.loads(expected)
    assert orjson.dumps(orjson.loads(indented)) == orjson.dumps(orjson.loads(expected))
    for written in (b'"c": 1e+21,', b'"d": 0,', b'"e": 1,', b"        0.000001,", b'"s": "x\\":1e20, [1.0'):
        assert written in indented, written


@pytest.mark.backend_independent
def test_text_without_such_numbers_is_kept_as_it_is() -> None:
    plain = orjson.dumps({"a": 1, "b": [0.5, 1.05, "1.0", "1e20"], "c": 'q":1.0,'})
    assert ecma_numbers_in(plain) is plain
