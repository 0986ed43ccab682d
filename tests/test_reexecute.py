"""Re-execution through the runtime: simulate, evaluate, fork, rerun and resume of recorded runs
(ledger/runtime/reexecute.py). Calls served from the record are never made live and never
counted as spend; a killed re-execution resumes the same new run; every run verifies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from ledger import clock
from ledger.canonical import canonical_json
from ledger.demo import DEMO_RUNS
from ledger.demo import workflows as demo_workflows
from ledger.log import append
from ledger.models import CostEntry, Run, ToolGatewayClaim, Workspace
from ledger.reads.usage import usage_rows
from ledger.replay.divergence import divergence_report
from ledger.replay.gateway import ToolCallInDoubt, settle_expired_claims
from ledger.runtime.errors import InvalidReexecution, UnknownModelProvider, UnknownStep, UnknownWorkflow
from ledger.runtime.executor import start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider, register_provider, unregister_provider
from ledger.runtime.record import inline_or_ref
from ledger.runtime.reexecute import ReexecutionConflict, execute_reexecution, mode_plan
from ledger.runtime.registry import AIGenerate, CodeRun, Tool, ToolCall, get_workflow, register
from tests.conftest import ev
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
    invocation_counts,
    run_events,
)
from tests.runtime_workflows import INVOCATIONS_ENV, reset_registrations

DRILL_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}
MODEL_AND_TOOL = ("harness.model.", "harness.tool_call.")


@pytest.fixture
def invocations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The test workflows, registered to write every model and tool invocation to a file."""
    path = tmp_path / "invocations.jsonl"
    monkeypatch.setenv(INVOCATIONS_ENV, str(path))
    reset_registrations()
    yield path
    monkeypatch.delenv(INVOCATIONS_ENV)
    reset_registrations()


@pytest.fixture
def alt_provider() -> Iterator[ScriptedProvider]:
    """`alt`: another model whose research asks for a city the drill's record never looked up."""
    provider = ScriptedProvider(
        script={
            "research": [
                {
                    "toolCalls": [
                        {"id": "w1", "name": "weather", "args": {"city": "Oslo"}},
                        {"id": "w9", "name": "weather", "args": {"city": "Paris"}},
                    ],
                    "usage": {"inputTokens": 150, "outputTokens": 20},
                },
                {"text": "Oslo is cold; Paris is unknown.", "usage": {"inputTokens": 260, "outputTokens": 10}},
            ],
            "summarize": [{"text": "Oslo loses.", "usage": {"inputTokens": 80, "outputTokens": 3}}],
        },
        name="openai",
        model_id="gpt-4o",
    )
    register_provider("alt", lambda model, current: replace(provider, model_id=model))
    yield provider
    unregister_provider("alt")


def _reexecute(workspace: Workspace, original: str, mode: str, new: str, **kwargs: Any) -> Any:
    return execute_reexecution(
        workspace=workspace, original_run_id=original, mode=mode, new_run_id=new, reexecution_id=f"rx_{new}", **kwargs
    )


def _origins(events: list[dict[str, Any]]) -> Counter[str]:
    return Counter(e["payload"].get("origin") for e in events if e["type"].startswith(MODEL_AND_TOOL))


def _drill(workspace: Workspace) -> str:
    outcome = start_run(workspace=workspace, workflow="drill", input=DRILL_INPUT)
    assert outcome.status == "completed"
    return outcome.run_id


# --- simulate ---------------------------------------------------------------------------------

DEMO_INPUTS: dict[str, dict[str, Any]] = {
    "support.triage": {"ticket": "Where is my parcel?", "orderId": "A-1"},
    "support.triage-premium": {"ticket": "Wrong size delivered", "orderId": "D-4"},
    "support.refund": {"ticket": "Refund please", "orderId": "B-2", "amount": 12.5},
    "research.brief": {"topic": "churn signals"},
    "research.house-model": {"topic": "internal evaluation"},
    "research.export": {"topic": "pricing", "rows": 4000},
    "research.topic": {"topic": "onboarding funnels"},
    "research.orchestrator": {"topics": ["pricing pages", "restricted market data", "support backlog"]},
    "support.escalation": {"ticket": "Third outage this month", "passesNeeded": 3},
}


@pytest.fixture
def counted_demo() -> Iterator[Counter[str]]:
    """The demo's workflows with every tool function and model provider counting its invocations."""
    counts: Counter[str] = Counter()
    originals = {name: get_workflow(name) for name in DEMO_INPUTS}

    def counting_tool(tool: Tool) -> Tool:
        def fn(args: Any) -> Any:
            counts[f"tool {tool.name}"] += 1
            return tool.fn(args)

        return replace(tool, fn=fn)

    class Counting:
        def __init__(self, provider: Any) -> None:
            self.provider, self.name, self.model_id = provider, provider.name, provider.model_id

        def generate(self, request: Any) -> Any:
            counts[f"model {self.model_id}"] += 1
            return self.provider.generate(request)

    for workflow in originals.values():
        register(
            replace(
                workflow,
                tools={n: counting_tool(t) for n, t in workflow.tools.items()},
                models={slot: Counting(p) for slot, p in workflow.models.items()},
            )
        )
    yield counts
    for workflow in originals.values():
        register(workflow)


@pytest.mark.parametrize("workflow", sorted(DEMO_INPUTS))
def test_a_simulation_of_every_demo_workflow_reproduces_its_output_with_no_calls_and_no_divergence(
    workspace: Workspace, counted_demo: Counter[str], workflow: str
) -> None:
    original = start_run(workspace=workspace, workflow=workflow, input=DEMO_INPUTS[workflow])
    assert original.status == "completed"
    made = sum(counted_demo.values())
    assert made > 0 or workflow == "research.export"  # the export is code only

    outcome = _reexecute(workspace, original.run_id, "simulate", "run_sim")

    assert sum(counted_demo.values()) == made  # zero provider and zero tool invocations
    assert (outcome.status, outcome.output) == ("completed", original.output)
    report = divergence_report(workspace=workspace, original_run_id=original.run_id, new_run_id="run_sim")
    assert report["firstDivergence"] is None and report["divergences"] == []
    assert report["counts"]["changed"] == report["counts"]["new"] == report["counts"]["missing"] == 0
    events = run_events(workspace, "run_sim")
    assert set(_origins(events)) <= {"simulated"}
    started = events[0]["payload"]
    assert (started["replayOf"], started["reexecutionId"]) == (original.run_id, "rx_run_sim")
    run = Run.objects.get(workspace=workspace, run_id="run_sim")
    assert run.replay_of == original.run_id
    assert (run.cost_usd, run.input_tokens, run.priced_calls + run.unpriced_calls) == (0, 0, 0)
    assert not CostEntry.objects.filter(run=run).exists()
    # sub-runs are simulated against the original's sub-runs, under the simulation
    children = Run.objects.filter(workspace=workspace, parent_run_id="run_sim")
    assert all(child.replay_of.startswith("run_sub_") and child.cost_usd == 0 for child in children)
    assert children.count() == len(DEMO_INPUTS[workflow].get("topics", []))


def test_the_demo_runs_the_runtime_made_simulate_exactly(workspace: Workspace, counted_demo: Counter[str]) -> None:
    """What `ledger demo` lays out simulates too (a crashed-and-resumed run included); a run an
    external harness appended names no workflow of this deployment and is refused."""
    from ledger.demo import load_demo

    load_demo(history_runs=0, evaluations_too=False)
    made = sum(counted_demo.values())
    runs = (
        Run.objects.filter(status="completed", parent_run_id="", replay_of="")
        .exclude(run_id__in=[run_id for *_, run_id, _ in DEMO_RUNS])
        .exclude(  # an outer loop's record: below
            workflow_version_id__startswith="outer_loop:"
        )
        .select_related("workspace")
    )
    assert {"run_demo_crashed_resumed", "run_demo_orchestrator", "run_demo_escalation", "run_ol_demo_refine_c2"} <= {
        r.run_id for r in runs
    }
    for run in runs:
        outcome = _reexecute(run.workspace, run.run_id, "simulate", f"{run.run_id}_sim")
        assert outcome.status == "completed", run.run_id
        assert outcome.output == inline_or_ref(run, run.output, run.output_ref or None)
        report = divergence_report(workspace=run.workspace, original_run_id=run.run_id, new_run_id=f"{run.run_id}_sim")
        assert report["firstDivergence"] is None, (run.run_id, report["steps"])
    assert sum(counted_demo.values()) == made
    external = Run.objects.get(run_id="run_demo_summarize")
    with pytest.raises(UnknownWorkflow, match="names no workflow"):
        _reexecute(external.workspace, external.run_id, "simulate", "run_nope")
    assert not Run.objects.filter(run_id="run_nope").exists()
    # an outer loop's record holds loop facts, not a workflow's steps: its cycles re-execute, it does not
    record = Run.objects.get(run_id="run_ol_demo_refine")
    with pytest.raises(UnknownWorkflow, match="names no workflow"):
        _reexecute(record.workspace, record.run_id, "simulate", "run_nope_loop")
    assert not Run.objects.filter(run_id="run_nope_loop").exists()


def test_a_simulation_after_the_code_changed_diverges_at_the_changed_step(
    workspace: Workspace, invocations: Path
) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)
    drill = get_workflow("drill")
    changed = tuple(
        AIGenerate("summarize", lambda i, o: f"Summarize briefly: {o['research']}", system="You summarize.")
        if step.id == "summarize"
        else step
        for step in drill.steps
    )
    register(replace(drill, steps=changed))

    outcome = _reexecute(workspace, original, "simulate", "run_sim")

    assert outcome.status == "failed" and outcome.error["name"] == "ReplayDiverged"
    assert invocation_counts(invocations) == before
    events = run_events(workspace, "run_sim")
    diverged = [e["payload"] for e in events if e["type"] == "harness.replay.diverged"]
    assert [(d["stepPath"], d["kind"], d["reason"]) for d in diverged] == [("summarize", "model", "request_changed")]
    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_sim")
    assert report["firstDivergence"] == "summarize"
    assert [(s["stepPath"], s["status"]) for s in report["steps"]] == [
        ("prepare", "identical"),
        ("research", "identical"),
        ("notify", "identical"),
        ("summarize", "changed"),
        ("finish", "missing"),
    ]
    assert report["divergences"][0]["callId"] == "summarize:turn1"


@pytest.mark.parametrize("mode", ["simulate", "evaluate"])
def test_tool_calls_recorded_under_older_redaction_rules_still_match(
    workspace: Workspace, invocations: Path, mode: str
) -> None:
    original = _drill(workspace)
    workspace.redact_keys = ["city"]  # the weather tool's argument, redacted since the recording
    workspace.save()
    before = invocation_counts(invocations)
    outcome = _reexecute(workspace, original, mode, "run_new")
    assert outcome.status == "completed"
    events = run_events(workspace, "run_new")
    assert not [e for e in events if e["type"] == "harness.replay.diverged"]
    started = [
        e["payload"]["args"]
        for e in events
        if e["type"] == "harness.tool_call.started" and e["payload"]["toolName"] == "weather"
    ]
    assert started and all(args == {"city": "[REDACTED]"} for args in started)
    tools = lambda counts: {k: n for k, n in counts.items() if not k.startswith("model ")}  # noqa: E731
    assert tools(invocation_counts(invocations)) == tools(before)  # tools served from the record, never live


def test_a_call_missing_from_the_record_never_leaves_a_simulation(workspace: Workspace, invocations: Path) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)
    drill = get_workflow("drill")
    # the workflow now notifies someone the original never notified: the tool call is not in the record
    changed = tuple(
        ToolCall("notify", "notify", lambda i, o: {"to": "ceo", "text": o["research"]}) if step.id == "notify" else step
        for step in drill.steps
    )
    register(replace(drill, steps=changed))

    outcome = _reexecute(workspace, original, "simulate", "run_sim")

    assert outcome.status == "failed" and outcome.error["name"] == "ReplayDiverged"
    assert invocation_counts(invocations) == before  # the notify function never ran
    events = run_events(workspace, "run_sim")
    assert not [
        e for e in events if e["type"] == "harness.tool_call.started" and e["payload"]["callId"] == "notify:call"
    ]
    diverged = next(e["payload"] for e in events if e["type"] == "harness.replay.diverged")
    assert (diverged["stepPath"], diverged["kind"], diverged["toolName"], diverged["args"]["to"]) == (
        "notify",
        "tool",
        "notify",
        "ceo",
    )
    assert not ToolGatewayClaim.objects.filter(run__run_id="run_sim").exists()  # the gateway was never asked


def test_simulate_and_evaluate_execute_without_any_live_tool_or_model_path(
    workspace: Workspace, invocations: Path
) -> None:
    from ledger.log.redaction import Redactor
    from ledger.runtime.reexecute import Replay, _Original

    original = _Original.load(workspace, _drill(workspace))
    drill = get_workflow("drill")
    for mode in ("simulate", "evaluate"):
        executed = Replay(
            mode=mode, original=original, reexecution_id="rx", model_overrides={}, redactor=Redactor([], [])
        ).workflow(drill)
        assert executed.version == drill.version  # the same workflow, as far as the log can tell
        for name, tool in executed.tools.items():
            assert tool.fn is not drill.tools[name].fn
            with pytest.raises(RuntimeError, match="no live path"):
                tool.fn({"city": "Oslo", "to": "x", "text": "y"})
        if mode == "simulate":
            with pytest.raises(RuntimeError, match="no live model path"):
                executed.models["default"].generate(ModelRequest(step_path="research", turn=1, body={}))
    assert sum(invocation_counts(invocations).values()) == 8  # the original's own 4 model and 4 tool calls


# --- evaluate ---------------------------------------------------------------------------------


def test_an_evaluation_calls_models_live_serves_tools_from_the_record_and_reports_where_it_left_it(
    workspace: Workspace, invocations: Path, alt_provider: ScriptedProvider
) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)

    outcome = _reexecute(
        workspace, original, "evaluate", "run_eval", model_overrides={"default": {"provider": "alt", "model": "gpt-4o"}}
    )

    assert invocation_counts(invocations) == before  # no tool ran, the drill's own model was not asked
    assert [(p, t) for p, t in alt_provider.invocations] == [("research", 1), ("research", 2)]
    events = run_events(workspace, "run_eval")
    responded = [e["payload"] for e in events if e["type"] == "harness.model.responded"]
    assert {(p["model"]["provider"], p["model"]["modelId"], p["origin"]) for p in responded} == {
        ("openai", "gpt-4o", "live")
    }
    tools = {
        e["payload"]["args"]["city"]: e["payload"]
        for e in events
        if e["type"] == "harness.tool_call.started" and e["payload"]["toolName"] == "weather"
    }
    assert tools["Oslo"]["origin"] == "simulated" and tools["Oslo"]["replayOf"].startswith("evt_")
    assert tools["Paris"]["origin"] == "simulated" and "replayOf" not in tools["Paris"]
    # the call the record cannot answer reached the model as an error, and was never made
    failed = next(e["payload"] for e in events if e["type"] == "harness.tool_call.failed")
    assert failed["error"]["name"] == "ReplayDiverged"
    # the new text asks notify for a message the original never sent: that step fails the same way
    assert outcome.status == "failed"

    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_eval")
    assert report["firstDivergence"] == "research"
    research = next(s for s in report["steps"] if s["stepPath"] == "research")
    assert research["status"] == "changed" and "modelOutputs" in research["changes"]
    assert "+Oslo is cold; Paris is unknown." in research["diff"]["modelOutputs"]
    assert "-Lisbon is warmest, Oslo coldest." in research["diff"]["modelOutputs"]
    assert [(d["stepPath"], d["toolName"], d["args"]) for d in report["divergences"]] == [
        ("research", "weather", {"city": "Paris"}),
        ("notify", "notify", {"text": "Oslo is cold; Paris is unknown.", "to": "ops"}),
    ]
    # live model calls are spend, at the new model's price; the original's price is beside it
    run = Run.objects.get(workspace=workspace, run_id="run_eval")
    assert run.priced_calls == 2 and run.cost_usd > 0
    assert report["new"]["costUsd"] == pytest.approx(float(run.cost_usd))


def test_an_evaluation_with_the_same_model_reproduces_the_run(workspace: Workspace, invocations: Path) -> None:
    original = _drill(workspace)
    outcome = _reexecute(workspace, original, "evaluate", "run_eval")
    assert outcome.status == "completed"
    counts = invocation_counts(invocations)
    assert all(counts[k] == 2 for k in counts if k.startswith("model "))  # once live now, once originally
    assert all(counts[k] == 1 for k in counts if k.startswith("tool "))
    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_eval")
    assert report["firstDivergence"] is None


# --- fork, rerun, resume ----------------------------------------------------------------------


def test_a_fork_reuses_the_steps_before_x_and_runs_x_onward_live(workspace: Workspace, invocations: Path) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)

    outcome = _reexecute(workspace, original, "fork", "run_fork", from_step="notify")

    assert outcome.status == "completed"
    made = invocation_counts(invocations) - before
    assert made == Counter(
        {'tool notify {"text":"Lisbon is warmest, Oslo coldest.","to":"ops"}': 1, "model summarize turn 1": 1}
    )
    events = run_events(workspace, "run_fork")
    notify_at = next(e["sequence"] for e in events if e["payload"].get("stepPath") == "notify")
    early = [e for e in events[1:] if e["sequence"] < notify_at]
    late = [e for e in events if e["sequence"] >= notify_at]
    original_ids = {e["eventId"] for e in run_events(workspace, original)}
    assert early and all(e["payload"]["replayOf"] in original_ids for e in early)
    assert _origins(early) == Counter({"recorded": sum(e["type"].startswith(MODEL_AND_TOOL) for e in early)})
    assert set(_origins(late)) == {"live"}
    run = Run.objects.get(workspace=workspace, run_id="run_fork")
    # the recorded research calls are not spend; the live summarize call is
    assert list(CostEntry.objects.filter(run=run).values_list("step_path", flat=True)) == ["summarize"]
    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_fork")
    assert report["firstDivergence"] is None


def test_a_fork_with_another_input_and_model_runs_only_x_onward_with_them(
    workspace: Workspace, invocations: Path, alt_provider: ScriptedProvider
) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)

    outcome = _reexecute(
        workspace,
        original,
        "fork",
        "run_fork",
        from_step="summarize",
        input={**DRILL_INPUT, "to": "board"},
        model_overrides={"default": {"provider": "alt", "model": "gpt-4o"}},
    )

    assert outcome.status == "completed" and outcome.output == {"summary": "Oslo loses.", "notified": "msg-ops"}
    assert invocation_counts(invocations) == before
    assert alt_provider.invocations == [("summarize", 1)]
    started = run_events(workspace, "run_fork")[0]["payload"]
    assert started["input"]["to"] == "board"
    assert started["reexecution"] == {
        "mode": "fork",
        "fromStep": "summarize",
        "modelOverrides": {"default": {"provider": "alt", "model": "gpt-4o"}},
    }
    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_fork")
    assert report["firstDivergence"] == "summarize"
    assert next(s for s in report["steps"] if s["stepPath"] == "summarize")["diff"]["output"] == (
        "--- original/summarize/output\n+++ new/summarize/output\n@@ -1 +1 @@\n-Lisbon wins.\n+Oslo loses."
    )


def test_a_fork_from_a_loop_visit_or_a_branch_reuses_what_came_before(workspace: Workspace, invocations: Path) -> None:
    original = start_run(workspace=workspace, workflow="rt_maze", input={"cities": ["Oslo", "Rome", "Lima"]})
    before = invocation_counts(invocations)

    outcome = _reexecute(workspace, original.run_id, "fork", "run_fork", from_step="fan[rome]")

    assert outcome.output == original.output
    assert invocation_counts(invocations) - before == Counter(
        {'tool weather {"city":"Rome"}': 1, 'tool weather {"city":"Lima"}': 1}
    )
    steps = {
        s["stepPath"]: s["action"]
        for s in mode_plan(workspace=workspace, run_id=original.run_id, mode="fork", from_step="draft.visit[1]")[
            "steps"
        ]
    }
    assert steps["draft.visit[0]"] == steps["gate.visit[0]"] == "reuse"
    assert steps["draft.visit[1]"] == steps["fan[oslo]"] == "live"


def test_a_rerun_runs_everything_live_again_under_a_new_run(workspace: Workspace, invocations: Path) -> None:
    original = _drill(workspace)
    before = invocation_counts(invocations)

    outcome = _reexecute(workspace, original, "rerun", "run_rerun")

    assert outcome.status == "completed"
    assert invocation_counts(invocations) - before == before  # every call once more
    events = run_events(workspace, "run_rerun")
    assert set(_origins(events)) == {"live"}
    assert Run.objects.get(workspace=workspace, run_id="run_rerun").replay_of == original


def test_resume_continues_the_original_run_and_in_doubt_calls_still_block(workspace: Workspace) -> None:
    demo_workflows.CRASH_ON_REFUND.add("C-3")
    with pytest.raises(demo_workflows.DemoCrash):
        start_run(
            workspace=workspace,
            workflow="support.refund",
            run_id="run_refund",
            input={"ticket": "Lost", "orderId": "C-3", "amount": 5},
        )
    claim = ToolGatewayClaim.objects.get(run__run_id="run_refund", tool_name="issue_refund")
    ToolGatewayClaim.objects.filter(pk=claim.pk).update(lease_expires_at=clock.now() - timedelta(seconds=1))
    settle_expired_claims(workspace=workspace, run_id="run_refund")
    with pytest.raises(ToolCallInDoubt):
        _reexecute(workspace, "run_refund", "resume", "run_ignored")
    assert not Run.objects.filter(run_id="run_ignored").exists()
    plan = mode_plan(workspace=workspace, run_id="run_refund", mode="resume")
    assert [c["source"] for s in plan["sessions"] for c in s["calls"] if c["kind"] == "tool"][-1] == "blocked"


def test_resume_mode_finishes_a_crashed_run_like_ledger_resume(workspace: Workspace, invocations: Path) -> None:
    drill = get_workflow("drill")
    crash = {"on": True}

    def finish(i: Any, o: Mapping[str, Any]) -> Any:
        if crash["on"]:
            raise Crash("killed in finish")
        return {"summary": o["summarize"], "notified": o["notify"]["id"]}

    register(replace(drill, steps=(*drill.steps[:-1], CodeRun("finish", finish))))
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow="drill", run_id="run_crashed", input=DRILL_INPUT)
    crash["on"] = False
    outcome = _reexecute(workspace, "run_crashed", "resume", "run_ignored")
    assert (outcome.run_id, outcome.status) == ("run_crashed", "completed")
    assert not Run.objects.filter(run_id="run_ignored").exists()


# --- durability ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["simulate", "evaluate", "fork"])
def test_a_killed_reexecution_resumes_the_same_new_run_without_repeating_a_committed_call(
    workspace: Workspace, invocations: Path, mode: str
) -> None:
    drill = get_workflow("drill")
    original = _drill(workspace)
    crash = {"on": True}

    def finish(i: Any, o: Mapping[str, Any]) -> Any:
        if crash["on"]:
            raise Crash("the worker was killed")
        return {"summary": o["summarize"], "notified": o["notify"]["id"]}

    register(replace(drill, steps=(*drill.steps[:-1], CodeRun("finish", finish))))
    before = invocation_counts(invocations)
    extra = {"from_step": "notify"} if mode == "fork" else {}
    with pytest.raises(Crash):
        _reexecute(workspace, original, mode, "run_new", **extra)
    after_crash = invocation_counts(invocations)
    written = len(run_events(workspace, "run_new"))
    crash["on"] = False

    outcome = _reexecute(workspace, original, mode, "run_new", **extra)
    again = _reexecute(workspace, original, mode, "run_new", **extra)  # finished: its recorded outcome

    assert outcome == again and outcome.status == "completed"
    assert invocation_counts(invocations) == after_crash  # nothing committed was asked again
    if mode == "simulate":
        assert after_crash == before
    events = run_events(workspace, "run_new")
    assert len(events) > written
    assert sum(e["type"] == "RunStarted" for e in events) == 1
    calls = [
        e["payload"]["callId"] for e in events if e["type"] in ("harness.model.called", "harness.tool_call.started")
    ]
    assert len(calls) == len(set(calls))


def test_a_new_run_of_another_request_is_refused_not_taken_over(workspace: Workspace, invocations: Path) -> None:
    original = _drill(workspace)
    _reexecute(workspace, original, "simulate", "run_new")
    with pytest.raises(ReexecutionConflict):
        execute_reexecution(
            workspace=workspace,
            original_run_id=original,
            mode="simulate",
            new_run_id="run_new",
            reexecution_id="another",
        )
    with pytest.raises(ReexecutionConflict):
        execute_reexecution(
            workspace=workspace,
            original_run_id="run_new",
            mode="rerun",
            new_run_id=original,
            reexecution_id="rx_run_new",
        )


# --- bad requests ----------------------------------------------------------------------------


def test_unknown_modes_steps_slots_and_providers_are_clear_errors_that_write_nothing(
    workspace: Workspace, invocations: Path
) -> None:
    original = _drill(workspace)
    cases = [
        ({"mode": "replay"}, InvalidReexecution, "unknown mode"),
        ({"mode": "fork", "from_step": "nope"}, UnknownStep, "no step 'nope'"),
        ({"mode": "fork"}, InvalidReexecution, "needs fromStep"),
        (
            {"mode": "evaluate", "model_overrides": {"fast": {"provider": "scripted", "model": "m"}}},
            InvalidReexecution,
            "no model slot 'fast'",
        ),
        (
            {"mode": "evaluate", "model_overrides": {"default": {"provider": "nope", "model": "m"}}},
            UnknownModelProvider,
            "no model provider named 'nope'",
        ),
        (
            {"mode": "simulate", "model_overrides": {"default": {"provider": "scripted", "model": "m"}}},
            InvalidReexecution,
            "takes no model overrides",
        ),
    ]
    for kwargs, error, message in cases:
        mode = kwargs.pop("mode")
        with pytest.raises(error, match=message):
            _reexecute(workspace, original, mode, "run_new", **kwargs)
    append(
        workspace=workspace,
        run_id="run_other",
        events=[{"type": "RunStarted", "payload": {"workflowVersionId": "x", "workflow": "gone"}}],
    )
    with pytest.raises(UnknownWorkflow, match="no workflow named 'gone'"):
        _reexecute(workspace, "run_other", "rerun", "run_new")
    assert not Run.objects.filter(run_id="run_new").exists()


def test_an_evaluation_through_the_built_in_scripted_provider_prices_the_other_model(
    workspace: Workspace, invocations: Path
) -> None:
    original = _drill(workspace)
    _reexecute(
        workspace,
        original,
        "evaluate",
        "run_eval",
        model_overrides={"default": {"provider": "scripted", "model": "gpt-4o-mini"}},
    )
    models = {
        (p["model"]["provider"], p["model"]["modelId"])
        for p in (e["payload"] for e in run_events(workspace, "run_eval") if e["type"] == "harness.model.responded")
    }
    assert models == {("scripted", "gpt-4o-mini")}


# --- spend -----------------------------------------------------------------------------------


def test_calls_served_from_the_record_are_never_counted_as_spend(workspace: Workspace, invocations: Path) -> None:
    from datetime import date, timedelta

    original = _drill(workspace)
    orig = Run.objects.get(workspace=workspace, run_id=original)
    _reexecute(workspace, original, "simulate", "run_sim")
    _reexecute(workspace, original, "fork", "run_fork", from_step="summarize")
    sim, fork = (Run.objects.get(workspace=workspace, run_id=r) for r in ("run_sim", "run_fork"))

    assert (sim.input_tokens, sim.priced_calls, sim.unpriced_calls) == (0, 0, 0)
    assert fork.input_tokens == 90 and fork.unpriced_calls == 1  # summarize only; scripted-1 has no price
    today = date.today()
    rows, total = usage_rows(
        group_by="day", start=today - timedelta(days=1), end=today + timedelta(days=1), workspace=workspace
    )
    assert total.input_tokens == orig.input_tokens + fork.input_tokens
    assert total.priced_calls + total.unpriced_calls == 5  # the original's four calls and the fork's one
    report = divergence_report(workspace=workspace, original_run_id=original, new_run_id="run_sim")
    assert report["new"]["replayedUsage"]["inputTokens"] == orig.input_tokens
    assert report["new"]["usage"]["inputTokens"] == 0


# --- the plan --------------------------------------------------------------------------------


def test_the_plan_lists_what_each_mode_reuses_runs_live_and_every_live_write_tool(workspace: Workspace) -> None:
    original = start_run(
        workspace=workspace,
        workflow="support.refund",
        input={"ticket": "Refund please", "orderId": "B-2", "amount": 12.5},
    ).run_id
    plans = {
        mode: mode_plan(workspace=workspace, run_id=original, mode=mode, from_step="refund")
        for mode in ("simulate", "evaluate", "fork", "rerun", "resume")
    }

    assert plans["simulate"]["liveWriteTools"] == plans["evaluate"]["liveWriteTools"] == []
    assert {s["action"] for s in plans["simulate"]["steps"]} == {"simulate"}
    assert {c["source"] for s in plans["simulate"]["sessions"] for c in s["calls"]} == {"record"}
    assert {(c["kind"], c["source"]) for s in plans["evaluate"]["sessions"] for c in s["calls"]} == {
        ("model", "live"),
        ("tool", "record"),
    }
    assert [(s["stepPath"], s["action"]) for s in plans["fork"]["steps"]] == [
        ("normalize", "reuse"),
        ("assess", "reuse"),
        ("refund", "live"),
    ]
    recorded = {
        "stepPath": "refund",
        "toolName": "issue_refund",
        "caller": "code",
        "source": "record",
        "callId": "refund:call",
        "args": {"orderId": "B-2", "amount": 12.5},
    }
    declared = {"stepPath": "refund", "toolName": "issue_refund", "caller": "code", "source": "workflow"}
    assert plans["fork"]["liveWriteTools"] == plans["rerun"]["liveWriteTools"] == [recorded, declared]
    assert plans["resume"]["liveWriteTools"] == []  # the run finished: nothing would run
    assert plans["fork"]["liveModelCalls"] and not plans["simulate"]["liveModelCalls"]
    # an external harness's run is planned from its record alone
    append(
        workspace=workspace,
        run_id="run_ext",
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "x"}},
            {
                "type": "harness.tool_call.started",
                "payload": {
                    "callId": "c1",
                    "caller": "model",
                    "toolName": "wire",
                    "args": {"usd": 5},
                    "effect": "write",
                    "stepPath": "pay",
                },
            },
        ],
    )
    external = mode_plan(workspace=workspace, run_id="run_ext", mode="rerun")
    assert external["workflowRegistered"] is False
    assert [(t["toolName"], t["args"]) for t in external["liveWriteTools"]] == [("wire", {"usd": 5})]
    assert canonical_json(mode_plan(workspace=workspace, run_id=original, mode="simulate")) == canonical_json(
        plans["simulate"]
    )


def test_calls_outside_any_step_are_served_as_the_mode_serves_every_call(workspace: Workspace) -> None:
    """A harness's calls with no stepPath (and an OpenTelemetry model call logged after its run
    ended under no step, docs/otlp.md "Late spans") were planned live whatever the mode: a simulation
    listed a live model call and a live write tool, for an external executor to make."""
    append(
        workspace=workspace,
        run_id="run_loose",
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "x"}},
            ev("harness.model.called", turn=1, callId="m1", promptHash="sha256:p", request={}),
            ev(
                "harness.model.responded",
                turn=1,
                callId="m1",
                model={"provider": "openai", "modelId": "gpt-4o"},
                response={"text": "pay", "usage": {"inputTokens": 10, "outputTokens": 2}},
            ),
            ev(
                "harness.tool_call.started",
                callId="t1",
                caller="model",
                toolName="wire",
                args={"usd": 5},
                effect="write",
            ),
            ev("harness.tool_call.succeeded", callId="t1", result={"ok": True}, durationMs=3),
            ev("RunCompleted"),
        ],
    )
    plans = {mode: mode_plan(workspace=workspace, run_id="run_loose", mode=mode) for mode in ("simulate", "evaluate")}
    assert plans["simulate"]["liveWriteTools"] == plans["evaluate"]["liveWriteTools"] == []
    assert [(c["kind"], c["source"]) for s in plans["simulate"]["sessions"] for c in s["calls"]] == [
        ("model", "record"),
        ("tool", "record"),
    ]
    assert [(c["kind"], c["source"]) for s in plans["evaluate"]["sessions"] for c in s["calls"]] == [
        ("model", "live"),
        ("tool", "record"),
    ]
    rerun = mode_plan(workspace=workspace, run_id="run_loose", mode="rerun")
    assert [(t["toolName"], t["args"]) for t in rerun["liveWriteTools"]] == [("wire", {"usd": 5})]


def test_a_simulation_replays_recorded_model_failures_and_their_retries(workspace: Workspace) -> None:
    from tests.runtime_workflows import SCRIPT, build_drill

    failures = {"left": 2}

    def flaky(request: Any) -> Any:
        if request.step_path == "research" and request.turn == 2 and failures["left"]:
            failures["left"] -= 1
            raise TimeoutError("the provider timed out")
        return SCRIPT[request.step_path][request.turn - 1]

    provider = ScriptedProvider(script=flaky)
    register(build_drill(provider=provider))
    try:
        original = start_run(workspace=workspace, workflow="drill", input=DRILL_INPUT)
        asked = len(provider.invocations)

        outcome = _reexecute(workspace, original.run_id, "simulate", "run_sim")
    finally:
        reset_registrations()

    assert (outcome.status, outcome.output) == ("completed", original.output)
    assert len(provider.invocations) == asked == 6  # 4 answers and 2 failures, all from the original
    failed = [e["payload"] for e in run_events(workspace, "run_sim") if e["type"] == "harness.model.failed"]
    assert [(f["callId"], f["origin"], f["error"]["name"]) for f in failed] == [
        ("research:turn2", "simulated", "TimeoutError"),
        ("research:turn2:retry1", "simulated", "TimeoutError"),
    ]
    report = divergence_report(workspace=workspace, original_run_id=original.run_id, new_run_id="run_sim")
    assert report["firstDivergence"] is None
