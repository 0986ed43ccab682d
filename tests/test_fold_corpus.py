"""The fold against states frozen before its fast path (tests/data/fold/corpus.json).

Seeded logs over every event type, with odd and wrong-typed fields, priced, unpriced and dotted
models, replayed origins and token counts whose dollars round at 50 digits, plus bench/ingest.py's
mix and the shared vectors: folded whole, continued from every kind of split (`fold_into`, and
`advance` in place, as the append path does), each must give the frozen state, every `Decimal`
with the same digits and exponent (`to_json` alone would hide the exponent).
"""

from __future__ import annotations

import importlib.util
import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from ledger.fold import advance, apply_unchecked, fold, fold_into
from ledger.fold.pricing import load_default_prices
from ledger.fold.state import RunState

DATA = Path(__file__).parent / "data" / "fold"


@cache
def _corpus() -> list[dict[str, Any]]:
    cases: list[dict[str, Any]] = json.loads((DATA / "corpus.json").read_text())["cases"]
    return cases


def _frozen(state: RunState) -> dict[str, Any]:
    spec = importlib.util.spec_from_file_location("fold_corpus", DATA / "make_corpus.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    frozen: dict[str, Any] = module.frozen(state)
    return json.loads(json.dumps(frozen))  # the file's JSON: tuples as lists, as when it was written


def _dense(events: list[dict[str, Any]]) -> bool:
    return all(e.get("sequence") == i + 1 for i, e in enumerate(events))


@pytest.mark.parametrize("name", [case["name"] for case in _corpus()])
def test_fold_gives_the_frozen_state(name: str) -> None:
    case = next(c for c in _corpus() if c["name"] == name)
    events, table = case["events"], load_default_prices()
    if not _dense(events):
        state = apply_unchecked(RunState(run_id=events[0]["runId"]), events, table)
        assert _frozen(state) == case["expected"]
        return
    assert _frozen(fold(events, prices=table)) == case["expected"]
    for cut in sorted({1, 2, len(events) // 3, len(events) // 2, len(events) - 1}):
        if not 0 < cut < len(events):
            continue
        head = fold(events[:cut], prices=table)
        assert _frozen(fold_into(head, events[cut:], prices=table)) == case["expected"], cut
        # from the stored projection, as a rebuild of the tail does
        stored = RunState.from_json(json.loads(json.dumps(head.to_json())))
        resumed = fold_into(stored, events[cut:], prices=table)
        assert resumed.to_json() == case["expected"]["state"], cut
    state = RunState(run_id=events[0]["runId"])
    for start in range(0, len(events), 37):  # the append path: batches, in place
        advance(state, events[start : start + 37], prices=table)
    assert _frozen(state) == case["expected"]
    one = RunState(run_id=events[0]["runId"])
    for event in events:
        advance(one, [event], prices=table)
    assert _frozen(one) == case["expected"]


def test_the_builders_fill_every_field_as_the_class_does() -> None:
    from dataclasses import fields

    from ledger.fold.state import (
        CostEntry,
        ModelCall,
        ToolCallState,
        build_cost_entry,
        build_model_call,
        build_tool_call,
    )

    for cls, build in [(ModelCall, build_model_call), (CostEntry, build_cost_entry), (ToolCallState, build_tool_call)]:
        values = [f"v{i}" for i, _ in enumerate(fields(cls))]
        made, built = cls(*values), build(*values)
        assert type(built) is cls and built == made
        assert [getattr(built, f.name) for f in fields(cls)] == values
