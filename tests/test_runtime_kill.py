"""The kill sweep (issue 5, Done when): an executor process is SIGKILLed between every pair of
events of a multi-step run with model and tool calls, and `ledger resume` finishes it each time
with the same output; the invocation log proves that no call whose answer was committed was made
again and that only the in-flight call was repeated. Then the same for a sub-run pipeline,
including the parent dying after its sub-run finished but before it recorded the outcome.

The killed executor is a fork of the test process (no interpreter or Django start-up, so the
sweep stays fast); it dies by SIGKILL from the kill switches tests/runtime_workflows.py installs
(ledger/runtime/testing.py), exactly as a `ledger run` of those workflows would.
The resume is `manage.py ledger resume` run in-process with call_command.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import traceback
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connections
from django.utils.dateparse import parse_datetime

from ledger.models import Workspace
from ledger.replay.gateway import ToolCallInDoubt, reconcile_tool_call
from ledger.runtime.executor import resume_run, start_run, sub_run_id
from ledger.runtime.testing import COMMITS_ENV, KILL_AFTER_ENV, KILL_BEFORE_ENV, KILL_RUN_ENV, commit_ends
from tests.conftest import FakeClock
from tests.runtime_support import (
    assert_verified as _verified,
)
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies,
)
from tests.runtime_support import (
    invocation_counts as _calls,
)
from tests.runtime_support import (
    invocation_of as _call_of,
)
from tests.runtime_support import (
    run_events as _events,
)
from tests.runtime_workflows import INVOCATIONS_ENV, reset_registrations

DRILL_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}
DRILL_OUTPUT = {"summary": "Lisbon wins.", "notified": "msg-ops"}
PIPELINE_OUTPUT = {"child": {"topic": "Lisbon", "answer": "Bergen is mild."}, "notified": "msg-ops"}
# The drill's log is 37 events; a kill is tried after each of them but the last, plus the moment
# before each of its 8 answers is committed (the call made, its record not). Events with no effect
# outside between them share a commit (a step's end and the next step's start; a model's response
# and the claim of the tool call it asks for; a tool's outcome and the next model call), so a kill
# after an event lands at the end of its commit: every commit boundary is a kill point.
DRILL_EVENTS = 37
# Where the drill's 15 commits end: RunStarted; each step boundary (the previous step's end with the
# next one's start); per model call its intent (with the tool outcome before it) and its response
# (with the claim of the tool call it asks for); the last step's end with RunCompleted.
DRILL_COMMITS = [1, 3, 6, 8, 10, 12, 14, 16, 18, 23, 24, 28, 30, 35, 37]
DRILL_ANSWERS = [9, 11, 13, 15, 17, 19, 25, 31]  # harness.model.responded / tool_call.succeeded sequences
ANSWER_TYPES = ("harness.model.responded", "harness.tool_call.succeeded")

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in (KILL_AFTER_ENV, KILL_BEFORE_ENV, KILL_RUN_ENV, COMMITS_ENV, INVOCATIONS_ENV):
        monkeypatch.delenv(name, raising=False)
    yield
    monkeypatch.delenv(INVOCATIONS_ENV, raising=False)
    reset_registrations()


def _run_in_child(
    workspace: Workspace, workflow: str, run_id: str, run_input: Any, invocations: Path, **seams: str
) -> int:
    """Run the workflow in a forked process with the kill seams set; its wait status."""
    connections.close_all()  # the child opens its own connection
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 0
        try:
            os.environ[INVOCATIONS_ENV] = str(invocations)
            os.environ.update(seams)
            reset_registrations()
            start_run(workspace=workspace, workflow=workflow, input=run_input, run_id=run_id)
        except BaseException:
            traceback.print_exc()
            code = 70
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _resume(run_id: str, invocations: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    monkeypatch.setenv(INVOCATIONS_ENV, str(invocations))
    reset_registrations()
    out = StringIO()
    call_command("ledger", "resume", run_id, "--workspace", "acme/support", stdout=out, stderr=StringIO())
    return json.loads(out.getvalue().splitlines()[-1])


def _shape(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["type"], e["payload"].get("stepPath")) for e in events]


# Computed once per session from an uninterrupted run: what every killed run must end up as.
_BASELINE: dict[str, Any] = {}


def _baseline(workspace: Workspace, tmp_path: Path, workflow: str, run_input: Any) -> dict[str, Any]:
    if workflow not in _BASELINE:
        calls, commits = tmp_path / f"baseline-{workflow}.jsonl", tmp_path / f"baseline-{workflow}.commits"
        run_id = f"run_base_{workflow}"
        assert _run_in_child(workspace, workflow, run_id, run_input, calls, **{COMMITS_ENV: str(commits)}) == 0
        events = _events(workspace, run_id)
        children = {
            e["payload"]["callId"]: _shape(_events(workspace, e["payload"]["args"]["subRunId"]))
            for e in events
            if e["payload"].get("caller") == "workflow"
        }
        _BASELINE[workflow] = {
            "shape": _shape(events),
            "calls": _calls(calls),
            "children": children,
            "commits": commit_ends(commits)[run_id],
            "sequences": {(e["type"], e["payload"].get("callId")): e["sequence"] for e in events},
        }
    return _BASELINE[workflow]


KILLS = [(KILL_AFTER_ENV, n) for n in range(1, DRILL_EVENTS)] + [(KILL_BEFORE_ENV, n) for n in DRILL_ANSWERS]


def test_drill_killed_at_every_point_resumes_to_the_same_output_repeating_only_the_in_flight_call(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One test, not one per point: a transactional test's flush costs as much as a kill and resume.
    baseline = _baseline(workspace, tmp_path, "drill", DRILL_INPUT)
    assert len(baseline["shape"]) == DRILL_EVENTS
    assert [i + 1 for i, (t, _) in enumerate(baseline["shape"]) if t in ANSWER_TYPES] == DRILL_ANSWERS
    assert baseline["commits"] == DRILL_COMMITS
    assert len(KILLS) == 44
    boundaries = set()
    for seam, n in KILLS:
        written = _kill_and_resume(
            workspace, tmp_path, monkeypatch, "drill", DRILL_INPUT, DRILL_OUTPUT, baseline, seam, n
        )
        boundaries.add((seam, written))
    # The executor died after every one of its commits, and before each answer was committed.
    assert {written for seam, written in boundaries if seam == KILL_AFTER_ENV} == set(DRILL_COMMITS)
    assert len(boundaries) == len(DRILL_COMMITS) + len(DRILL_ANSWERS), sorted(boundaries)


def _kill_and_resume(
    workspace: Workspace,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    workflow: str,
    run_input: Any,
    expected: Any,
    baseline: dict[str, Any],
    seam: str,
    n: int,
) -> int:
    """Kill at the point, resume, check; how many events the killed executor had committed."""
    point = f"{workflow} {seam} {n}"
    run_id, calls = f"run_kill_{workflow}_{seam.split('_')[2].lower()}_{n}", tmp_path / f"{workflow}-{seam}-{n}.jsonl"

    status = _run_in_child(workspace, workflow, run_id, run_input, calls, **{seam: str(n)})

    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, point
    written = len(_events(workspace, run_id))
    # a kill after an event lands at the end of the commit that holds it; one before an event, at
    # the end of the commit before it
    commits = baseline["commits"]
    assert written == (
        min(c for c in commits if c >= n) if seam == KILL_AFTER_ENV else max((c for c in commits if c < n), default=0)
    ), (point, written)
    resumed = _resume(run_id, calls, monkeypatch)
    assert (resumed["status"], resumed["output"]) == ("completed", expected), point
    events = _events(workspace, run_id)
    assert _shape(events) == baseline["shape"], point
    _verified(workspace, run_id)
    in_flight = (
        {_call_of(e, events) for e in events if e["sequence"] == n and e["type"] in ANSWER_TYPES}
        if seam == KILL_BEFORE_ENV
        else set()
    )
    assert _calls(calls) == Counter({call: 2 if call in in_flight else 1 for call in baseline["calls"]}), point
    return written


PIPELINE_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}


def _pipeline_kill(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, in_child: bool, seam: str, n: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Counter[str]]:
    baseline = _baseline(workspace, tmp_path, "rt_pipeline", PIPELINE_INPUT)
    run_id = f"run_pipe_{'child' if in_child else 'parent'}_{seam.split('_')[2].lower()}_{n}"
    calls = tmp_path / f"{run_id}.jsonl"
    child_id = sub_run_id(run_id, "sub")
    status = _run_in_child(
        workspace,
        "rt_pipeline",
        run_id,
        PIPELINE_INPUT,
        calls,
        **{seam: str(n), KILL_RUN_ENV: child_id if in_child else run_id},
    )
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL

    resumed = _resume(run_id, calls, monkeypatch)

    assert (resumed["status"], resumed["output"]) == ("completed", PIPELINE_OUTPUT)
    parent, child = _events(workspace, run_id), _events(workspace, child_id)
    assert _shape(parent) == baseline["shape"]
    assert _shape(child) == baseline["children"]["sub:workflow"]
    assert child[0]["payload"]["parentRunId"] == run_id
    _verified(workspace, run_id)
    _verified(workspace, child_id)
    return parent, child, _calls(calls)


def test_parent_killed_after_its_sub_run_finished_records_the_outcome_without_running_it_again(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = _baseline(workspace, tmp_path, "rt_pipeline", PIPELINE_INPUT)
    recorded_at = baseline["sequences"][("harness.tool_call.succeeded", "sub:workflow")]

    parent, child, calls = _pipeline_kill(
        workspace, tmp_path, monkeypatch, in_child=False, seam=KILL_BEFORE_ENV, n=recorded_at
    )

    assert calls == baseline["calls"]  # each model turn and tool run of the sub-run happened once
    assert set(calls.values()) == {1} and len(calls) == 4
    assert [e["type"] for e in child].count("RunStarted") == 1 and child[-1]["type"] == "RunCompleted"
    outcome = next(e for e in parent if e["sequence"] == recorded_at)
    assert outcome["type"] == "harness.tool_call.succeeded"
    assert outcome["payload"]["result"] == PIPELINE_OUTPUT["child"]
    assert outcome["payload"]["subRunId"] == sub_run_id(parent[0]["runId"], "sub")


PIPELINE_KILLS = [
    (False, KILL_AFTER_ENV, "reserved"),  # the sub-run is reserved in the parent, not started
    (True, KILL_AFTER_ENV, 3),  # the sub-run started its first step
    (True, KILL_BEFORE_ENV, "answer"),  # the sub-run's model answered, the answer is not recorded
    (True, KILL_AFTER_ENV, "last"),  # the sub-run started its last step (with the end of the one before)
]


def test_pipeline_killed_inside_its_sub_run_resumes_the_sub_run_where_it_stopped(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = _baseline(workspace, tmp_path, "rt_pipeline", PIPELINE_INPUT)
    child_shape = baseline["children"]["sub:workflow"]
    for in_child, seam, point in PIPELINE_KILLS:
        n = {
            "reserved": baseline["sequences"][("harness.tool_call.started", "sub:workflow")],
            "answer": next(i + 1 for i, (t, _) in enumerate(child_shape) if t == "harness.model.responded"),
            "last": max(i + 1 for i, (t, _) in enumerate(child_shape) if t == "StepAttemptStarted"),
        }.get(point, point)

        _, child, calls = _pipeline_kill(workspace, tmp_path, monkeypatch, in_child=in_child, seam=seam, n=n)

        repeated = {"model look turn 1"} if point == "answer" else set()
        assert calls == Counter({call: 2 if call in repeated else 1 for call in baseline["calls"]}), point


MAILER_INPUT = {"to": "ops"}
MAILER_SENT = 8  # rt_mailer's harness.tool_call.succeeded: the mail has left, its record is not committed


def test_a_write_call_in_flight_at_a_kill_is_in_doubt_and_never_sent_again_even_within_its_lease(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume on the same host comes at once (the dead process frees the run, and the worker's
    sweep re-queues such a request within seconds), long before the dead executor's 60-s claim
    lease ends: a write call it had sent is in doubt, not sent a second time."""
    run_id, calls = "run_kill_mailer", tmp_path / "mailer.jsonl"
    status = _run_in_child(workspace, "rt_mailer", run_id, MAILER_INPUT, calls, **{KILL_BEFORE_ENV: str(MAILER_SENT)})
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    sent = Counter({'tool send {"to":"ops"}': 1})
    assert _calls(calls) == sent
    assert [e["type"] for e in _events(workspace, run_id)][-1] == "harness.tool_call.started"
    monkeypatch.setenv(INVOCATIONS_ENV, str(calls))
    reset_registrations()

    with pytest.raises(ToolCallInDoubt, match="may have acted"):
        resume_run(workspace=workspace, run_id=run_id)

    assert _calls(calls) == sent  # not sent again
    last = _events(workspace, run_id)[-1]
    assert (last["type"], last["payload"]["callId"], last["payload"]["reason"]) == (
        "harness.tool_call.in_doubt",
        "send:call",
        "interrupted",
    )
    # An operator who checked the outbox settles it; the run goes on with that outcome.
    reconcile_tool_call(
        workspace=workspace,
        run_id=run_id,
        call_id="send:call",
        outcome="succeeded",
        value={"id": "mail-ops"},
        note="the mail is in the outbox",
        by="carol",
    )
    resumed = resume_run(workspace=workspace, run_id=run_id)
    assert (resumed.status, resumed.output) == ("completed", {"id": "mail-ops"})
    assert _calls(calls) == sent


MAZE_INPUT = {"cities": ["Oslo", "Lisbon"]}
MAZE_OUTPUT = {"drafts": 2, "temps": {"oslo": 12, "lisbon": 18}}
MAZE_EVENTS = 36
MAZE_ANSWERS = [22, 28]  # the two branches' harness.tool_call.succeeded
# Every other gap of the loop-and-fan run (the drill above takes every one), and before each answer.
MAZE_KILLS = [(KILL_AFTER_ENV, n) for n in range(1, MAZE_EVENTS, 2)] + [(KILL_BEFORE_ENV, n) for n in MAZE_ANSWERS]


def test_loop_and_fan_out_killed_mid_way_resume_without_repeating_visits_or_branches(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline = _baseline(workspace, tmp_path, "rt_maze", MAZE_INPUT)
    assert len(baseline["shape"]) == MAZE_EVENTS
    assert [i + 1 for i, (t, _) in enumerate(baseline["shape"]) if t in ANSWER_TYPES] == MAZE_ANSWERS
    for seam, n in MAZE_KILLS:
        _kill_and_resume(workspace, tmp_path, monkeypatch, "rt_maze", MAZE_INPUT, MAZE_OUTPUT, baseline, seam, n)


FANOUT_INPUT = {"cities": ["Oslo", "Lisbon", "Rome", "Lima"]}
FANOUT_OUTPUT = {"lima": 12, "lisbon": 18, "oslo": 12, "rome": 12}


def test_parallel_group_with_concurrent_branches_killed_mid_group_resumes_only_the_unfinished_branches(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """rt_fanout's four branches run on four threads, so their commits interleave differently on
    every run: each kill is compared with the baseline as a set of facts, not event by event."""
    baseline = _baseline(workspace, tmp_path, "rt_fanout", FANOUT_INPUT)
    total = len(baseline["shape"])
    mid_group = 0
    for n in range(1, total):
        point = f"rt_fanout after {n}"
        run_id, calls = f"run_kill_fanout_{n}", tmp_path / f"fanout-{n}.jsonl"
        status = _run_in_child(workspace, "rt_fanout", run_id, FANOUT_INPUT, calls, **{KILL_AFTER_ENV: str(n)})
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, point
        before = _events(workspace, run_id)
        finished = {e["payload"]["branchPath"] for e in before if e["type"] == "ParallelBranchCompleted"}
        claimed = {e["payload"]["stepPath"] for e in before if e["type"] == "harness.tool_call.started"}
        mid_group += 0 < len(finished) < 4

        resumed = _resume(run_id, calls, monkeypatch)

        assert (resumed["status"], resumed["output"]) == ("completed", FANOUT_OUTPUT), point
        events = _events(workspace, run_id)
        assert sorted(_shape(events), key=str) == sorted(baseline["shape"], key=str), point
        assert [e["sequence"] for e in events] == list(range(1, len(events) + 1)), point
        _verified(workspace, run_id)
        counts = _calls(calls)
        for city in FANOUT_INPUT["cities"]:
            branch = f"fan[{city.lower()}]"
            ran = counts[f'tool weather {{"city":"{city}"}}']
            # a finished branch never runs again; one whose call was out when the executor died runs it again
            assert ran == (1 if branch in finished or branch not in claimed else ran), point
            assert ran in (1, 2) and (ran == 1 or branch in claimed), point
    assert mid_group > 0  # some kills landed with some branches finished and others not


RETRY_FAILED_AT = 6  # RunStarted; the step's start with its call's claim; the call's failure with StepFailed


def test_a_retry_delay_survives_a_kill_the_resumed_run_waits_only_for_what_is_left(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: FakeClock
) -> None:
    calls = tmp_path / "retry.jsonl"
    status = _run_in_child(workspace, "rt_retry", "run_kill_retry", {}, calls, **{KILL_AFTER_ENV: str(RETRY_FAILED_AT)})
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    before = _events(workspace, "run_kill_retry")
    assert before[-1]["type"] == "StepFailed" and before[-1]["sequence"] == RETRY_FAILED_AT
    error = before[-1]["payload"]["error"]
    retry_at = parse_datetime(error["retryAt"])
    assert error["retriable"] is True and retry_at is not None
    assert abs(retry_at - (clock.now() + timedelta(hours=1))) < timedelta(milliseconds=1)  # stored to the ms

    # 59 min 59.8 s later: a resume that started the delay from zero would wait another hour
    clock.advance(3599.8)
    outcomes: list[dict[str, Any]] = []

    def resume() -> None:
        try:
            outcomes.append(_resume("run_kill_retry", calls, monkeypatch))
        finally:
            connections.close_all()  # this thread's own, or the test database cannot be dropped

    resuming = threading.Thread(target=resume)
    resuming.start()
    resuming.join(120)
    assert not resuming.is_alive(), "the resumed run is waiting the whole delay again"

    assert [(o["status"], o["output"]) for o in outcomes] == [("completed", {"fetched": "https://example.test/report"})]
    events = _events(workspace, "run_kill_retry")
    assert [
        (e["payload"]["stepPath"], e["payload"]["attempt"]) for e in events if e["type"] == "StepAttemptStarted"
    ] == [("fetch", 1), ("fetch", 2), ("done", 1)]
    assert [e["payload"]["error"]["retryAt"] for e in events if e["type"] == "StepFailed"] == [error["retryAt"]]
    assert _calls(calls) == Counter({'tool fetch {"url":"https://example.test/report"}': 2})
    _verified(workspace, "run_kill_retry")


# --- an outer loop (issue 15) -------------------------------------------------------------------
# Three cycles of rt_refine (continue, continue, done), each a run of its own, their verdicts in the
# loop's record run. The driver is killed after each of the record's commits and before each of its
# verdicts is committed (the cycle's run over, its supervise answered: "between a cycle's run
# finishing and its OuterLoopCycleCompleted"), and inside cycle 2's run after each of its commits
# and before its model answer is committed; `ledger loop resume` ends each the same way.

LOOP_INPUT = {"topic": "tides"}
LOOP_RESULT = {"kind": "done", "finalOutput": {"text": "draft 3", "cycles": 3}}


def _loop_in_child(workspace: Workspace, outer_loop_id: str, invocations: Path, **seams: str) -> int:
    from ledger.runtime.outer_loop import start_outer_loop
    from tests.loop_workflows import reset_loop_registrations

    connections.close_all()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child process
        code = 0
        try:
            os.environ[INVOCATIONS_ENV] = str(invocations)
            os.environ.update(seams)
            reset_loop_registrations()
            start_outer_loop(
                workspace=workspace,
                workflow="rt_refine",
                input=LOOP_INPUT,
                goal="tight",
                max_cycles=4,
                supervise="rt_until_third",
                outer_loop_id=outer_loop_id,
            )
        except BaseException:
            traceback.print_exc()
            code = 70
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return status


def _loop_resume(outer_loop_id: str, invocations: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    from tests.loop_workflows import reset_loop_registrations

    monkeypatch.setenv(INVOCATIONS_ENV, str(invocations))
    reset_loop_registrations()
    out = StringIO()
    call_command(
        "ledger", "loop", "resume", outer_loop_id, "--workspace", "acme/support", stdout=out, stderr=StringIO()
    )
    return json.loads(out.getvalue().splitlines()[-1])


def _loop_shapes(workspace: Workspace, outer_loop_id: str) -> list[list[tuple[str, str | None]]]:
    from ledger.runtime.outer_loop import cycle_run_id, record_run_id

    return [
        _shape(_events(workspace, run_id))
        for run_id in [record_run_id(outer_loop_id), *(cycle_run_id(outer_loop_id, n) for n in (1, 2, 3))]
    ]


def test_outer_loop_killed_at_its_commits_and_between_a_cycle_and_its_verdict_resumes_without_rerunning_a_cycle(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ledger.runtime.outer_loop import cycle_run_id, record_run_id

    base_calls, base_commits = tmp_path / "loop-base.jsonl", tmp_path / "loop-base.commits"
    assert _loop_in_child(workspace, "ol_base", base_calls, **{COMMITS_ENV: str(base_commits)}) == 0
    shapes = _loop_shapes(workspace, "ol_base")
    commits = commit_ends(base_commits)
    record_commits = commits[record_run_id("ol_base")]
    assert record_commits == [1, 2, 3, 5]  # the goal; cycles 1 and 2; cycle 3 with the record's end
    cycle_commits = commits[cycle_run_id("ol_base", 2)]
    base = _calls(base_calls)
    assert base == Counter(
        {
            "model draft turn 1": 3,
            **{f'tool plan {{"cycle":{n}}}': 1 for n in (1, 2, 3)},
            **{f'tool supervise {{"cycle":{n}}}': 1 for n in (1, 2, 3)},
        }
    )
    answered = next(i + 1 for i, (t, _) in enumerate(shapes[2]) if t == "harness.model.responded")

    kills: list[tuple[str, str, int, Counter[str]]] = []
    for n in record_commits[:-1]:  # after each commit of the record
        kills.append(("record", KILL_AFTER_ENV, n, Counter()))
    for cycle, n in ((1, 2), (2, 3), (3, 4)):  # before each verdict: that cycle's supervise runs again
        kills.append(("record", KILL_BEFORE_ENV, n, Counter({f'tool supervise {{"cycle":{cycle}}}': 1})))
    for n in cycle_commits[:-1]:  # inside cycle 2's run, after each of its commits
        kills.append(("cycle", KILL_AFTER_ENV, n, Counter()))
    kills.append(("cycle", KILL_BEFORE_ENV, answered, Counter({"model draft turn 1": 1})))

    for where, seam, n, repeated in kills:
        ol = f"ol_k_{where}_{seam.split('_')[2].lower()}_{n}"
        point = f"{where} {seam} {n}"
        calls = tmp_path / f"{ol}.jsonl"
        target = record_run_id(ol) if where == "record" else cycle_run_id(ol, 2)

        status = _loop_in_child(workspace, ol, calls, **{seam: str(n), KILL_RUN_ENV: target})

        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, point
        resumed = _loop_resume(ol, calls, monkeypatch)
        assert (resumed["status"], resumed["result"]) == ("completed", LOOP_RESULT), point
        assert _loop_shapes(workspace, ol) == shapes, point  # each cycle's run started once, ran once
        _verified(workspace, record_run_id(ol), *(cycle_run_id(ol, c) for c in (1, 2, 3)))
        assert _calls(calls) == base + repeated, point
