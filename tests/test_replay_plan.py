from __future__ import annotations

from typing import Any

import pytest

from ledger.canonical import digest
from ledger.replay.plan import CapabilityDriftError, manifest_drift, replay_plan
from tests.conftest import envelopes as stored_envelopes

RUN = "run_replay"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def envelopes(items: list[tuple[str, dict[str, Any]]], run_id: str = RUN) -> list[dict[str, Any]]:
    return stored_envelopes(items, run_id=run_id)


def session(step_path: str | None, role: str, manifest: dict[str, Any], manifest_hash: str | None = None) -> tuple:
    payload: dict[str, Any] = {
        "role": role,
        "task": {"kind": "execute_step"},
        "manifest": manifest,
        "manifestHash": manifest_hash or digest(manifest),
    }
    if step_path is not None:
        payload["stepPath"] = step_path
    return ("harness.session.started", payload)


def called(step_path: str, turn: int, call_id: str) -> tuple:
    return (
        "harness.model.called",
        {"stepPath": step_path, "turn": turn, "callId": call_id, "promptHash": "h", "request": {}},
    )


def answered(step_path: str, turn: int, call_id: str) -> tuple:
    return (
        "harness.model.responded",
        {
            "stepPath": step_path,
            "turn": turn,
            "callId": call_id,
            "model": MINI,
            "response": {"text": "ok", "usage": {"inputTokens": 10, "outputTokens": 5}},
        },
    )


def tool(kind: str, call_id: str, step_path: str = "score", **payload: Any) -> tuple:
    base: dict[str, Any] = {"stepPath": step_path, "callId": call_id}
    if kind == "started":
        base |= {"caller": "model", "turn": 1, "toolName": "search", "args": {"q": "x"}}
    return (f"harness.tool_call.{kind}", base | payload)


def check(plan: dict[str, Any], name: str) -> dict[str, str]:
    return next(c for c in plan["integrity"]["checks"] if c["name"] == name)


FOUR_STEPS: list[tuple[str, dict[str, Any]]] = [
    ("RunStarted", {"workflowVersionId": "wfver_1"}),
    ("StepScheduled", {"stepPath": "extract"}),
    ("StepAttemptStarted", {"stepPath": "extract", "attempt": 1}),
    (
        "StepCompleted",
        {
            "stepPath": "extract",
            "attempt": 1,
            "output": {"name": "Ada"},
            "outputRef": "artifact://art_out",
            "artifactRefs": ["artifact://art_doc"],
        },
    ),
    ("StepScheduled", {"stepPath": "summarize"}),
    ("StepScheduled", {"stepPath": "score"}),
    ("StepAttemptStarted", {"stepPath": "score", "attempt": 1}),
    ("StepScheduled", {"stepPath": "notify"}),
    ("StepAttemptStarted", {"stepPath": "notify", "attempt": 1}),
    ("StepFailed", {"stepPath": "notify", "attempt": 1, "error": {"message": "smtp down"}}),
]


def test_completed_steps_are_skipped_and_the_rest_run_again() -> None:
    plan = replay_plan(envelopes(FOUR_STEPS), artifact_checks={"artifact://art_out": "ok", "artifact://art_doc": "ok"})
    assert plan["runId"] == RUN
    assert plan["completedStepPaths"] == ["extract"]
    assert plan["pendingStepPaths"] == ["summarize", "score", "notify"]
    assert plan["steps"] == [
        {
            "stepPath": "extract",
            "status": "completed",
            "shouldRun": False,
            "output": {"name": "Ada"},
            "outputRef": "artifact://art_out",
            "artifactRefs": ["artifact://art_out", "artifact://art_doc"],
        },
        {"stepPath": "summarize", "status": "scheduled", "shouldRun": True, "artifactRefs": []},
        {"stepPath": "score", "status": "running", "shouldRun": True, "artifactRefs": []},
        {"stepPath": "notify", "status": "failed", "shouldRun": True, "artifactRefs": []},
    ]
    assert plan["sessions"] == []
    assert plan["integrity"]["ok"] is True
    assert plan["replayReady"] == {"status": "pass", "missing": []}


def test_plan_steps_carry_the_visit() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepCompleted", {"stepPath": "review.visit[0]", "attempt": 1, "output": "again"}),
                ("StepScheduled", {"stepPath": "review.visit[1]"}),
            ]
        )
    )
    assert [(s["stepPath"], s.get("visit"), s["shouldRun"]) for s in plan["steps"]] == [
        ("review.visit[0]", 0, False),
        ("review.visit[1]", 1, True),
    ]


def test_answered_model_calls_replay_and_the_in_flight_one_is_reinvoked() -> None:
    manifest = {"harnessId": "h1", "stepPath": "score"}
    plan = replay_plan(
        envelopes(
            [
                *FOUR_STEPS[:7],
                session("score", "worker.ai-generate", manifest),
                called("score", 1, "mc_1"),
                answered("score", 1, "mc_1"),
                tool("started", "tc_1"),
                tool("succeeded", "tc_1", result={"hits": 3}, durationMs=40),
                tool("started", "tc_2"),
                called("score", 2, "mc_2"),
            ]
        ),
        artifact_checks={"artifact://art_out": "ok", "artifact://art_doc": "ok"},
    )
    assert plan["sessions"] == [
        {
            "stepPath": "score",
            "role": "worker.ai-generate",
            "calls": [
                {"kind": "model", "turn": 1, "callId": "mc_1", "action": "replay"},
                {"kind": "tool", "turn": 1, "callId": "tc_1", "action": "replay"},
                {"kind": "tool", "turn": 1, "callId": "tc_2", "action": "reinvoke"},
                {"kind": "model", "turn": 2, "callId": "mc_2", "action": "reinvoke"},
            ],
        },
    ]
    assert plan["replayReady"] == {"status": "fail", "missing": ["model:score:turn2:response", "tool:tc_2:result"]}


def test_failed_and_reconciled_tool_calls_replay_their_outcome() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                tool("started", "tc_fail"),
                tool("failed", "tc_fail", error={"message": "404"}, durationMs=3),
                tool("started", "tc_pay"),
                tool("in_doubt", "tc_pay"),
                tool("reconciled", "tc_pay", outcome="succeeded", result={"paid": True}, note="checked with bank"),
            ]
        )
    )
    assert [(c["callId"], c["action"]) for c in plan["sessions"][0]["calls"]] == [
        ("tc_fail", "replay"),
        ("tc_pay", "replay"),
    ]
    assert plan["replayReady"]["status"] == "pass"


def test_an_in_doubt_tool_call_blocks_replay_until_reconciled() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                tool("started", "tc_pay"),
                tool("in_doubt", "tc_pay"),
            ]
        )
    )
    # Never re-invoked: the request may have left, and a second payment is worse than a pause.
    assert plan["sessions"][0]["calls"] == [{"kind": "tool", "turn": 1, "callId": "tc_pay", "action": "replay"}]
    assert plan["replayReady"] == {"status": "fail", "missing": ["tool:tc_pay:in_doubt"]}


def test_a_failed_model_call_that_was_retried_is_not_replanned() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                session("s", "worker.ai-generate", {"m": 1}),
                called("s", 1, "mc_1"),
                (
                    "harness.model.failed",
                    {"stepPath": "s", "turn": 1, "callId": "mc_1", "error": "429", "willRetry": True},
                ),
                called("s", 1, "mc_2"),
                answered("s", 1, "mc_2"),
            ]
        )
    )
    assert plan["sessions"][0]["calls"] == [{"kind": "model", "turn": 1, "callId": "mc_2", "action": "replay"}]
    assert plan["replayReady"]["status"] == "pass"


def test_interleaved_sessions_keep_their_own_calls() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                session(None, "orchestrator", {"orchestratorModelSlotId": "o"}),
                session("fan[a].work", "worker.ai-generate", {"w": 1}),
                session("fan[b].work", "worker.ai-generate", {"w": 1}),
                called("fan[a].work", 1, "a1"),
                called("fan[b].work", 1, "b1"),
                answered("fan[b].work", 1, "b1"),
                answered("fan[a].work", 1, "a1"),
                ("harness.model.called", {"turn": 1, "callId": "o1", "promptHash": "h", "request": {}}),
            ]
        )
    )
    assert [(s["stepPath"], s["role"], [c["callId"] for c in s["calls"]]) for s in plan["sessions"]] == [
        (None, "orchestrator", ["o1"]),
        ("fan[a].work", "worker.ai-generate", ["a1"]),
        ("fan[b].work", "worker.ai-generate", ["b1"]),
    ]
    assert plan["replayReady"]["missing"] == ["model:(unattributed):turn1:response"]


def test_calls_outside_any_session_are_grouped_by_step() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                called("s", 1, "c1"),
                answered("s", 1, "c1"),
            ]
        )
    )
    assert plan["sessions"] == [
        {"stepPath": "s", "role": None, "calls": [{"kind": "model", "turn": 1, "callId": "c1", "action": "replay"}]}
    ]


def test_completed_step_without_output_is_missing_its_output() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                ("StepCompleted", {"stepPath": "a", "attempt": 1}),
                ("StepCompleted", {"stepPath": "b", "attempt": 1, "output": None}),
            ]
        )
    )
    assert plan["replayReady"] == {"status": "fail", "missing": ["step:a:output"]}


def test_a_sequence_gap_fails_integrity_but_still_plans() -> None:
    events = envelopes(FOUR_STEPS[:4])
    events[3]["sequence"] = 5
    plan = replay_plan(events, artifact_checks={"artifact://art_out": "ok", "artifact://art_doc": "ok"})
    assert check(plan, "dense_sequence") == {
        "name": "dense_sequence",
        "status": "fail",
        "detail": "Event sequence mismatch for run_replay: expected 4, received 5.",
    }
    assert plan["integrity"]["ok"] is False
    assert plan["completedStepPaths"] == ["extract"]
    assert check(replay_plan(envelopes(FOUR_STEPS[:2])), "dense_sequence") == {
        "name": "dense_sequence",
        "status": "pass",
        "detail": "2 events, sequences 1..2",
    }


def test_artifact_hashes_come_from_the_callers_checks() -> None:
    events = envelopes(FOUR_STEPS[:4])
    ok = replay_plan(events, artifact_checks={"artifact://art_out": "ok", "artifact://art_doc": "ok"})
    assert check(ok, "artifact_hashes")["status"] == "pass"

    broken = replay_plan(events, artifact_checks={"artifact://art_out": "mismatch", "artifact://art_doc": "missing"})
    assert check(broken, "artifact_hashes") == {
        "name": "artifact_hashes",
        "status": "fail",
        "detail": "artifact://art_out: mismatch; artifact://art_doc: missing",
    }
    assert broken["integrity"]["ok"] is False
    assert broken["replayReady"]["missing"] == ["artifact:artifact://art_out", "artifact:artifact://art_doc"]


def test_artifacts_nobody_checked_do_not_pass() -> None:
    plan = replay_plan(envelopes(FOUR_STEPS[:4]))
    assert check(plan, "artifact_hashes")["status"] == "fail"
    assert "unchecked" in check(plan, "artifact_hashes")["detail"]
    nothing = replay_plan(envelopes(FOUR_STEPS[:2]))
    assert check(nothing, "artifact_hashes") == {
        "name": "artifact_hashes",
        "status": "pass",
        "detail": "no artifacts referenced",
    }


def test_manifest_drift_lists_every_changed_path() -> None:
    old = {"harnessId": "h1", "tools": ["bash"], "model": {"id": "gpt-4o-mini"}, "maxTurns": 8, "skills": []}
    new = {"harnessId": "h2", "tools": ["bash", "curl"], "model": {}, "maxTurns": 8, "skills": [], "Zeta": None}
    assert manifest_drift(old, new) == [
        '$.harnessId: "h1" -> "h2"',
        "$.model: undefined -> {}",
        '$.model.id: "gpt-4o-mini" -> undefined',
        '$.tools[1]: undefined -> "curl"',
        "$.Zeta: undefined -> null",
    ]
    assert manifest_drift(old, dict(old)) == []


def test_drift_error_text_matches_little_workflow() -> None:
    error = CapabilityDriftError("run_x", ['$.harnessId: "h1" -> "h2"', "$.maxTurns: 8 -> 9"])
    assert f"CapabilityDriftError: {error}" == (
        'CapabilityDriftError: run \'run_x\' manifest changed:\n- $.harnessId: "h1" -> "h2"\n- $.maxTurns: 8 -> 9'
    )


def test_a_changed_worker_manifest_on_resume_fails_the_drift_check() -> None:
    before = {"harnessId": "h1", "stepPath": "score", "tools": ["search"]}
    after = {"harnessId": "h1", "stepPath": "score", "tools": ["search", "shell"]}
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                session("score", "worker.ai-generate", before),
                ("harness.session.failed", {"stepPath": "score", "error": {"message": "crash"}}),
                session("score", "worker.ai-generate", after),
            ]
        )
    )
    assert check(plan, "manifest_drift") == {
        "name": "manifest_drift",
        "status": "fail",
        "detail": "CapabilityDriftError: run 'run_replay' manifest changed:\n- $.tools[1]: undefined -> \"shell\"",
    }
    assert plan["integrity"]["ok"] is False


def test_workers_of_different_steps_may_differ() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                session("a", "worker.ai-generate", {"stepPath": "a", "tools": ["x"]}),
                session("b", "worker.ai-generate", {"stepPath": "b", "tools": ["y"]}),
                session("a", "worker.ai-generate", {"stepPath": "a", "tools": ["x"]}),
                session(None, "orchestrator", {"o": 1}),
            ]
        )
    )
    assert check(plan, "manifest_drift") == {
        "name": "manifest_drift",
        "status": "pass",
        "detail": "4 session(s), manifests match their hashes and scopes",
    }


def test_a_manifest_hash_that_is_not_the_manifests_digest_fails() -> None:
    plan = replay_plan(
        envelopes(
            [
                ("RunStarted", {"workflowVersionId": "w"}),
                session(None, "orchestrator", {"o": 1}, manifest_hash="sha256:" + "0" * 64),
            ]
        )
    )
    result = check(plan, "manifest_drift")
    assert result["status"] == "fail"
    assert result["detail"].startswith("session at sequence 2 (orchestrator): manifestHash sha256:000")
    assert digest({"o": 1}) in result["detail"]


def test_a_plan_needs_events() -> None:
    with pytest.raises(ValueError):
        replay_plan([])


def test_a_page_of_steps_gets_the_plans_sessions_of_those_steps_in_the_plans_order() -> None:
    """What the steps tab and a share link's page list under a page of a long run's steps, found
    through the plan's index instead of a walk of all its sessions at each request."""
    from ledger.replay.stored_plan import plan_index, sessions_of_steps

    sessions = [
        {"stepPath": "a", "n": 1},
        {"stepPath": "outside", "n": 2},  # a harness session of no step of the plan
        {"stepPath": "b", "n": 3},
        {"stepPath": "a", "n": 4},
    ]
    plan = {
        "steps": [{"stepPath": "a", "shouldRun": False}, {"stepPath": "b", "shouldRun": True}],
        "sessions": sessions,
    }

    def listed(paths: list[str], *, stepless: bool) -> list[int]:
        return [s["n"] for s in sessions_of_steps(plan, paths, stepless=stepless)]

    assert listed(["a"], stepless=True) == [1, 2, 4]
    assert listed(["a"], stepless=False) == [1, 4]
    assert listed(["b", "a", "a"], stepless=False) == [1, 3, 4]
    assert listed([], stepless=True) == [2]
    assert listed(["outside"], stepless=True) == [2]  # once, though both ways name it
    assert plan_index(plan).should_run == {"a": False, "b": True}
    assert plan_index(plan) is plan_index(plan)  # made once per plan
