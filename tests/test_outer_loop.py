"""Outer loops (issue 15, Layer B): cycles as runs of their own, a supervise verdict recorded once
per cycle, the loop's state read back from the ledger, the reference's errors with their wording,
resume mid-cycle, one driver per loop, and `ledger loop start|resume|show`."""

from __future__ import annotations

import json
from decimal import Decimal
from io import StringIO
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from ledger.errors import Fenced
from ledger.log import append
from ledger.log.leases import LeaseHeld
from ledger.models import Run, Workspace
from ledger.runtime import outer_loop
from ledger.runtime.outer_loop import (
    OuterLoopGoalMismatch,
    OuterLoopManifestCorrupt,
    OuterLoopMaxCyclesMismatch,
    OuterLoopWithoutSupervisor,
    SuperviseContext,
    cycle_run_id,
    read_loop,
    record_run_id,
    register_supervisor,
    resume_outer_loop,
    start_outer_loop,
)
from ledger.runtime.registry import CodeRun, Workflow, get_workflow, register
from tests import loop_workflows
from tests.loop_workflows import SUPERVISE_CALLS, build_refine, reset_loop_registrations
from tests.runtime_support import Crash, every_run_verifies, run_events  # noqa: F401  (every_run_verifies is an autouse fixture)

INPUT = {"topic": "tides"}


@pytest.fixture(autouse=True)
def _registered() -> Any:
    reset_loop_registrations()
    yield
    reset_loop_registrations()


def _types(workspace: Workspace, run_id: str) -> list[str]:
    return [e["type"] for e in run_events(workspace, run_id)]


def _plans(workspace: Workspace, outer_loop_id: str, cycles: int) -> list[int]:
    """How often each cycle's `plan` step ran: its StepCompleted count (a step never runs twice)."""
    return [_types(workspace, cycle_run_id(outer_loop_id, n)).count("StepCompleted") for n in range(1, cycles + 1)]


def test_continue_continue_done_runs_three_cycles_each_a_run_and_supervises_three_times(workspace: Workspace) -> None:
    state = start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input=INPUT,
        goal="a tight paragraph",
        max_cycles=5,
        supervise="rt_until_third",
        outer_loop_id="ol_three",
    )

    assert state.status == "completed" and SUPERVISE_CALLS == [1, 2, 3]
    assert state.result == {"kind": "done", "finalOutput": {"text": "draft 3", "cycles": 3}}
    assert [(c.cycle_number, c.status, c.output, c.supervise["kind"]) for c in state.cycles] == [
        (1, "completed", "draft 1", "continue"),
        (2, "completed", "draft 2", "continue"),
        (3, "completed", "draft 3", "done"),
    ]
    assert state.pending is None
    # each cycle is a run of its own, started with the loop's id
    for n in (1, 2, 3):
        started = run_events(workspace, cycle_run_id("ol_three", n))[0]["payload"]
        assert started["outerLoopId"] == "ol_three" and started["label"] == f"ol_three cycle {n}"
    second = run_events(workspace, cycle_run_id("ol_three", 2))[0]["payload"]["input"]
    assert second == {
        "goal": "a tight paragraph",
        "input": INPUT,
        "cycleNumber": 2,
        "maxCycles": 5,
        "promptNote": "sharper than draft 1",
        "previousOutput": "draft 1",
    }
    # the loop's facts are events of its record: the goal, one verdict per cycle, the end
    record = run_events(workspace, record_run_id("ol_three"))
    assert [e["type"] for e in record] == [
        "RunStarted",
        "OuterLoopCycleCompleted",
        "OuterLoopCycleCompleted",
        "OuterLoopCycleCompleted",
        "RunCompleted",
    ]
    assert record[0]["payload"]["outerLoop"] == {
        "goal": {
            "workflow": "rt_refine",
            "workflowDefinitionHash": build_refine().version,
            "workflowVersionId": build_refine().version_id,
            "description": "a tight paragraph",
        },
        "maxCycles": 5,
        "supervise": "rt_until_third",
    }
    assert record[3]["payload"] == {
        "outerLoopId": "ol_three",
        "cycleNumber": 3,
        "runId": cycle_run_id("ol_three", 3),
        "supervise": {"kind": "done", "finalOutput": {"text": "draft 3", "cycles": 3}},
    }
    assert record[4]["sequence"] == 5 and record[4]["payload"]["output"] == {"text": "draft 3", "cycles": 3}
    # usage and cost summed across the cycles (each cycle: one gpt-4o call of 1000 in, 100 out)
    runs = Run.objects.filter(run_id__in=[cycle_run_id("ol_three", n) for n in (1, 2, 3)])
    assert state.usage.input_tokens == 3000 and state.usage.output_tokens == 300
    assert state.usage.cost_usd == sum((r.cost_usd for r in runs), Decimal(0)) and state.usage.cost_usd > 0
    assert state.to_json()["usage"]["pricedCalls"] == 3
    # a finished loop asked again neither runs nor supervises anything
    again = resume_outer_loop(workspace=workspace, outer_loop_id="ol_three")
    assert again.to_json() == state.to_json() and SUPERVISE_CALLS == [1, 2, 3]
    assert _plans(workspace, "ol_three", 3) == [2, 2, 2]  # plan and draft, once each


def test_always_continuing_is_exhausted_with_the_reference_wording(workspace: Workspace) -> None:
    state = start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input=INPUT,
        max_cycles=3,
        supervise="rt_never_done",
        outer_loop_id="ol_tired",
    )

    assert state.status == "failed" and SUPERVISE_CALLS == [1, 2, 3]
    assert state.error == {
        "name": "OuterLoopExhausted",
        "causeCode": "outer_loop_exhausted",
        "message": "Outer loop exhausted after 3 cycles (outerLoopId: ol_tired).",
    }
    assert [c.supervise for c in state.cycles] == [{"kind": "continue"}] * 3 and state.pending is None
    assert _types(workspace, record_run_id("ol_tired"))[-2:] == ["OuterLoopCycleCompleted", "RunFailed"]
    assert not Run.objects.filter(run_id=cycle_run_id("ol_tired", 4)).exists()


def test_a_new_loop_id_is_an_ol_id(workspace: Workspace) -> None:
    state = start_outer_loop(workspace=workspace, workflow="rt_refine", input=INPUT, max_cycles=1)
    assert state.outer_loop_id.startswith("ol_") and state.status == "completed"
    # with one cycle and no adapter, the cycle's output is the result
    assert state.result == {"kind": "done", "finalOutput": "draft 1"} and SUPERVISE_CALLS == []


def test_more_than_one_cycle_without_a_supervise_adapter_is_refused_up_front(workspace: Workspace) -> None:
    with pytest.raises(OuterLoopWithoutSupervisor) as refused:
        start_outer_loop(workspace=workspace, workflow="rt_refine", input=INPUT, max_cycles=2, outer_loop_id="ol_alone")
    assert refused.value.code == "outer_loop_requested_without_supervise_adapter"
    assert refused.value.message.startswith("outer_loop_requested_without_supervise_adapter — maxOuterCycles=2 ")
    assert not Run.objects.exists()


def test_each_mismatch_is_refused_with_its_text_and_writes_nothing(workspace: Workspace) -> None:
    start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input=INPUT,
        max_cycles=3,
        supervise="rt_until_third",
        outer_loop_id="ol_same",
    )
    before = Run.objects.get(run_id=record_run_id("ol_same")).last_sequence

    with pytest.raises(OuterLoopMaxCyclesMismatch) as cycles:
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=5,
            supervise="rt_until_third",
            outer_loop_id="ol_same",
        )
    assert cycles.value.code == "outer_loop_max_cycles_mismatch"
    assert cycles.value.message == (
        "outer_loop_max_cycles_mismatch — existing outer loop 'ol_same' was started with "
        "maxCycles=3, caller now passed maxOuterCycles=5."
    )

    old = build_refine().version
    changed = Workflow(name="rt_refine", steps=(CodeRun("plan", lambda i, o: {"other": True}),))
    register(changed)
    with pytest.raises(OuterLoopGoalMismatch) as goal:
        resume_outer_loop(workspace=workspace, outer_loop_id="ol_same")
    assert goal.value.code == "outer_loop_goal_mismatch"
    assert goal.value.message == (
        "outer_loop_goal_mismatch — existing outer loop 'ol_same' was started with "
        f"workflowDefinitionHash={old}, caller now passed {changed.version}."
    )
    reset_loop_registrations()
    with pytest.raises(OuterLoopGoalMismatch, match='was started with description="", caller now passed "other"'):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=3,
            goal="other",
            supervise="rt_until_third",
            outer_loop_id="ol_same",
        )
    with pytest.raises(OuterLoopGoalMismatch, match="was started with input sha256:"):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input={"topic": "moons"},
            max_cycles=3,
            supervise="rt_until_third",
            outer_loop_id="ol_same",
        )
    assert Run.objects.get(run_id=record_run_id("ol_same")).last_sequence == before

    # a record that ended done without a cycle (written by someone else through the API)
    append(
        workspace=workspace,
        run_id=record_run_id("ol_broken"),
        events=[
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "outer_loop:x",
                    "outerLoopId": "ol_broken",
                    "input": INPUT,
                    "outerLoop": {
                        "goal": {"workflow": "rt_refine", "workflowDefinitionHash": old, "description": ""},
                        "maxCycles": 3,
                        "supervise": "rt_until_third",
                    },
                },
            },
            {"type": "RunCompleted", "payload": {"output": "out of nowhere"}},
        ],
    )
    with pytest.raises(OuterLoopManifestCorrupt) as corrupt:
        resume_outer_loop(workspace=workspace, outer_loop_id="ol_broken")
    assert corrupt.value.code == "outer_loop_manifest_corrupt"
    assert corrupt.value.message == (
        "outer_loop_manifest_corrupt — existing outer loop 'ol_broken' has result.kind='done' but cycles is empty."
    )
    assert not Run.objects.filter(run_id=cycle_run_id("ol_broken", 1)).exists()


def test_corrupt_records_of_other_shapes_are_refused_too(workspace: Workspace) -> None:
    append(
        workspace=workspace,
        run_id=record_run_id("ol_gap"),
        events=[
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "outer_loop:x",
                    "outerLoopId": "ol_gap",
                    "input": INPUT,
                    "outerLoop": {
                        "goal": {"workflow": "rt_refine", "workflowDefinitionHash": build_refine().version},
                        "maxCycles": 3,
                    },
                },
            },
            {
                "type": "OuterLoopCycleCompleted",
                "payload": {"outerLoopId": "ol_gap", "cycleNumber": 2, "supervise": {"kind": "continue"}},
            },
        ],
    )
    with pytest.raises(OuterLoopManifestCorrupt, match="records cycle 2 where cycle 1 was due"):
        read_loop(workspace, "ol_gap")
    append(
        workspace=workspace,
        run_id="run_ol_plain",
        events=[{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_plain"}}],
    )
    with pytest.raises(OuterLoopManifestCorrupt, match="has no goal"):
        read_loop(workspace, "ol_plain")


def test_killed_between_a_cycles_run_finishing_and_its_verdict_resumes_without_running_the_cycle_again(
    workspace: Workspace,
) -> None:
    crashed = []

    def dies_on_second(ctx: SuperviseContext) -> dict[str, Any]:
        if ctx.cycle_number == 2 and not crashed:
            crashed.append(ctx.cycle_number)
            raise Crash()  # the driver dies: cycle 2's run is over, its verdict not recorded
        return loop_workflows.until_third(ctx)

    register_supervisor("rt_dies_on_second", dies_on_second)
    with pytest.raises(Crash):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=4,
            supervise="rt_dies_on_second",
            outer_loop_id="ol_crash",
        )
    assert _types(workspace, cycle_run_id("ol_crash", 2))[-1] == "RunCompleted"
    midway = read_loop(workspace, "ol_crash")
    assert [c.supervise is not None for c in midway.cycles] == [True, False]
    assert midway.pending is not None and midway.pending.run_id == cycle_run_id("ol_crash", 2)
    assert midway.to_json()["pendingCycleRunId"] == cycle_run_id("ol_crash", 2)

    state = resume_outer_loop(workspace=workspace, outer_loop_id="ol_crash")

    assert state.status == "completed" and len(state.cycles) == 3
    assert SUPERVISE_CALLS == [1, 2, 3]  # cycle 2's verdict asked once more, since none was committed
    assert _plans(workspace, "ol_crash", 3) == [2, 2, 2]  # no cycle ran twice
    assert [e["type"] for e in run_events(workspace, cycle_run_id("ol_crash", 2))].count("RunStarted") == 1


def test_killed_inside_a_cycle_resumes_that_cycles_run(workspace: Workspace) -> None:
    calls: list[int] = []

    def reply(request: Any) -> dict[str, Any]:
        if "Cycle 2 " in request.body["messages"][-1]["content"] and not calls:
            calls.append(2)
            raise Crash()  # the driver dies in cycle 2's model call, its plan step committed
        return loop_workflows.refine_reply(request)

    get_workflow("rt_refine").models["default"].script = reply  # type: ignore[attr-defined]
    with pytest.raises(Crash):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=3,
            supervise="rt_until_third",
            outer_loop_id="ol_mid",
        )
    pending = read_loop(workspace, "ol_mid").pending
    assert pending is not None and (pending.cycle_number, pending.status) == (2, "running")

    state = resume_outer_loop(workspace=workspace, outer_loop_id="ol_mid")

    assert state.status == "completed" and SUPERVISE_CALLS == [1, 2, 3]
    assert _plans(workspace, "ol_mid", 3) == [2, 2, 2]
    assert _types(workspace, cycle_run_id("ol_mid", 2)).count("RunStarted") == 1


def test_two_drivers_of_one_loop_the_second_is_refused_and_a_takeover_fences_the_first(workspace: Workspace) -> None:
    seen: dict[str, Any] = {}

    def second_driver_arrives(ctx: SuperviseContext) -> dict[str, Any]:
        if ctx.cycle_number == 1 and "refused" not in seen:
            # while driver A holds the loop (it is supervising cycle 1), driver B comes
            with pytest.raises(LeaseHeld) as refused:
                resume_outer_loop(workspace=workspace, outer_loop_id="ol_two", supervise="rt_until_third")
            seen["refused"] = refused.value.code
            seen["taken"] = resume_outer_loop(
                workspace=workspace, outer_loop_id="ol_two", supervise="rt_until_third", take_over=True
            )
        return {"kind": "continue", "promptNote": "from the first driver"}

    register_supervisor("rt_first_driver", second_driver_arrives)
    with pytest.raises(Fenced):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=3,
            supervise="rt_first_driver",
            outer_loop_id="ol_two",
        )

    assert seen["refused"] == "run_leased"
    taken = seen["taken"]
    assert taken.status == "completed" and len(taken.cycles) == 3
    # the first driver's verdict never landed: every recorded one is the second driver's
    record = run_events(workspace, record_run_id("ol_two"))
    verdicts = [e["payload"]["supervise"] for e in record if e["type"] == "OuterLoopCycleCompleted"]
    assert [v.get("promptNote") for v in verdicts] == ["sharper than draft 1", "sharper than draft 2", None]
    assert SUPERVISE_CALLS == [1, 2, 3] and _plans(workspace, "ol_two", 3) == [2, 2, 2]


def test_the_cli_starts_shows_and_resumes_a_loop(workspace: Workspace) -> None:
    out, err = StringIO(), StringIO()
    call_command(
        "ledger",
        "loop",
        "start",
        "rt_refine",
        "--input",
        json.dumps(INPUT),
        "--workspace",
        "acme/support",
        "--max-cycles",
        "4",
        "--goal",
        "tight",
        "--supervise",
        "rt_until_third",
        "--loop-id",
        "ol_cli",
        "--module",
        "tests.loop_workflows",
        stdout=out,
        stderr=err,
    )
    lines = out.getvalue().splitlines()
    assert lines[0] == "ol_cli" and "outer loop ol_cli done after 3 cycles" in err.getvalue()
    assert json.loads(lines[-1])["result"] == {"kind": "done", "finalOutput": {"text": "draft 3", "cycles": 3}}

    shown = StringIO()
    call_command("ledger", "loop", "show", "ol_cli", stdout=shown)
    state = json.loads(shown.getvalue())
    assert [(c["cycleNumber"], c["runId"], c["status"], c["supervise"]["kind"]) for c in state["cycles"]] == [
        (1, "run_ol_cli_c1", "completed", "continue"),
        (2, "run_ol_cli_c2", "completed", "continue"),
        (3, "run_ol_cli_c3", "completed", "done"),
    ]
    assert state["goal"]["description"] == "tight" and state["maxCycles"] == 4 and "pendingCycleRunId" not in state
    assert state["usage"]["inputTokens"] == 3000

    resumed = StringIO()
    call_command("ledger", "loop", "resume", "ol_cli", "--workspace", "acme/support", stdout=resumed, stderr=StringIO())
    assert json.loads(resumed.getvalue())["status"] == "completed" and SUPERVISE_CALLS == [1, 2, 3]

    with pytest.raises(CommandError, match="outer_loop_max_cycles_mismatch — existing outer loop 'ol_cli'"):
        call_command(
            "ledger",
            "loop",
            "start",
            "rt_refine",
            "--input",
            json.dumps(INPUT),
            "--workspace",
            "acme/support",
            "--max-cycles",
            "2",
            "--supervise",
            "rt_until_third",
            "--loop-id",
            "ol_cli",
            stdout=StringIO(),
            stderr=StringIO(),
        )
    with pytest.raises(CommandError, match="outer_loop_requested_without_supervise_adapter"):
        call_command(
            "ledger",
            "loop",
            "start",
            "rt_refine",
            "--input",
            "{}",
            "--workspace",
            "acme/support",
            "--max-cycles",
            "2",
            stdout=StringIO(),
            stderr=StringIO(),
        )
    with pytest.raises(CommandError, match="must match"):
        call_command("ledger", "loop", "show", "not-a-loop", stdout=StringIO())


def test_the_cli_exits_1_on_an_exhausted_loop(workspace: Workspace) -> None:
    err = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "ledger",
            "loop",
            "start",
            "rt_refine",
            "--input",
            "{}",
            "--workspace",
            "acme/support",
            "--max-cycles",
            "2",
            "--supervise",
            "rt_never_done",
            "--loop-id",
            "ol_cli_tired",
            stdout=StringIO(),
            stderr=err,
        )
    assert exited.value.code == 1
    assert "outer_loop_exhausted: Outer loop exhausted after 2 cycles (outerLoopId: ol_cli_tired)." in err.getvalue()


def test_an_invalid_verdict_records_nothing_and_the_loop_stays_resumable(workspace: Workspace) -> None:
    register_supervisor("rt_confused", lambda ctx: {"kind": "maybe"})
    with pytest.raises(outer_loop.SuperviseFailed, match="answered"):
        start_outer_loop(
            workspace=workspace,
            workflow="rt_refine",
            input=INPUT,
            max_cycles=2,
            supervise="rt_confused",
            outer_loop_id="ol_confused",
        )
    assert _types(workspace, record_run_id("ol_confused")) == ["RunStarted"]
    state = resume_outer_loop(workspace=workspace, outer_loop_id="ol_confused", supervise="rt_until_third")
    assert [c.supervise["kind"] for c in state.cycles] == ["continue", "continue"]  # type: ignore[index]
    assert state.status == "failed" and _plans(workspace, "ol_confused", 2) == [2, 2]
