"""The process-local state cache (ledger.log.states.STATES) is bounded by size, not only by runs:
a long run's state is compacted for the append path (its settled calls and cost entries left to
the database), and the cache holds at most its byte budget. Whatever it drops, the projections an
append writes stay equal to the fold of the log.

Transactional tests: the cache is filled only by commits. On SQLite every append takes the
locked path, on PostgreSQL the optimistic one first; both read the compacted state.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from ledger.fold import fold
from ledger.fold.pricing import prices_for
from ledger.log import append, states
from ledger.log.envelopes import log_of
from ledger.log.projection import differences
from ledger.log.states import STATES, AppendState
from ledger.models import Run, Workspace
from ledger.tenancy.services import bootstrap
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def ws() -> Workspace:
    return bootstrap(tenant="acme", workspace="support")


@pytest.fixture
def small_compaction(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Compact past 4 records, so that a few batches cross the line."""
    monkeypatch.setattr(states, "COMPACT_AT", 4)
    STATES.clear()
    yield
    STATES.clear()


def _equal_to_the_fold(ws: Workspace, run_id: str) -> None:
    run = Run.objects.get(workspace=ws, run_id=run_id)
    log = log_of(run)
    assert differences(run, fold(log, prices=prices_for(ws), run_id=run_id), log) == []


def _cached(ws: Workspace, run_id: str) -> Any:
    entry = STATES.take(ws.pk, run_id, prices_for(ws).version)
    assert entry is not None
    STATES.put(ws.pk, run_id, entry)
    return entry.state


def _called(call_id: str, turn: int) -> dict[str, Any]:
    return ev(
        "harness.model.called",
        turn=turn,
        callId=call_id,
        stepPath="s",
        promptHash=f"sha256:{turn:064x}",
        request={"messages": [{"role": "user", "content": f"turn {turn}"}]},
    )


def _answer(call_id: str, turn: int) -> dict[str, Any]:
    return ev(
        "harness.model.responded",
        turn=turn,
        callId=call_id,
        stepPath="s",
        model={"provider": "openai", "modelId": "gpt-4o-mini"},
        response={"text": f"answer {turn}", "usage": {"inputTokens": 100 + turn, "outputTokens": 7}},
    )


def _tool(kind: str, call_id: str, **payload: Any) -> dict[str, Any]:
    if kind == "started":
        payload = {"toolName": "lookup", "caller": "agent", "args": {}, **payload}
    elif kind in ("succeeded", "failed"):
        payload = {"durationMs": 5, **payload}
    return ev(f"harness.tool_call.{kind}", callId=call_id, stepPath="s", **payload)


@pytest.mark.parametrize("per_call", [1, 3])
def test_a_compacted_run_keeps_every_projection_equal_to_the_fold(
    ws: Workspace, small_compaction: None, per_call: int
) -> None:
    events = [
        started(),
        ev("StepScheduled", stepPath="s"),
        ev("StepAttemptStarted", stepPath="s", attempt=1),
        _tool("started", "t1", toolName="lookup", args={"id": 1}, caller="agent", turn=1),
        _called("m1", 1),
        _answer("m0", 0),
        _answer("mx", 9),
        _tool("started", "t2", toolName="refund", args={"amount": 12.5}, turn=2),
        _called("m2", 2),  # answered many batches later, after compactions
        _tool("started", "t3", toolName="lookup", args=None),
        _tool("succeeded", "t1", result={"name": "Acme"}, durationMs=12),  # settled after compaction
        _answer("m1", 1),
        _tool("in_doubt", "t2"),
        _tool("started", "t4", toolName="lookup", args={"id": 4}),
        _answer("m3", 3),
        _tool("reconciled", "t2", outcome="succeeded", result={"refunded": True}),
        _tool("failed", "t3", error={"message": "no"}),
        _tool("succeeded", "t1", result={"name": "Acme again"}),  # a call named once more
        _answer("m2", 2),
        _tool("started", "t5"),
        ev("StepCompleted", stepPath="s", attempt=1, output={"ok": True}),
        ev("RunCompleted", output={"done": True}),
    ]
    compacted = False
    for start in range(0, len(events), per_call):
        append(workspace=ws, run_id="run_long", events=events[start : start + per_call])
        _equal_to_the_fold(ws, "run_long")
        state = _cached(ws, "run_long")
        # Compacted whenever it reaches COMPACT_AT: what it holds between is the batches since.
        assert len(state.model_calls) + len(state.tool_calls) + len(state.cost_entries) < states.COMPACT_AT
        compacted = compacted or isinstance(state, AppendState)
    assert compacted
    run = Run.objects.get(workspace=ws, run_id="run_long")
    positions = dict(run.tool_calls.values_list("call_id", "position"))
    assert positions == {"t1": 0, "t2": 1, "t3": 2, "t4": 3, "t5": 4}
    assert run.cost_entries.count() == 5 and run.status == "completed"


@pytest.mark.parametrize("per_call", [1, 3])
def test_a_repeated_start_of_a_call_compaction_left_out(ws: Workspace, small_compaction: None, per_call: int) -> None:
    """An append takes a call its batch starts to be new without reading its row; the gateway
    re-claiming a call starts it again, and if compaction left that call out, the write must not
    hold on the guess (its started_sequence, its position and the positions after it would be
    wrong): the head update's guard sees the row and the locked path reads it."""
    events = [
        started(),
        ev("StepScheduled", stepPath="s"),
        ev("StepAttemptStarted", stepPath="s", attempt=1),
        _tool("started", "t1", args={"id": 1}, turn=1),
        _answer("m1", 1),
        _tool("started", "t2", turn=2),
        _answer("m2", 2),
        _answer("m3", 3),
        _tool("started", "t3", turn=3),
        _answer("m4", 4),
        _tool("started", "t1", args={"id": 1, "again": True}),  # re-claimed, long after compaction
        _tool("started", "t4"),  # new, after the repeated start: position 3
        _tool("started", "t2"),
        _tool("succeeded", "t2", result={"ok": 2}),  # again, and settled
        _tool("succeeded", "t1", result={"ok": 1}),
        _tool("started", "t5"),
        _answer("m5", 5),
        ev("StepCompleted", stepPath="s", attempt=1, output={"ok": True}),
    ]
    compacted_before_restart = False
    for start in range(0, len(events), per_call):
        batch = events[start : start + per_call]
        if any(e["payload"].get("args") == {"id": 1, "again": True} for e in batch):
            compacted_before_restart = "t1" not in _cached(ws, "run_again").tool_calls
        append(workspace=ws, run_id="run_again", events=batch)
        _equal_to_the_fold(ws, "run_again")
    assert compacted_before_restart
    run = Run.objects.get(workspace=ws, run_id="run_again")
    rows = {c: (p, s) for c, p, s in run.tool_calls.values_list("call_id", "position", "started_sequence")}
    assert rows == {"t1": (0, 4), "t2": (1, 6), "t3": (2, 9), "t4": (3, 12), "t5": (4, 16)}
    assert run.tool_calls.get(call_id="t1").args == {"id": 1, "again": True}


def test_a_long_runs_cached_state_stops_growing(ws: Workspace) -> None:
    STATES.clear()
    append(workspace=ws, run_id="run_grow", events=[started()])
    weights = []
    for batch in range(6):
        events = []
        for i in range(200):
            n = batch * 200 + i
            events += [_tool("started", f"t{n}", toolName="lookup", args={"n": n}), _answer(f"m{n}", n)]
        append(workspace=ws, run_id="run_grow", events=events)
        weights.append(states.weight(_cached(ws, "run_grow")))
    # 600 records a batch (a tool call, a model call, a cost entry each 200 times): the state is
    # compacted whenever it holds COMPACT_AT (1,000), down to its head and its step, however long
    # the run grows.
    assert weights == [602, 2, 602, 2, 602, 2]
    _equal_to_the_fold(ws, "run_grow")
    STATES.clear()


def test_the_cache_holds_its_byte_budget(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    STATES.clear()
    budget = STATES.budget
    STATES.budget = 12 * states.RECORD_BYTES  # 12 records
    try:
        for n in range(4):
            # A run of 5 records: head, step "s", a tool call, a model call, a cost entry (under COMPACT_AT).
            append(workspace=ws, run_id=f"run_w{n}", events=[started(), _tool("started", f"t{n}"), _answer(f"m{n}", 1)])
        assert STATES.held <= 12
        version = prices_for(ws).version
        kept = [n for n in range(4) if STATES.take(ws.pk, f"run_w{n}", version) is not None]
        assert kept == [2, 3]  # least recent out first: two of 5 records each fit in 12
        assert STATES.held == 0

        STATES.budget = 3 * states.RECORD_BYTES  # one run alone is over it: not kept at all
        append(workspace=ws, run_id="run_w0", events=[_answer("m9", 2)])
        assert STATES.take(ws.pk, "run_w0", version) is None and STATES.held == 0
        append(workspace=ws, run_id="run_w0", events=[_answer("m10", 3)])  # folds the log
        _equal_to_the_fold(ws, "run_w0")
    finally:
        STATES.budget = budget
        STATES.clear()
