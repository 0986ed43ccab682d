from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from ledger.canonical import NotCanonicalizable, canonical_json, event_id

# The vectors Little Workflow's canonicalizer reproduces too (docs/design.md §3).
VECTORS_FILE = Path(__file__).resolve().parent / "data" / "vectors.json"
VECTORS = json.loads(VECTORS_FILE.read_text())


@pytest.mark.parametrize("vector", VECTORS["canonical"], ids=lambda v: v["canonical"][:24])
def test_canonical_strings_reproduce_byte_for_byte(vector: dict) -> None:
    text = canonical_json(vector["input"])
    assert text == vector["canonical"]
    if "sha256" in vector:
        assert hashlib.sha256(text.encode()).hexdigest() == vector["sha256"]


@pytest.mark.parametrize("vector", VECTORS["events"], ids=lambda v: v["eventId"])
def test_event_ids_reproduce(vector: dict) -> None:
    assert (
        event_id(
            run_id=vector["runId"],
            sequence=vector["sequence"],
            type=vector["type"],
            payload=vector["payload"],
            occurrence_id=vector.get("occurrenceId"),
        )
        == vector["eventId"]
    )


def test_number_formatting_is_ecmascript() -> None:
    assert canonical_json({"f": 1.5, "big": 1e21, "small": 1e-7, "neg0": -0.0, "one": 1.0}) == (
        '{"big":1e+21,"f":1.5,"neg0":0,"one":1,"small":1e-7}'
    )


def test_little_workflow_unicode_vector_v6() -> None:
    payload = {"note": "café € 😀", "f": 1.5, "big": 1e21, "small": 1e-7, "neg0": -0.0}
    assert event_id(run_id="run_u", sequence=1, type="RunStarted", payload=payload) == "evt_228d1a96a99223ee"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2**60])
def test_values_without_canonical_form_are_refused(value: object) -> None:
    with pytest.raises(NotCanonicalizable):
        canonical_json({"x": value})


def test_composed_request_digest_equals_digest_of_the_whole() -> None:
    from ledger.canonical import canonical_bytes, digest, request_digest_for_canonical

    payload = {"b": [1, 2.5, "é"], "a": {"😀": None}}
    for occurrence in (None, "occ_1"):
        whole = {"type": "StepScheduled", "payload": payload}
        if occurrence:
            whole["occurrenceId"] = occurrence
        assert request_digest_for_canonical(
            type="StepScheduled", payload_canonical=canonical_bytes(payload), occurrence_id=occurrence
        ) == digest(whole)
