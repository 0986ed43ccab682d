from __future__ import annotations

import json
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.canonical import canonical_json, digest
from ledger.fold import (
    RunState,
    RunStateMismatch,
    fold,
    fold_into,
    next_visit_index,
)
from ledger.fold.pricing import Usage, load_default_prices
from tests.conftest import envelopes as stored_envelopes

RUN = "run_fold"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def envelopes(items: list[tuple[str, dict[str, Any]]], run_id: str = RUN, start: int = 1) -> list[dict[str, Any]]:
    return stored_envelopes(items, run_id=run_id, start=start)


def responded(step_path: str | None, usage: dict[str, Any], model: dict[str, str] = MINI, **extra: Any) -> tuple:
    payload: dict[str, Any] = {
        "turn": 1,
        "callId": extra.pop("callId", "mc_1"),
        "model": model,
        "response": {"text": "ok", "usage": usage},
        **extra,
    }
    if step_path is not None:
        payload["stepPath"] = step_path
    return ("harness.model.responded", payload)


WORKER_MANIFEST = {"harnessId": "h1", "stepPath": "extract", "workflowVersionId": "wfver_1", "tools": ["bash"]}

EVERY_TYPE: list[tuple[str, dict[str, Any]]] = [
    (
        "RunStarted",
        {
            "workflowVersionId": "wfver_1",
            "input": {"ticket": 7},
            "parentRunId": "run_parent",
            "outerLoopId": "ol_1",
            "label": "nightly",
            "tags": ["a", "b"],
            "replayOf": "run_original",
        },
    ),
    ("WorkflowVersionRegistered", {"workflowVersionId": "wfver_1", "workflowVersionHash": "sha256:x"}),
    ("StepScheduled", {"stepPath": "extract", "stepId": "extract"}),
    ("StepAttemptStarted", {"stepPath": "extract", "attempt": 1}),
    (
        "harness.session.started",
        {
            "stepPath": "extract",
            "role": "worker.ai-generate",
            "task": {"kind": "execute_step"},
            "manifest": WORKER_MANIFEST,
            "manifestHash": digest(WORKER_MANIFEST),
        },
    ),
    (
        "harness.model.called",
        {"stepPath": "extract", "turn": 1, "callId": "mc_1", "promptHash": "sha256:p", "request": {}, "origin": "live"},
    ),
    (
        "harness.model.responded",
        {
            "stepPath": "extract",
            "turn": 1,
            "callId": "mc_1",
            "model": MINI,
            "origin": "live",
            "response": {"text": "ok", "usage": {"inputTokens": 10_000, "outputTokens": 2_000}},
        },
    ),
    (
        "harness.tool_call.started",
        {
            "stepPath": "extract",
            "callId": "tc_1",
            "caller": "model",
            "turn": 1,
            "toolName": "bash",
            "args": {"cmd": "ls"},
        },
    ),
    (
        "harness.tool_call.succeeded",
        {"stepPath": "extract", "callId": "tc_1", "result": {"out": "a"}, "durationMs": 12},
    ),
    (
        "harness.tool_call.started",
        {"stepPath": "extract", "callId": "tc_2", "caller": "model", "turn": 1, "toolName": "http", "args": {}},
    ),
    (
        "harness.tool_call.failed",
        {"stepPath": "extract", "callId": "tc_2", "error": {"message": "502"}, "durationMs": 30},
    ),
    (
        "harness.tool_call.started",
        {"stepPath": "extract", "callId": "tc_3", "caller": "model", "turn": 2, "toolName": "pay", "args": {"eur": 5}},
    ),
    ("harness.tool_call.in_doubt", {"stepPath": "extract", "callId": "tc_3"}),
    (
        "harness.tool_call.reconciled",
        {
            "stepPath": "extract",
            "callId": "tc_3",
            "outcome": "succeeded",
            "result": {"paid": True},
            "note": "bank says yes",
        },
    ),
    ("harness.session.completed", {"stepPath": "extract", "usage": {"inputTokens": 10_000, "outputTokens": 2_000}}),
    (
        "ArtifactCreated",
        {
            "stepPath": "extract",
            "artifactRef": "artifact://art_1",
            "name": "profile",
            "contentType": "application/json",
        },
    ),
    (
        "StepCompleted",
        {
            "stepPath": "extract",
            "attempt": 1,
            "output": {"name": "Ada"},
            "outputRef": "artifact://art_2",
            "artifactRefs": ["artifact://art_1"],
        },
    ),
    (
        "ParallelGroupStarted",
        {"stepPath": "fan", "attempt": 1, "branchCount": 2, "maxConcurrency": 2, "failureMode": "fail_fast"},
    ),
    ("ParallelBranchScheduled", {"stepPath": "fan", "branchPath": "fan[a]", "itemKey": "a", "branchIndex": 0}),
    ("ParallelBranchScheduled", {"stepPath": "fan", "branchPath": "fan[b]", "itemKey": "b", "branchIndex": 1}),
    (
        "ParallelBranchCompleted",
        {"stepPath": "fan", "branchPath": "fan[a]", "outputRef": "artifact://art_3", "artifactRefs": []},
    ),
    (
        "ParallelBranchFailed",
        {"stepPath": "fan", "branchPath": "fan[b]", "error": {"message": "boom"}, "artifactRefs": []},
    ),
    ("ParallelGroupFailed", {"stepPath": "fan", "error": {"message": "branch failed"}}),
    ("harness.execute_step.started", {"stepPath": "notify", "uses": "tool.call"}),
    ("custom.note", {"stepPath": "ghost", "text": "hello"}),
    ("OuterLoopCycleCompleted", {"outerLoopId": "ol_1", "cycleNumber": 1, "supervise": {"kind": "continue"}}),
    ("OuterLoopCycleCompleted", {"outerLoopId": "ol_1", "cycleNumber": 1, "supervise": {"kind": "continue"}}),
    (
        "harness.session.started",
        {
            "role": "orchestrator",
            "task": {"kind": "orchestrate"},
            "manifest": {"o": 1},
            "manifestHash": digest({"o": 1}),
        },
    ),
    ("harness.model.called", {"turn": 1, "promptHash": "sha256:q", "request": {}}),
    ("harness.model.failed", {"turn": 1, "error": {"message": "overloaded"}, "durationMs": 5, "willRetry": False}),
    ("harness.session.failed", {"error": {"name": "ProviderError", "message": "overloaded"}}),
    ("RunFailed", {"error": {"name": "StepFailed", "message": "fan failed"}}),
]


def test_fold_understands_every_event_type() -> None:
    state = fold(envelopes(EVERY_TYPE))

    assert state.run_id == RUN
    assert state.status == "failed"
    assert state.started_at == "2026-11-02T10:00:01.000Z"
    assert state.finished_at == f"2026-11-02T10:00:{len(EVERY_TYPE):02d}.000Z"
    assert (state.workflow_version_id, state.parent_run_id, state.outer_loop_id) == ("wfver_1", "run_parent", "ol_1")
    assert (state.label, state.tags, state.replay_of, state.input) == (
        "nightly",
        ["a", "b"],
        "run_original",
        {"ticket": 7},
    )
    assert state.error == {"name": "StepFailed", "message": "fan failed"}
    assert state.last_sequence == state.event_count == len(EVERY_TYPE)
    assert state.custom_event_count == 1
    assert list(state.steps) == ["extract", "fan", "notify"]  # the custom event made no step

    extract = state.steps["extract"]
    assert extract.status == "completed"
    assert extract.step_id == "extract"
    assert [(a.attempt, a.status) for a in extract.attempts] == [(1, "completed")]
    assert (extract.output, extract.has_output, extract.output_ref) == ({"name": "Ada"}, True, "artifact://art_2")
    assert extract.artifact_refs == ["artifact://art_1", "artifact://art_2"]
    assert (extract.first_sequence, extract.last_sequence) == (3, 17)
    assert extract.usage.cost_usd == Decimal("0.0027")  # the session rollup added nothing
    assert state.steps["notify"].status == "scheduled"

    fan = state.parallel_groups["fan"]
    assert (fan.status, fan.branch_count, fan.failure_mode, fan.error) == (
        "failed",
        2,
        "fail_fast",
        {"message": "branch failed"},
    )
    assert [(b.branch_path, b.status, b.item_key, b.branch_index) for b in fan.branches.values()] == [
        ("fan[a]", "completed", "a", 0),
        ("fan[b]", "failed", "b", 1),
    ]
    assert fan.branches["fan[a]"].output_ref == "artifact://art_3"

    assert [(s.role, s.step_path, s.status) for s in state.sessions] == [
        ("worker.ai-generate", "extract", "completed"),
        ("orchestrator", None, "failed"),
    ]
    assert state.sessions[0].manifest_hash == digest(WORKER_MANIFEST)
    assert state.sessions[1].error == {"name": "ProviderError", "message": "overloaded"}

    first, second = state.model_calls
    assert (first.call_id, first.status, first.step_path, first.turn) == ("mc_1", "responded", "extract", 1)
    assert (first.provider, first.model_id, first.cost, first.origin) == (
        "openai",
        "gpt-4o-mini",
        Decimal("0.0027"),
        "live",
    )
    assert (first.called_sequence, first.responded_sequence, first.session) == (6, 7, 0)
    assert first.usage == Usage(input_tokens=10_000, output_tokens=2_000)
    assert (second.status, second.session, second.error) == ("failed", 1, {"message": "overloaded"})

    tools = state.tool_calls
    assert [(c.call_id, c.status, c.reconciled) for c in tools.values()] == [
        ("tc_1", "succeeded", False),
        ("tc_2", "failed", False),
        ("tc_3", "succeeded", True),
    ]
    assert (tools["tc_1"].result, tools["tc_1"].duration_ms, tools["tc_1"].tool_name) == ({"out": "a"}, 12, "bash")
    assert tools["tc_2"].error == {"message": "502"}
    assert (tools["tc_3"].result, tools["tc_3"].turn, tools["tc_3"].args) == ({"paid": True}, 2, {"eur": 5})

    assert list(state.artifacts) == ["artifact://art_1", "artifact://art_2", "artifact://art_3"]
    created = state.artifacts["artifact://art_1"]
    assert (created.name, created.content_type, created.created_sequence) == ("profile", "application/json", 16)
    assert state.artifacts["artifact://art_2"].created_sequence is None

    assert [(c.cycle_number, c.supervise) for c in state.outer_loop_cycles] == [(1, {"kind": "continue"})]
    assert state.usage.cost_usd == Decimal("0.0027")
    assert [(e.sequence, e.step_path, e.cost_usd, e.price_table_version) for e in state.cost_entries] == [
        (7, "extract", Decimal("0.0027"), "2026-12-03")
    ]


def test_folding_twice_gives_equal_states() -> None:
    events = envelopes(EVERY_TYPE)
    assert fold(events) == fold(events)
    assert fold(events).to_json() == fold(events).to_json()


def test_state_round_trips_through_json() -> None:
    state = fold(envelopes(EVERY_TYPE))
    stored = json.loads(canonical_json(state.to_json()))  # JSON-safe, and key order may be lost
    assert RunState.from_json(stored) == state
    assert stored["runId"] == RUN
    assert stored["steps"][0]["stepPath"] == "extract"
    assert stored["usage"]["costUsd"] == "0.0027"
    exported = state.to_json()
    exported["steps"][0]["output"]["name"] = "Grace"  # a caller editing the export edits a copy
    assert state.steps["extract"].output == {"name": "Ada"}


def test_equality_notices_step_order() -> None:
    one = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepScheduled", {"stepPath": "a"}),
                ("StepScheduled", {"stepPath": "b"}),
            ]
        )
    )
    other = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepScheduled", {"stepPath": "b"}),
                ("StepScheduled", {"stepPath": "a"}),
            ]
        )
    )
    other.steps["a"].first_sequence, other.steps["b"].first_sequence = 2, 3
    other.steps["a"].last_sequence, other.steps["b"].last_sequence = 2, 3
    assert dict(one.steps) == dict(other.steps)
    assert one != other


def test_run_id_mismatch_is_refused() -> None:
    events = envelopes([("RunStarted", {"workflowVersionId": "w"}), ("StepScheduled", {"stepPath": "a"})])
    events[1]["runId"] = "run_other"
    expected = r"^Event runId mismatch at index 1: expected run_fold, received run_other\.$"
    with pytest.raises(RunStateMismatch, match=expected):
        fold(events)


def test_sequence_gap_is_refused() -> None:
    events = envelopes([("RunStarted", {"workflowVersionId": "w"}), ("StepScheduled", {"stepPath": "a"})])
    events[1]["sequence"] = 3
    with pytest.raises(RunStateMismatch, match=r"^Event sequence mismatch for run_fold: expected 2, received 3\.$"):
        fold(events)


def test_log_must_start_at_sequence_one() -> None:
    events = envelopes([("RunStarted", {"workflowVersionId": "w"})], start=2)
    with pytest.raises(RunStateMismatch, match="expected 1, received 2"):
        fold(events)
    assert isinstance(RunStateMismatch("x"), ValueError)


def test_incremental_fold_continues_from_the_last_sequence() -> None:
    head = fold(envelopes([("RunStarted", {"workflowVersionId": "w"}), ("StepScheduled", {"stepPath": "a"})]))
    with pytest.raises(RunStateMismatch, match="expected 3, received 2"):
        fold_into(head, envelopes([("StepScheduled", {"stepPath": "b"})], start=2))
    with pytest.raises(RunStateMismatch, match="index 2: expected run_fold, received run_x"):
        fold_into(head, envelopes([("StepScheduled", {"stepPath": "b"})], run_id="run_x", start=3))
    assert fold_into(head, envelopes([("StepScheduled", {"stepPath": "b"})], start=3)).last_sequence == 3


def test_empty_log_needs_a_run_id() -> None:
    with pytest.raises(ValueError):
        fold([])
    empty = fold([], run_id=RUN)
    assert (empty.status, empty.last_sequence, empty.usage.cost_usd) == ("pending", 0, 0)
    assert fold_into(empty, envelopes([("RunStarted", {"workflowVersionId": "w"})])).status == "running"


def test_failed_then_completed_attempts_leave_a_completed_step_without_error() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepScheduled", {"stepPath": "extract"}),
                ("StepAttemptStarted", {"stepPath": "extract", "attempt": 1}),
                ("StepFailed", {"stepPath": "extract", "attempt": 1, "error": {"message": "timeout"}}),
                ("StepAttemptStarted", {"stepPath": "extract", "attempt": 2}),
                ("StepCompleted", {"stepPath": "extract", "attempt": 2, "output": 1}),
            ]
        )
    )
    step = state.steps["extract"]
    assert step.status == "completed"
    assert step.error is None
    assert [(a.attempt, a.status, a.error) for a in step.attempts] == [
        (1, "failed", {"message": "timeout"}),
        (2, "completed", None),
    ]
    assert step.started_at == "2026-11-02T10:00:03.000Z"
    assert step.finished_at == "2026-11-02T10:00:06.000Z"


def test_attempts_without_start_events_are_synthesized() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepFailed", {"stepPath": "s", "attempt": 1, "error": "x"}),
                ("StepCompleted", {"stepPath": "s", "attempt": 2}),
            ]
        )
    )
    assert [(a.attempt, a.status) for a in state.steps["s"].attempts] == [(1, "failed"), (2, "completed")]


def test_new_attempt_clears_the_previous_output() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepCompleted", {"stepPath": "s", "attempt": 1, "output": None}),
            ]
        )
    )
    assert state.steps["s"].has_output and state.steps["s"].output is None
    state = fold_into(state, envelopes([("StepAttemptStarted", {"stepPath": "s", "attempt": 2})], start=3))
    assert (state.steps["s"].status, state.steps["s"].has_output) == ("running", False)


def test_numeric_step_paths_keep_event_order() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepScheduled", {"stepPath": "10"}),
                ("StepScheduled", {"stepPath": "2"}),
            ]
        )
    )
    assert list(state.steps) == ["10", "2"]
    assert [s["stepPath"] for s in state.to_json()["steps"]] == ["10", "2"]


def test_proto_step_path_is_an_ordinary_step() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepScheduled", {"stepPath": "__proto__"}),
                ("StepCompleted", {"stepPath": "__proto__", "attempt": 1, "output": {"polluted": True}}),
                ("StepScheduled", {"stepPath": "constructor"}),
            ]
        )
    )
    assert list(state.steps) == ["__proto__", "constructor"]
    assert state.steps["__proto__"].output == {"polluted": True}
    assert RunState.from_json(json.loads(json.dumps(state.to_json()))) == state


def test_visit_suffix_gives_the_visit_index() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepCompleted", {"stepPath": "review.visit[0]", "attempt": 1, "output": "no"}),
                ("StepCompleted", {"stepPath": "review.visit[1]", "attempt": 1, "output": "yes"}),
                ("StepScheduled", {"stepPath": "fan[a].review.visit[12]"}),
                ("StepScheduled", {"stepPath": "plain"}),
            ]
        )
    )
    assert [s.visit for s in state.steps.values()] == [0, 1, 12, None]
    assert next_visit_index(state, "review", max_visits=3) == 2
    assert next_visit_index(state, "review", max_visits=1) == 0


def test_a_scheduled_visit_is_not_counted_as_done() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepCompleted", {"stepPath": "review.visit[0]", "attempt": 1, "output": "no"}),
                ("StepScheduled", {"stepPath": "review.visit[1]"}),
            ]
        )
    )
    assert next_visit_index(state, "review", max_visits=3) == 1


def test_only_model_responses_add_usage_and_rollups_add_nothing() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded("summarize", {"inputTokens": 20_000, "outputTokens": 10_000}),
                (
                    "harness.session.completed",
                    {"stepPath": "summarize", "usage": {"inputTokens": 20_000, "outputTokens": 10_000}},
                ),
            ]
        )
    )
    assert state.usage.cost_usd == Decimal("0.009")
    assert state.usage.input_tokens == 20_000
    assert state.steps["summarize"].usage == state.usage


def test_a_stray_recorded_cost_is_ignored() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded("summarize", {"inputTokens": 20_000, "outputTokens": 10_000, "costUsd": 999}),
            ]
        )
    )
    assert state.usage.cost_usd == Decimal("0.009")


def test_calls_without_step_path_count_for_the_run_only() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded(None, {"inputTokens": 20_000, "outputTokens": 0}),
                responded("summarize", {"inputTokens": 0, "outputTokens": 10_000}, callId="mc_2"),
            ]
        )
    )
    assert state.usage.cost_usd == Decimal("0.009")
    assert state.steps["summarize"].usage.cost_usd == Decimal("0.006")
    assert [e.step_path for e in state.cost_entries] == [None, "summarize"]


def test_unpriced_calls_are_null_and_counted() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded(
                    "a", {"inputTokens": 10, "outputTokens": 10}, model={"provider": "acme.chat", "modelId": "nope"}
                ),
            ]
        )
    )
    assert (state.usage.cost_usd, state.usage.priced_calls, state.usage.unpriced_calls) == (None, 0, 1)
    assert state.cost_entries[0].cost_usd is None
    assert state.model_calls[0].cost is None


def test_a_response_without_a_usage_object_is_not_a_counted_call() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("harness.model.responded", {"turn": 1, "callId": "c", "model": MINI, "response": {"text": "hi"}}),
            ]
        )
    )
    assert state.usage.calls == 0
    assert state.cost_entries == []
    assert state.model_calls[0].status == "responded"


def test_a_call_whose_usage_reports_no_tokens_is_unpriced_not_free() -> None:
    """`{}` is what OTLP ingest and the OpenAI paths record when the provider reported no usage (an
    OpenAI stream without include_usage): the call certainly cost money, so its cost is unknown."""
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("harness.model.called", {"stepPath": "a", "turn": 1, "callId": "mc_1", "request": {}}),
                responded("a", {}),
                responded("a", {"inputTokens": 20_000, "outputTokens": 10_000}, callId="mc_2"),
                responded("b", {"totalTokens": 40, "inputTokenDetails": {}}, callId="mc_3"),
            ]
        )
    )
    unreported, priced, alone = state.cost_entries
    assert (unreported.cost_usd, unreported.priced_as, unreported.usage_reported) == (None, None, False)
    assert (unreported.input_tokens, unreported.output_tokens) == (0, 0)
    assert (priced.cost_usd, priced.priced_as, priced.usage_reported) == (Decimal("0.009"), "openai/gpt-4o-mini", True)
    assert [(c.cost, c.usage_reported) for c in state.model_calls] == [
        (None, False),
        (Decimal("0.009"), True),
        (None, False),
    ]
    usage = state.usage
    assert (usage.cost_usd, usage.priced_calls, usage.unpriced_calls) == (Decimal("0.009"), 1, 2)
    assert (state.steps["a"].usage.priced_calls, state.steps["a"].usage.unpriced_calls) == (1, 1)
    assert (state.steps["b"].usage.cost_usd, state.steps["b"].usage.unpriced_calls) == (None, 1)


def test_explicit_zero_tokens_are_a_reported_usage_priced_at_zero() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded("a", {"inputTokens": 0, "outputTokens": 0}),
            ]
        )
    )
    [entry] = state.cost_entries
    assert (entry.cost_usd, entry.priced_as, entry.usage_reported) == (0, "openai/gpt-4o-mini", True)
    assert (state.usage.cost_usd, state.usage.priced_calls, state.usage.unpriced_calls) == (0, 1, 0)


def test_usage_not_reported_outranks_a_missing_price_and_little_workflow_keeps_its_rule() -> None:
    events = envelopes(
        [
            ("RunStarted", {"workflowVersionId": "w"}),
            responded("a", {}, model={"provider": "acme.chat", "modelId": "house"}),
            responded("a", {}, callId="mc_2"),
        ]
    )
    native = fold(events)
    assert [(e.cost_usd, e.usage_reported) for e in native.cost_entries] == [(None, False), (None, False)]
    assert native.usage.cost_usd is None and native.usage.unpriced_calls == 2
    # Runs imported from Little Workflow are folded by its rules: a usage object is a count, {} is 0.
    little = fold(events, prices=load_default_prices().for_little_workflow())
    assert [(e.cost_usd, e.usage_reported) for e in little.cost_entries] == [(None, True), (0, True)]
    assert (little.usage.priced_calls, little.usage.unpriced_calls) == (1, 1)


def test_a_replayed_call_without_reported_usage_counts_unpriced_in_the_replayed_totals() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded("a", {}, origin="simulated", replayOf="evt_0123456789abcdef"),
            ]
        )
    )
    assert state.cost_entries == [] and state.usage.calls == 0
    assert (state.replayed_usage.cost_usd, state.replayed_usage.unpriced_calls) == (None, 1)


def test_workspace_prices_apply_and_name_their_version() -> None:
    table = load_default_prices().with_overrides({"openai/gpt-4o-mini": {"input": 1, "output": 1}})
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                responded("a", {"inputTokens": 1_000_000, "outputTokens": 1_000_000}),
            ]
        ),
        prices=table,
    )
    assert state.usage.cost_usd == 2
    assert state.cost_entries[0].price_table_version == table.version


def test_model_answers_pair_by_call_id_then_by_step_and_turn() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("harness.model.called", {"stepPath": "a", "turn": 1, "promptHash": "h1", "request": {}}),
                (
                    "harness.model.called",
                    {"stepPath": "b", "turn": 1, "callId": "mc_b", "promptHash": "h2", "request": {}},
                ),
                ("harness.model.called", {"stepPath": "b", "turn": 2, "promptHash": "h3", "request": {}}),
                responded("b", {"inputTokens": 1}, callId="mc_b", origin="simulated", replayOf="evt_0123456789abcdef"),
                responded("a", {"inputTokens": 1}, callId="mc_a"),
            ]
        )
    )
    a, b1, b2 = state.model_calls
    assert (a.call_id, a.status, a.called_sequence, a.responded_sequence) == ("mc_a", "responded", 2, 6)
    assert (b1.call_id, b1.status, b1.responded_sequence) == ("mc_b", "responded", 5)
    assert (b1.origin, b1.replay_of) == ("simulated", "evt_0123456789abcdef")
    assert (b2.status, b2.turn) == ("called", 2)


def test_tool_call_origin_and_replay_of_are_kept() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                (
                    "harness.tool_call.started",
                    {
                        "callId": "t",
                        "caller": "code",
                        "toolName": "bash",
                        "args": {},
                        "origin": "recorded",
                        "replayOf": "evt_aaaaaaaaaaaaaaaa",
                    },
                ),
                ("harness.tool_call.in_doubt", {"callId": "t"}),
            ]
        )
    )
    call = state.tool_calls["t"]
    assert (call.status, call.origin, call.replay_of, call.caller) == (
        "in_doubt",
        "recorded",
        "evt_aaaaaaaaaaaaaaaa",
        "code",
    )


def test_run_completed_keeps_output_and_ref() -> None:
    state = fold(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("RunCompleted", {"output": {"ok": True}, "outputRef": "artifact://art_out"}),
            ]
        )
    )
    assert (state.status, state.output, state.output_ref) == ("completed", {"ok": True}, "artifact://art_out")
    assert list(state.artifacts) == ["artifact://art_out"]


def test_fold_does_not_change_its_input() -> None:
    events = envelopes(EVERY_TYPE)
    before = json.dumps(events, sort_keys=True)
    head = fold(events[:10])
    head_json = head.to_json()
    fold_into(head, events[10:])
    assert json.dumps(events, sort_keys=True) == before
    assert head.to_json() == head_json


# --- fold_into agrees with fold, for any split ----------------------------------------------

STEPS = st.sampled_from(["extract", "summarize", "10", "2", "__proto__", "loop.visit[0]", "loop.visit[1]"])
MAYBE_STEP = st.one_of(st.none(), STEPS)
CALL_IDS = st.sampled_from(["c1", "c2", "c3"])
MODELS = st.sampled_from(
    [MINI, {"provider": "openai.responses", "modelId": "gpt-4o"}, {"provider": "acme.chat", "modelId": "nope"}]
)
TOKENS = st.integers(min_value=-5, max_value=50_000)
REFS = st.sampled_from(["artifact://art_a", "artifact://art_b", "not-a-ref"])
ROLES = st.sampled_from(["orchestrator", "worker.ai-generate", "fixer"])


def _with_step(payload: dict[str, Any], step: str | None) -> dict[str, Any]:
    return payload if step is None else {**payload, "stepPath": step}


EVENT = st.one_of(
    st.builds(lambda s: ("StepScheduled", {"stepPath": s}), STEPS),
    st.builds(lambda s, a: ("StepAttemptStarted", {"stepPath": s, "attempt": a}), STEPS, st.integers(1, 3)),
    st.builds(
        lambda s, a, o, r: (
            "StepCompleted",
            {"stepPath": s, "attempt": a, "output": o, "outputRef": r, "artifactRefs": [r]},
        ),
        STEPS,
        st.integers(1, 3),
        st.integers(-(2**53) + 1, 2**53 - 1),
        REFS,
    ),
    st.builds(
        lambda s, a: ("StepFailed", {"stepPath": s, "attempt": a, "error": {"message": "x"}}), STEPS, st.integers(1, 3)
    ),
    st.builds(lambda s, r: ("ArtifactCreated", {"stepPath": s, "artifactRef": r, "name": "n"}), STEPS, REFS),
    st.builds(
        lambda s, t, c: (
            "harness.model.called",
            _with_step({"turn": t, "callId": c, "promptHash": "h", "request": {}}, s),
        ),
        MAYBE_STEP,
        st.integers(1, 3),
        st.one_of(st.none(), CALL_IDS),
    ),
    st.builds(
        lambda s, t, c, m, i, o, cached, r: (
            "harness.model.responded",
            _with_step(
                {
                    "turn": t,
                    "callId": c,
                    "model": m,
                    "response": {
                        "usage": {
                            "inputTokens": i,
                            "outputTokens": o,
                            "cachedInputTokens": cached,
                            "reasoningTokens": r,
                        }
                    },
                },
                s,
            ),
        ),
        MAYBE_STEP,
        st.integers(1, 3),
        CALL_IDS,
        MODELS,
        TOKENS,
        TOKENS,
        TOKENS,
        TOKENS,
    ),
    st.builds(
        lambda s, t: ("harness.model.failed", _with_step({"turn": t, "error": "e"}, s)), MAYBE_STEP, st.integers(1, 3)
    ),
    st.builds(
        lambda s, c: (
            "harness.tool_call.started",
            _with_step({"callId": c, "caller": "model", "turn": 1, "toolName": "t", "args": {}}, s),
        ),
        MAYBE_STEP,
        CALL_IDS,
    ),
    st.builds(
        lambda c, kind: (
            f"harness.tool_call.{kind}",
            {"callId": c, "result": 1, "error": 2, "durationMs": 3, "outcome": "failed"},
        ),
        CALL_IDS,
        st.sampled_from(["succeeded", "failed", "in_doubt", "reconciled"]),
    ),
    st.builds(
        lambda s, role, m: (
            "harness.session.started",
            _with_step({"role": role, "task": {}, "manifest": {"m": m}, "manifestHash": digest({"m": m})}, s),
        ),
        MAYBE_STEP,
        ROLES,
        st.integers(0, 2),
    ),
    st.builds(
        lambda s, kind: (f"harness.session.{kind}", _with_step({"usage": {"inputTokens": 5}}, s)),
        MAYBE_STEP,
        st.sampled_from(["completed", "failed"]),
    ),
    st.builds(
        lambda b: ("ParallelBranchScheduled", {"stepPath": "fan", "branchPath": f"fan[{b}]", "itemKey": b}),
        st.sampled_from(["a", "b"]),
    ),
    st.builds(
        lambda b, kind: (f"ParallelBranch{kind}", {"stepPath": "fan", "branchPath": f"fan[{b}]"}),
        st.sampled_from(["a", "b"]),
        st.sampled_from(["Completed", "Failed"]),
    ),
    st.sampled_from(
        [
            ("ParallelGroupStarted", {"stepPath": "fan", "branchCount": 2}),
            ("ParallelGroupCompleted", {"stepPath": "fan"}),
            ("custom.note", {"stepPath": "ghost"}),
            ("RunCompleted", {"output": 1}),
            ("RunFailed", {"error": "e"}),
        ]
    ),
    st.builds(
        lambda n: ("OuterLoopCycleCompleted", {"outerLoopId": "ol", "cycleNumber": n, "supervise": {}}),
        st.integers(1, 3),
    ),
)

LOGS = st.lists(EVENT, max_size=40).map(lambda items: [("RunStarted", {"workflowVersionId": "w"}), *items])


@settings(max_examples=200, deadline=None)
@given(items=LOGS, data=st.data())
def test_fold_into_continues_exactly_where_fold_left_off(items: list, data: st.DataObject) -> None:
    events = envelopes(items)
    split = data.draw(st.integers(min_value=0, max_value=len(events)))
    whole = fold(events)
    head = fold(events[:split], run_id=RUN)
    assert fold_into(head, events[split:]) == whole
    # Projections keep the state as JSON between appends: continuing from the stored copy agrees too.
    stored = RunState.from_json(json.loads(canonical_json(head.to_json())))
    assert fold_into(stored, events[split:]) == whole
    assert fold_into(stored, events[split:]).to_json() == whole.to_json()
