"""Parallel groups run their branches concurrently (issue 15): each branch on a thread of its own
with its own database connection, every write through the run's one recorder under its fencing
token, so the log stays dense; a failed branch stops the group's unstarted branches unless the
group allows failure; the process's thread cap is a setting. The timing of a group of sleeping
branches is measured in bench/runtime.py; here concurrency is asserted structurally (a barrier
every branch must reach while the others are still in their tool)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import pytest
from django.test import override_settings

from ledger.fold import fold
from ledger.models import Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.registry import CodeRun, Parallel, Tool, ToolCall, Workflow
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies, run_events as _events, assert_verified as _verified,
)

pytestmark = pytest.mark.django_db(transaction=True)


def _barrier_fan(parties: int, branches: int, *, max_concurrency: int) -> Workflow:
    """A group of `branches` tool calls whose tool waits at a barrier of `parties`: it completes only
    if that many calls are in the tool at the same time (a broken barrier fails the call)."""
    barrier = threading.Barrier(parties, timeout=60)

    def wait(args: Any) -> dict[str, Any]:
        # each of the parties waiting together gets its own index; a lone caller breaks the barrier
        return {"item": args["item"], "met": barrier.wait()}

    wf = Workflow(name="fan_barrier", steps=(
        Parallel("fan", lambda i, o: [{"item": n} for n in range(branches)],
                 ToolCall("meet", "meet", lambda item, o: item), max_concurrency=max_concurrency),
        CodeRun("count", lambda i, o: len({r["met"] for r in o["fan"]})),
    ), tools={"meet": Tool("meet", wait, effect="read", timeout_s=120)})
    return wf


def test_eight_branches_are_in_their_tools_at_the_same_time_and_the_log_stays_dense(workspace: Workspace) -> None:
    wf = _barrier_fan(8, 8, max_concurrency=8)

    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed", outcome.error
    assert outcome.output == 8  # eight calls, all inside the tool together
    events = _events(workspace, outcome.run_id)
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    state = fold(events)
    assert state.parallel_groups["fan"].status == "completed"
    assert sorted(b.status for b in state.parallel_groups["fan"].branches.values()) == ["completed"] * 8
    started = next(e for e in events if e["type"] == "ParallelGroupStarted")["payload"]
    assert (started["maxConcurrency"], started["failureMode"]) == (8, "fail_fast")
    # each branch's facts are whole: its step's start, its call's claim and outcome, its end
    for n in range(8):
        mine = [e["type"] for e in events if e["payload"].get("stepPath") == f"fan[{n}]"
                or e["payload"].get("branchPath") == f"fan[{n}]"]
        assert mine == ["ParallelBranchScheduled", "StepScheduled", "StepAttemptStarted", "harness.tool_call.started",
                        "harness.tool_call.succeeded", "StepCompleted", "ParallelBranchCompleted"]
    _verified(workspace, outcome.run_id)


def test_the_group_cap_bounds_the_branches_in_flight(workspace: Workspace) -> None:
    # Four branches, two at a time: a barrier of two is met twice; one of three would never be.
    wf = _barrier_fan(2, 4, max_concurrency=2)
    assert start_run(workspace=workspace, workflow=wf, input={}).status == "completed"

    wf = _barrier_fan(3, 3, max_concurrency=2)
    wf = Workflow(name="fan_barrier3", steps=wf.steps, tools={
        "meet": Tool("meet", _broken_barrier_tool(3), effect="read", timeout_s=120)})
    outcome = start_run(workspace=workspace, workflow=wf, input={})
    assert outcome.status == "failed" and "BrokenBarrierError" in outcome.error["message"]


def _broken_barrier_tool(parties: int) -> Any:
    barrier = threading.Barrier(parties, timeout=1)

    def meet(args: Any) -> dict[str, Any]:
        return {"item": args["item"], "met": barrier.wait()}
    return meet


@override_settings(RUNLEDGER_PARALLEL_THREADS=1)
def test_the_process_setting_caps_the_threads_of_every_group(workspace: Workspace) -> None:
    seen: list[str] = []

    def square(item: Any, outputs: Mapping[str, Any]) -> Any:
        seen.append(threading.current_thread().name)
        return item * item

    wf = Workflow(name="fan_one_thread", steps=(
        Parallel("fan", lambda i, o: [1, 2, 3], CodeRun("square", square), max_concurrency=3),))
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.output == [1, 4, 9]
    assert set(seen) == {threading.current_thread().name}  # every branch in the executor's own thread


def _gate_fan(workspace: Workspace, run_id: str, *, allow_failure: bool) -> tuple[Workflow, list[Any]]:
    """Branch 0 fails at once; branch 1 holds its thread until branch 0's failure is on the log;
    branches 2 and 3 can only start after that (two threads)."""
    ran: list[Any] = []
    one_runs = threading.Event()

    def work(item: Any, outputs: Mapping[str, Any]) -> Any:
        ran.append(item)
        if item == 0:
            # Not before branch 1 runs: on a loaded machine its thread may not have started yet.
            assert one_runs.wait(60)
            raise ValueError("branch zero breaks")
        if item == 1:
            one_runs.set()
            for _ in range(6000):
                if any(e["type"] == "ParallelBranchFailed" for e in _events(workspace, run_id)):
                    break
                time.sleep(0.01)
        return item * 10

    wf = Workflow(name=f"fan_gate_{allow_failure}", steps=(
        Parallel("fan", lambda i, o: [0, 1, 2, 3], CodeRun("work", work), max_concurrency=2,
                 allow_failure=allow_failure),))
    return wf, ran


def test_a_failed_branch_with_allow_failure_does_not_stop_its_siblings(workspace: Workspace) -> None:
    wf, ran = _gate_fan(workspace, "run_gate_allow", allow_failure=True)

    outcome = start_run(workspace=workspace, workflow=wf, input={}, run_id="run_gate_allow")

    assert outcome.status == "completed"
    assert outcome.output == [{"status": "failed", "error": {"name": "ValueError", "message": "branch zero breaks"}},
                              10, 20, 30]
    assert sorted(ran) == [0, 1, 2, 3]
    events = _events(workspace, outcome.run_id)
    group = fold(events).parallel_groups["fan"]
    assert group.status == "completed"
    assert {p: b.status for p, b in group.branches.items()} == {
        "fan[0]": "failed", "fan[1]": "completed", "fan[2]": "completed", "fan[3]": "completed"}
    assert next(e for e in events if e["type"] == "ParallelGroupStarted")["payload"]["failureMode"] == "allow_failure"


def test_a_failed_branch_stops_the_unstarted_ones_and_lets_the_running_ones_finish(workspace: Workspace) -> None:
    wf, ran = _gate_fan(workspace, "run_gate_fail", allow_failure=False)

    outcome = start_run(workspace=workspace, workflow=wf, input={}, run_id="run_gate_fail")

    assert outcome.status == "failed" and outcome.error["name"] == "BranchFailed"
    assert sorted(ran) == [0, 1]  # 2 and 3 never started
    state = fold(_events(workspace, outcome.run_id))
    assert state.parallel_groups["fan"].status == "failed"
    assert {p: b.status for p, b in state.parallel_groups["fan"].branches.items()} == {
        "fan[0]": "failed", "fan[1]": "completed", "fan[2]": "scheduled", "fan[3]": "scheduled"}
    assert "fan[2]" not in state.steps and state.steps["fan"].status == "failed"
