"""Decision loops, parallel groups, sub-workflows and retries: what they record, what a resume
reuses, and that every run they leave behind verifies."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

from ledger.fold import fold, next_visit_index
from ledger.models import Run, Workspace
from ledger.runtime.errors import UnknownWorkflow
from ledger.runtime.executor import resume_run, start_run, sub_run_id
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.registry import (
    AIGenerate,
    CodeRun,
    Decision,
    Parallel,
    SubWorkflow,
    Tool,
    ToolCall,
    Workflow,
    register,
)
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
)
from tests.runtime_support import (
    assert_verified as _verified,
)
from tests.runtime_support import (
    run_events as _events,
)
from tests.runtime_workflows import reset_registrations


def _step_events(events: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["payload"]["stepPath"] for e in events if e["type"] == kind]


# --- decisions --------------------------------------------------------------------------------


def _review_loop(
    calls: Counter[str], *, max_visits: int = 3, crash_on: int | None = None, approve_at: int = 3
) -> Workflow:
    def draft(run_input: Any, outputs: Mapping[str, Any]) -> dict[str, Any]:
        n = outputs.get("draft", {"n": 0})["n"] + 1
        calls["draft"] += 1
        if crash_on == n and calls["crashed"] == 0:
            calls["crashed"] += 1
            raise Crash()
        return {"n": n, "text": f"{run_input['topic']} v{n}"}

    def gate(run_input: Any, outputs: Mapping[str, Any]) -> str | None:
        return None if outputs["draft"]["n"] >= approve_at else "draft"

    return Workflow(
        name="review_loop",
        steps=(
            CodeRun("start", lambda i, o: {"topic": i["topic"]}),
            CodeRun("draft", draft),
            Decision("gate", gate, max_visits=max_visits, loop_to="draft"),
            CodeRun("publish", lambda i, o: o["draft"]["text"]),
        ),
    )


def test_decision_loop_records_every_visit_with_a_suffix_and_later_steps_see_the_newest(workspace: Workspace) -> None:
    outcome = start_run(workspace=workspace, workflow=_review_loop(Counter()), input={"topic": "tides"})

    assert (outcome.status, outcome.output) == ("completed", "tides v3")
    events = _events(workspace, outcome.run_id)
    assert _step_events(events, "StepCompleted") == [
        "start",
        "draft.visit[0]",
        "gate.visit[0]",
        "draft.visit[1]",
        "gate.visit[1]",
        "draft.visit[2]",
        "gate.visit[2]",
        "publish",
    ]
    targets = [
        e["payload"]["output"]
        for e in events
        if e["type"] == "StepCompleted" and e["payload"]["stepPath"].startswith("gate")
    ]
    assert targets == [{"target": "draft"}, {"target": "draft"}, {"target": None}]
    state = fold(events)
    assert [state.steps[f"draft.visit[{n}]"].visit for n in range(3)] == [0, 1, 2]
    assert next_visit_index(state, "draft", max_visits=3) == 3
    _verified(workspace, outcome.run_id)


def test_a_loop_past_max_visits_fails_with_max_visits_exceeded(workspace: Workspace) -> None:
    outcome = start_run(
        workspace=workspace, workflow=_review_loop(Counter(), max_visits=2, approve_at=5), input={"topic": "tides"}
    )

    assert outcome.status == "failed" and outcome.error["name"] == "max_visits_exceeded"
    events = _events(workspace, outcome.run_id)
    failed = [e["payload"] for e in events if e["type"] == "StepFailed"]
    assert [(f["stepPath"], f["error"]["name"], f["error"]["retriable"]) for f in failed] == [
        ("gate.visit[1]", "max_visits_exceeded", False)
    ]
    assert events[-1]["type"] == "RunFailed"
    _verified(workspace, outcome.run_id)


def test_resume_in_the_middle_of_a_loop_does_not_repeat_completed_visits(workspace: Workspace) -> None:
    calls: Counter[str] = Counter()
    with pytest.raises(Crash):
        start_run(
            workspace=workspace,
            workflow=_review_loop(calls, crash_on=2),
            input={"topic": "tides"},
            run_id="run_loop_crash",
        )
    assert calls["draft"] == 2

    outcome = resume_run(workspace=workspace, run_id="run_loop_crash", workflow=_review_loop(calls, crash_on=2))

    assert outcome.output == "tides v3"
    assert calls["draft"] == 4  # visit 0 reused; visit 1 (in flight) again; visit 2
    completed = _step_events(_events(workspace, "run_loop_crash"), "StepCompleted")
    assert completed.count("draft.visit[0]") == 1 and completed[-1] == "publish"
    _verified(workspace, "run_loop_crash")


def test_a_decision_can_skip_forward_and_rejects_an_undeclared_loop(workspace: Workspace) -> None:
    def wf(target: str) -> Workflow:
        return Workflow(
            name="skipper",
            steps=(
                CodeRun("a", lambda i, o: 1),
                Decision("route", lambda i, o: target),
                CodeRun("b", lambda i, o: 2),
                CodeRun("c", lambda i, o: 3),
            ),
        )

    skipped = start_run(workspace=workspace, workflow=wf("c"), input={})
    assert skipped.output == 3
    assert _step_events(_events(workspace, skipped.run_id), "StepCompleted") == ["a", "route", "c"]

    back = start_run(workspace=workspace, workflow=wf("a"), input={})
    assert back.status == "failed" and back.error["name"] == "invalid_route"
    _verified(workspace, skipped.run_id, back.run_id)


def test_loop_declarations_are_checked_when_the_workflow_is_defined() -> None:
    with pytest.raises(ValueError, match="not a step at or before it"):
        Workflow(name="bad", steps=(CodeRun("a", lambda i, o: 1), Decision("d", lambda i, o: None, loop_to="z")))
    with pytest.raises(ValueError, match="overlap"):
        Workflow(
            name="bad",
            steps=(
                CodeRun("a", lambda i, o: 1),
                Decision("d1", lambda i, o: None, loop_to="a"),
                Decision("d2", lambda i, o: None, loop_to="a"),
            ),
        )


# --- parallel groups --------------------------------------------------------------------------


def _fan(calls: Counter[str], items: Any, *, crash_on: str | None = None, max_branches: int = 16) -> Workflow:
    def square(item: Any, outputs: Mapping[str, Any]) -> Any:
        calls[str(item)] += 1
        if str(item) == crash_on and calls["crashed"] == 0:
            calls["crashed"] += 1
            raise Crash()
        return item * item

    return Workflow(
        name="fan",
        steps=(
            Parallel("fan", lambda i, o: items, CodeRun("square", square), max_branches=max_branches),
            CodeRun("total", lambda i, o: {"squares": o["fan"]}),
        ),
    )


def test_parallel_group_runs_each_item_as_a_branch_and_gathers_the_outputs(workspace: Workspace) -> None:
    listed = start_run(workspace=workspace, workflow=_fan(Counter(), [1, 2, 3]), input={})
    keyed = start_run(workspace=workspace, workflow=_fan(Counter(), {"a": 4, "b": 5}), input={})

    assert listed.output == {"squares": [1, 4, 9]}
    assert keyed.output == {"squares": {"a": 16, "b": 25}}
    events = _events(workspace, keyed.run_id)
    assert [e["type"] for e in events if e["type"].startswith("Parallel")] == [
        "ParallelGroupStarted",
        "ParallelBranchScheduled",
        "ParallelBranchScheduled",
        "ParallelBranchCompleted",
        "ParallelBranchCompleted",
        "ParallelGroupCompleted",
    ]
    assert _step_events(events, "StepCompleted") == ["fan[a]", "fan[b]", "fan", "total"]
    group = fold(events).parallel_groups["fan"]
    assert group.status == "completed" and group.branch_count == 2
    assert [(b.branch_path, b.item_key, b.status) for b in group.branches.values()] == [
        ("fan[a]", "a", "completed"),
        ("fan[b]", "b", "completed"),
    ]
    _verified(workspace, listed.run_id, keyed.run_id)


def test_more_items_than_max_branches_fail_the_step(workspace: Workspace) -> None:
    outcome = start_run(workspace=workspace, workflow=_fan(Counter(), [1, 2, 3], max_branches=2), input={})

    assert outcome.status == "failed" and outcome.error["name"] == "too_many_branches"
    assert "max_branches is 2" in outcome.error["message"]
    _verified(workspace, outcome.run_id)


def test_a_failed_branch_fails_the_group_and_the_run(workspace: Workspace) -> None:
    def check(item: Any, outputs: Mapping[str, Any]) -> Any:
        if item == "bad":
            raise ValueError("bad item")
        return item

    wf = Workflow(name="fan_fail", steps=(Parallel("fan", lambda i, o: ["ok", "bad"], CodeRun("check", check)),))
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed" and outcome.error["name"] == "BranchFailed"
    state = fold(_events(workspace, outcome.run_id))
    assert state.parallel_groups["fan"].status == "failed"
    assert state.parallel_groups["fan"].branches["fan[1]"].status == "failed"
    assert state.steps["fan"].status == "failed"
    _verified(workspace, outcome.run_id)


def test_resume_reuses_completed_branches(workspace: Workspace) -> None:
    calls: Counter[str] = Counter()
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=_fan(calls, [1, 2, 3], crash_on="2"), input={}, run_id="run_fan")

    outcome = resume_run(workspace=workspace, run_id="run_fan", workflow=_fan(calls, [1, 2, 3], crash_on="2"))

    assert outcome.output == {"squares": [1, 4, 9]}
    assert (calls["1"], calls["2"], calls["3"]) == (1, 2, 1)
    types = [e["type"] for e in _events(workspace, "run_fan")]
    assert types.count("ParallelBranchScheduled") == 3 and types.count("ParallelGroupStarted") == 1
    _verified(workspace, "run_fan")


def test_model_branches_each_get_their_own_session(workspace: Workspace) -> None:
    provider = ScriptedProvider(script=lambda r: {"text": f"about {r.body['messages'][-1]['content']}"})
    wf = Workflow(
        name="fan_ai",
        steps=(Parallel("ask", lambda i, o: {"x": "tides", "y": "moons"}, AIGenerate("q", lambda item, o: item)),),
        models={"default": provider},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.output == {"x": "about tides", "y": "about moons"}
    events = _events(workspace, outcome.run_id)
    assert [e["payload"]["stepPath"] for e in events if e["type"] == "harness.session.started"] == ["ask[x]", "ask[y]"]
    _verified(workspace, outcome.run_id)


# --- sub-workflows ----------------------------------------------------------------------------


@pytest.fixture
def child_workflows() -> Any:
    reset_registrations()
    seen: Counter[str] = Counter()

    def flaky_child(run_input: Any, outputs: Mapping[str, Any]) -> Any:
        seen[run_input["topic"]] += 1
        if run_input["topic"] == "crash" and seen["crash"] == 1:
            raise Crash()
        if run_input["topic"] == "broken":
            raise ValueError("the broken topic has no answer")
        return {"topic": run_input["topic"], "words": len(run_input["topic"])}

    register(Workflow(name="rt_research", steps=(CodeRun("read", flaky_child),)))
    yield seen
    reset_registrations()


def _orchestrator(allow_failure: bool) -> Workflow:
    return Workflow(
        name="orchestrator",
        steps=(
            Parallel(
                "fan",
                lambda i, o: i["topics"],
                SubWorkflow("research", "rt_research", lambda item, o: {"topic": item}, allow_failure=allow_failure),
            ),
            CodeRun("summary", lambda i, o: [r.get("words", r.get("status")) for r in o["fan"]]),
        ),
    )


def test_sub_workflow_is_its_own_run_reserved_in_the_parent_before_it_starts(
    workspace: Workspace, child_workflows: Counter[str]
) -> None:
    outcome = start_run(
        workspace=workspace, workflow=_orchestrator(False), input={"topics": ["tides", "sea"]}, run_id="run_orch"
    )

    assert outcome.output == [5, 3]
    events = _events(workspace, "run_orch")
    started = [e for e in events if e["type"] == "harness.tool_call.started"]
    child_ids = [e["payload"]["args"]["subRunId"] for e in started]
    assert child_ids == [sub_run_id("run_orch", "fan[0]"), sub_run_id("run_orch", "fan[1]")]
    assert {e["payload"]["caller"] for e in started} == {"workflow"}
    assert {e["payload"]["toolName"] for e in started} == {"workflow:rt_research"}
    for child_id in child_ids:
        child = Run.objects.get(workspace=workspace, run_id=child_id)
        assert (child.status, child.parent_run_id, child.root_run_id) == ("completed", "run_orch", "run_orch")
        assert _events(workspace, child_id)[0]["payload"]["parentRunId"] == "run_orch"
    # the reservation precedes the sub-run's first event, its outcome follows its last
    first_child = Run.objects.get(workspace=workspace, run_id=child_ids[0])
    succeeded = next(e for e in events if e["type"] == "harness.tool_call.succeeded")
    assert started[0]["recordedAt"] <= _events(workspace, child_ids[0])[0]["recordedAt"]
    assert succeeded["payload"]["result"] == {"topic": "tides", "words": 5} and first_child.status == "completed"
    assert succeeded["payload"]["stepPath"] == "fan[0]"
    _verified(workspace, "run_orch", *child_ids)


def test_a_failed_sub_run_fails_the_step_unless_failure_is_allowed(
    workspace: Workspace, child_workflows: Counter[str]
) -> None:
    topics = {"topics": ["tides", "broken", "sea", "moon", "wind"]}
    strict = start_run(workspace=workspace, workflow=_orchestrator(False), input=topics, run_id="run_strict")
    tolerant = start_run(
        workspace=workspace,
        workflow=Workflow(name="orchestrator_tolerant", steps=_orchestrator(True).steps),
        input=topics,
        run_id="run_tolerant",
    )

    assert strict.status == "failed" and strict.error["name"] == "BranchFailed"
    assert "the broken topic has no answer" in strict.error["message"]
    assert tolerant.status == "completed" and tolerant.output == [5, "failed", 3, 4, 4]
    children = Run.objects.filter(workspace=workspace, parent_run_id="run_tolerant")
    assert sorted(children.values_list("status", flat=True)) == ["completed"] * 4 + ["failed"]
    failed_call = next(
        e["payload"] for e in _events(workspace, "run_tolerant") if e["type"] == "harness.tool_call.failed"
    )
    assert failed_call["stepPath"] == "fan[1]" and "broken" in failed_call["error"]["message"]
    _verified(workspace, "run_strict", "run_tolerant", *children.values_list("run_id", flat=True))


def test_parent_resume_resumes_an_unfinished_sub_run(workspace: Workspace, child_workflows: Counter[str]) -> None:
    with pytest.raises(Crash):
        start_run(
            workspace=workspace,
            workflow=_orchestrator(False),
            input={"topics": ["tides", "crash"]},
            run_id="run_orch_crash",
        )
    child_id = sub_run_id("run_orch_crash", "fan[1]")
    assert Run.objects.get(workspace=workspace, run_id=child_id).status == "running"

    outcome = resume_run(workspace=workspace, run_id="run_orch_crash", workflow=_orchestrator(False))

    assert outcome.output == [5, 5]
    assert child_workflows == Counter({"tides": 1, "crash": 2})
    assert Run.objects.filter(workspace=workspace, parent_run_id="run_orch_crash").count() == 2
    assert [e["type"] for e in _events(workspace, child_id)].count("RunStarted") == 1
    _verified(workspace, "run_orch_crash", child_id)


# --- retries ----------------------------------------------------------------------------------


def test_a_step_with_retries_is_attempted_again_after_a_retriable_failure(workspace: Workspace) -> None:
    tries: Counter[str] = Counter()

    def shaky(run_input: Any, outputs: Mapping[str, Any]) -> str:
        tries["shaky"] += 1
        if tries["shaky"] < run_input["succeed_on"]:
            raise TimeoutError(f"try {tries['shaky']} timed out")
        return "ok"

    wf = Workflow(name="retrying", steps=(CodeRun("shaky", shaky, retries=2),))
    ok = start_run(workspace=workspace, workflow=wf, input={"succeed_on": 3})
    assert ok.output == "ok"
    events = _events(workspace, ok.run_id)
    assert [
        (e["type"], e["payload"].get("attempt"), e["payload"].get("error", {}).get("retriable"))
        for e in events
        if e["type"].startswith("Step")
    ] == [
        ("StepScheduled", None, None),
        ("StepAttemptStarted", 1, None),
        ("StepFailed", 1, True),
        ("StepAttemptStarted", 2, None),
        ("StepFailed", 2, True),
        ("StepAttemptStarted", 3, None),
        ("StepCompleted", 3, None),
    ]
    assert [a.status for a in fold(events).steps["shaky"].attempts] == ["failed", "failed", "completed"]

    tries.clear()
    out_of_tries = start_run(workspace=workspace, workflow=wf, input={"succeed_on": 9})
    assert out_of_tries.status == "failed" and out_of_tries.error["name"] == "TimeoutError"
    failed = [e["payload"] for e in _events(workspace, out_of_tries.run_id) if e["type"] == "StepFailed"]
    assert [(f["attempt"], f["error"]["retriable"]) for f in failed] == [(1, True), (2, True), (3, False)]
    _verified(workspace, ok.run_id, out_of_tries.run_id)


def test_a_failing_provider_is_recorded_and_asked_again_within_the_session(workspace: Workspace) -> None:
    failures = {"left": 2}

    def unreliable(request: ModelRequest) -> dict[str, Any]:
        if failures["left"]:
            failures["left"] -= 1
            raise ConnectionError("502 from the provider")
        return {"text": "fine"}

    provider = ScriptedProvider(script=unreliable)
    wf = Workflow(name="unreliable", steps=(AIGenerate("ask", "hello"),), models={"default": provider})
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.output == "fine" and len(provider.invocations) == 3
    events = _events(workspace, outcome.run_id)
    model = [
        (e["type"].rpartition(".")[2], e["payload"]["callId"]) for e in events if e["type"].startswith("harness.model")
    ]
    assert model == [
        ("called", "ask:turn1"),
        ("failed", "ask:turn1"),
        ("called", "ask:turn1:retry1"),
        ("failed", "ask:turn1:retry1"),
        ("called", "ask:turn1:retry2"),
        ("responded", "ask:turn1:retry2"),
    ]
    assert [c.status for c in fold(events).model_calls] == ["failed", "failed", "responded"]
    _verified(workspace, outcome.run_id)


def test_a_provider_that_keeps_failing_fails_the_attempt_and_the_step_retries_in_a_new_session(
    workspace: Workspace,
) -> None:
    provider = ScriptedProvider(script=lambda r: (_ for _ in ()).throw(ConnectionError("down")))
    wf = Workflow(name="down", steps=(AIGenerate("ask", "hello", retries=1),), models={"default": provider})
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed" and outcome.error["name"] == "ModelCallFailed"
    assert len(provider.invocations) == 6  # 3 tries in each of 2 attempts
    events = _events(workspace, outcome.run_id)
    assert [e["type"] for e in events].count("harness.session.failed") == 2
    assert [e["payload"]["callId"] for e in events if e["type"] == "harness.model.failed"][3:] == [
        "ask:attempt2:turn1",
        "ask:attempt2:turn1:retry1",
        "ask:attempt2:turn1:retry2",
    ]
    _verified(workspace, outcome.run_id)


def test_a_retried_tool_step_calls_the_tool_under_a_new_call_id(workspace: Workspace) -> None:
    tries: Counter[str] = Counter()

    def send(args: Any) -> Any:
        tries["send"] += 1
        if tries["send"] == 1:
            raise ConnectionError("smtp down")
        return {"sent": True}

    wf = Workflow(
        name="send_retry",
        steps=(ToolCall("send", "send", {"to": "ops"}, retries=1),),
        tools={"send": Tool("send", send, effect="write")},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.output == {"sent": True}
    calls = fold(_events(workspace, outcome.run_id)).tool_calls
    assert [(c.call_id, c.status) for c in calls.values()] == [
        ("send:call", "failed"),
        ("send:attempt2:call", "succeeded"),
    ]
    _verified(workspace, outcome.run_id)


def test_the_documented_example_runs_as_described(workspace: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    import ledger.runtime.registry as registry

    monkeypatch.setattr(registry, "_WORKFLOWS", dict(registry._WORKFLOWS))  # the example registers two
    doc = registry.__doc__ or ""
    example = "\n".join(line[4:] for line in doc[doc.index("    register(") : doc.index("\n`start_run(")].splitlines())
    exec(example, vars(registry).copy())  # registers research_topic and review

    outcome = start_run(workspace=workspace, workflow="review", input={"topics": ["tides", "moons"]})

    assert outcome.output == {"drafts": 3, "research": [{"topic": "tides", "words": 5}, {"topic": "moons", "words": 5}]}
    paths = _step_events(_events(workspace, outcome.run_id), "StepCompleted")
    assert paths == [
        "draft.visit[0]",
        "gate.visit[0]",
        "draft.visit[1]",
        "gate.visit[1]",
        "draft.visit[2]",
        "gate.visit[2]",
        "fan[0]",
        "fan[1]",
        "fan",
        "finish",
    ]
    children = list(
        Run.objects.filter(workspace=workspace, parent_run_id=outcome.run_id).values_list("run_id", flat=True)
    )
    assert len(children) == 2
    _verified(workspace, outcome.run_id, *children)


def test_a_workflow_output_function_that_raises_fails_the_run(workspace: Workspace) -> None:
    wf = Workflow(name="bad_output", steps=(CodeRun("a", lambda i, o: 1),), output=lambda i, o: o["missing"])
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed" and outcome.error["name"] == "KeyError"
    assert _events(workspace, outcome.run_id)[-1]["type"] == "RunFailed"
    _verified(workspace, outcome.run_id)


def test_an_empty_parallel_group_completes_with_no_branches(workspace: Workspace) -> None:
    outcome = start_run(workspace=workspace, workflow=_fan(Counter(), []), input={})

    assert outcome.output == {"squares": []}
    assert fold(_events(workspace, outcome.run_id)).parallel_groups["fan"].status == "completed"
    _verified(workspace, outcome.run_id)


def test_a_sub_workflow_not_registered_here_refuses_without_recording_a_failure(
    workspace: Workspace, child_workflows: Counter[str]
) -> None:
    wf = Workflow(name="orphan", steps=(SubWorkflow("sub", "not_registered_anywhere", {"x": 1}),))
    with pytest.raises(UnknownWorkflow):
        start_run(workspace=workspace, workflow=wf, input={}, run_id="run_orphan")

    types = [e["type"] for e in _events(workspace, "run_orphan")]
    assert types == ["RunStarted", "StepScheduled", "StepAttemptStarted"]  # resumable once it is deployed
    _verified(workspace, "run_orphan")


def test_an_item_key_too_long_for_a_step_path_fails_the_step(workspace: Workspace) -> None:
    outcome = start_run(workspace=workspace, workflow=_fan(Counter(), {"k" * 200: 1}), input={})

    assert outcome.status == "failed" and outcome.error["name"] == "InvalidItems"
