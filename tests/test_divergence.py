"""The divergence report: a re-execution's run against its original, step by step, from the two
logs through the fold (ledger/replay/divergence.py)."""

from __future__ import annotations

from dataclasses import replace
from decimal import Decimal
from typing import Any

import pytest

from ledger.errors import NotFound
from ledger.models import Run, Workspace
from ledger.replay.divergence import divergence_report
from ledger.runtime.executor import start_run
from ledger.runtime.reexecute import execute_reexecution
from ledger.runtime.registry import CodeRun, get_workflow, register
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: every run verifies)

TRIAGE_INPUT = {"ticket": "Where is my parcel?", "orderId": "A-1"}


@pytest.fixture
def restore_triage() -> Any:
    triage = get_workflow("support.triage")
    yield triage
    register(triage)


def _report(workspace: Workspace, original: str, new: str) -> dict[str, Any]:
    return divergence_report(workspace=workspace, original_run_id=original, new_run_id=new)


def _simulate(workspace: Workspace, original: str, new: str = "run_sim") -> None:
    execute_reexecution(
        workspace=workspace, original_run_id=original, mode="simulate", new_run_id=new, reexecution_id="rx_1"
    )


def test_a_faithful_simulation_is_identical_step_by_step_and_costs_nothing_beside_the_original(
    workspace: Workspace,
) -> None:
    original = start_run(workspace=workspace, workflow="support.triage", input=TRIAGE_INPUT).run_id
    _simulate(workspace, original)

    report = _report(workspace, original, "run_sim")

    assert report["firstDivergence"] is None
    assert report["counts"] == {"identical": 3, "changed": 0, "new": 0, "missing": 0}
    assert [s["stepPath"] for s in report["steps"]] == ["normalize", "draft", "confirm"]
    assert all(s["diff"] == {"output": None, "modelOutputs": None, "toolResults": None} for s in report["steps"])
    run = Run.objects.get(workspace=workspace, run_id=original)
    before, after = report["original"], report["new"]
    assert before["costUsd"] == pytest.approx(float(run.cost_usd)) and before["costUsd"] > 0
    assert (after["costUsd"], after["usage"]["inputTokens"]) == (0, 0)
    assert after["replayedCostUsd"] == pytest.approx(before["costUsd"])
    assert (after["replayOf"], after["reexecutionId"], before["replayOf"]) == (original, "rx_1", None)
    assert before["durationMs"] >= 0 and after["durationMs"] >= 0
    draft = next(s for s in report["steps"] if s["stepPath"] == "draft")
    assert [m["origin"] for m in draft["new"]["modelCalls"]] == ["simulated", "simulated"]
    assert [m["origin"] for m in draft["original"]["modelCalls"]] == ["live", "live"]
    assert draft["new"]["modelCalls"][1]["text"] == draft["original"]["modelCalls"][1]["text"]
    assert draft["new"]["modelCalls"][0]["replayOf"].startswith("evt_")
    assert draft["original"]["costUsd"] == pytest.approx(draft["new"]["replayedCostUsd"])
    assert Decimal(str(draft["new"]["costUsd"])) == 0


def test_a_step_the_new_code_adds_is_new_and_the_first_divergence(workspace: Workspace, restore_triage: Any) -> None:
    original = start_run(workspace=workspace, workflow="support.triage", input=TRIAGE_INPUT).run_id
    register(
        replace(
            restore_triage,
            steps=(*restore_triage.steps[:2], CodeRun("tag", lambda i, o: {"tag": "parcel"}), restore_triage.steps[2]),
        )
    )
    _simulate(workspace, original)

    report = _report(workspace, original, "run_sim")

    assert [(s["stepPath"], s["status"]) for s in report["steps"]] == [
        ("normalize", "identical"),
        ("draft", "identical"),
        ("tag", "new"),
        ("confirm", "identical"),
    ]
    assert report["firstDivergence"] == "tag"
    tag = report["steps"][2]
    assert tag["original"] is None and tag["new"]["output"] == {"tag": "parcel"}


def test_a_changed_output_carries_a_unified_diff_and_a_step_that_never_ran_is_missing(
    workspace: Workspace, restore_triage: Any
) -> None:
    original = start_run(workspace=workspace, workflow="support.triage", input=TRIAGE_INPUT).run_id
    normalize = restore_triage.steps[0]
    register(
        replace(
            restore_triage,
            steps=(
                CodeRun("normalize", lambda i, o: {**normalize.fn(i, o), "ticket": "WHERE IS MY PARCEL?"}),
                *restore_triage.steps[1:],
            ),
        )
    )
    _simulate(workspace, original)

    report = _report(workspace, original, "run_sim")

    assert [(s["stepPath"], s["status"]) for s in report["steps"]] == [
        ("normalize", "changed"),
        ("draft", "changed"),
        ("confirm", "missing"),
    ]
    assert report["firstDivergence"] == "normalize"
    diff = report["steps"][0]["diff"]["output"]
    assert '-    "ticket": "Where is my parcel?"' in diff and '+    "ticket": "WHERE IS MY PARCEL?"' in diff
    assert report["steps"][0]["changes"] == ["output"]
    # the new prompt is not the recorded one: the simulation stopped there rather than call a model
    assert [(d["stepPath"], d["reason"]) for d in report["divergences"]] == [("draft", "request_changed")]
    assert report["steps"][1]["new"]["status"] == "failed" and report["new"]["status"] == "failed"
    assert report["steps"][2]["new"] is None


def test_sub_runs_compare_by_where_they_were_started_not_by_their_ids(workspace: Workspace) -> None:
    original = start_run(
        workspace=workspace,
        workflow="research.orchestrator",
        input={"topics": ["pricing pages", "restricted market data"]},
    ).run_id
    _simulate(workspace, original)

    report = _report(workspace, original, "run_sim")

    assert report["firstDivergence"] is None
    fan = next(s for s in report["steps"] if s["stepPath"] == "fan[1]")
    old_args, new_args = fan["original"]["toolCalls"][0]["args"], fan["new"]["toolCalls"][0]["args"]
    assert old_args["subRunId"] != new_args["subRunId"]  # shown as recorded, compared as the same sub-run


def test_the_report_is_scoped_to_the_workspace(workspace: Workspace, other_workspace: Workspace) -> None:
    original = start_run(workspace=workspace, workflow="support.triage", input=TRIAGE_INPUT).run_id
    _simulate(workspace, original)
    with pytest.raises(NotFound):
        _report(other_workspace, original, "run_sim")
    with pytest.raises(NotFound):
        _report(workspace, original, "run_missing")
