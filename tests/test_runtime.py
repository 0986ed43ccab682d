"""The runtime: workflows run to completion, survive being killed at any committed event (resume
finishes them, repeating only the in-flight call), refuse drift and changed input, and a zombie
executor is fenced."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import connection

from ledger.canonical import canonical_json, digest
from ledger.errors import Fenced
from ledger.log.leases import acquire_run_lease
from ledger.models import Run, Workspace
from ledger.replay.plan import CapabilityDriftError
from ledger.runtime.errors import RunInputMismatch
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.providers import ModelRequest, ScriptedProvider
from ledger.runtime.registry import AIGenerate, CodeRun, Tool, ToolCall, Workflow
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
    round_trips,
)
from tests.runtime_support import (
    assert_verified as _verified,
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
from tests.runtime_workflows import INVOCATIONS_ENV, SCRIPT, build_drill, reset_registrations
from tests.servers import database_url as _database_url

ROOT = Path(__file__).resolve().parent.parent
DRILL_INPUT = {"cities": ["Oslo", "Lisbon"], "to": "ops"}
DRILL_OUTPUT = {"summary": "Lisbon wins.", "notified": "msg-ops"}


def test_multi_step_workflow_runs_to_completion_and_verifies(workspace: Workspace) -> None:
    provider = ScriptedProvider(script=SCRIPT)
    outcome = start_run(workspace=workspace, workflow=build_drill(provider=provider), input=DRILL_INPUT)

    assert (outcome.status, outcome.output) == ("completed", DRILL_OUTPUT)
    _verified(workspace, outcome.run_id)
    events = _events(workspace, outcome.run_id)
    types = [e["type"] for e in events]
    assert types[0] == "RunStarted" and types[-1] == "RunCompleted"
    assert types.count("StepCompleted") == 5 and types.count("harness.session.started") == 2
    assert types.count("harness.model.responded") == 4 and types.count("harness.tool_call.succeeded") == 4
    for e in events:
        if e["type"].startswith("harness."):  # the gateway's terminal events included
            assert e["payload"]["stepPath"] in ("research", "summarize", "notify")
    # the model call is on the log before the provider answers it
    called = [e["sequence"] for e in events if e["type"] == "harness.model.called"]
    responded = [e["sequence"] for e in events if e["type"] == "harness.model.responded"]
    assert all(c < r for c, r in zip(called, responded))
    session = next(e["payload"] for e in events if e["type"] == "harness.session.started")
    assert set(session["manifest"]) == {
        "harnessId",
        "modelSlot",
        "model",
        "systemPromptHash",
        "toolsHash",
        "workflowDefinitionHash",
    }
    run = Run.objects.get(workspace=workspace, run_id=outcome.run_id)
    assert run.status == "completed"
    assert provider.invocations == [("research", 1), ("research", 2), ("research", 3), ("summarize", 1)]


def test_each_model_call_records_only_the_new_messages_and_the_hash_of_the_whole_request(workspace: Workspace) -> None:
    bodies: dict[tuple[str, int], dict[str, Any]] = {}

    def script(request: ModelRequest) -> dict[str, Any]:
        bodies[(request.step_path, request.turn)] = json.loads(canonical_json(request.body))
        return SCRIPT[request.step_path][request.turn - 1]

    outcome = start_run(
        workspace=workspace, workflow=build_drill(provider=ScriptedProvider(script=script)), input=DRILL_INPUT
    )

    assert outcome.status == "completed"
    called = [e["payload"] for e in _events(workspace, outcome.run_id) if e["type"] == "harness.model.called"]
    assert len(called) == len(bodies) == 4
    rebuilt: dict[str, list[Any]] = {}
    for p in called:
        body = bodies[(p["stepPath"], p["turn"])]
        request = p["request"]
        assert set(request) == {"model", "messagesFrom", "messages", "toolsHash"}
        conversation = rebuilt.setdefault(p["stepPath"], [])
        assert request["messagesFrom"] == len(conversation)  # what earlier turns recorded
        conversation += request["messages"]
        assert conversation == body["messages"]
        assert (request["model"], request["toolsHash"]) == (body["model"], digest(body["tools"]))
        assert p["promptHash"] == digest(body)
    assert [p["request"]["messagesFrom"] for p in called if p["stepPath"] == "research"] == [0, 2, 5]


def test_completed_steps_and_recorded_calls_are_not_run_again_on_resume(workspace: Workspace) -> None:
    failing = {"armed": True}

    def flaky(request: ModelRequest) -> dict[str, Any]:
        if request.step_path == "research" and request.turn == 2 and failing.pop("armed", False):
            raise Crash("executor died mid-call")
        return SCRIPT[request.step_path][request.turn - 1]

    provider = ScriptedProvider(script=flaky)
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=build_drill(provider=provider), input=DRILL_INPUT, run_id="run_flaky")
    assert provider.invocations == [("research", 1), ("research", 2)]

    outcome = resume_run(workspace=workspace, run_id="run_flaky", workflow=build_drill(provider=provider))

    assert (outcome.status, outcome.output) == ("completed", DRILL_OUTPUT)
    # turn 1 was replayed from the log; only the turn without a response was asked again
    assert provider.invocations == [
        ("research", 1),
        ("research", 2),
        ("research", 2),
        ("research", 3),
        ("summarize", 1),
    ]
    types = [e["type"] for e in _events(workspace, "run_flaky")]
    assert types.count("harness.model.called") == 4 and types.count("harness.session.started") == 2
    _verified(workspace, "run_flaky")


def test_changed_capabilities_in_an_open_session_refuse_resume_with_drift(workspace: Workspace) -> None:
    def down(request: ModelRequest) -> dict[str, Any]:
        raise Crash("executor died mid-call")

    with pytest.raises(Crash):
        start_run(
            workspace=workspace,
            workflow=build_drill(provider=ScriptedProvider(script=down)),
            input=DRILL_INPUT,
            run_id="run_drift",
        )
    before = Run.objects.get(workspace=workspace, run_id="run_drift").last_sequence

    changed = build_drill(provider=ScriptedProvider(script=SCRIPT), weather_description="now with rain")
    with pytest.raises(CapabilityDriftError) as refused:
        resume_run(workspace=workspace, run_id="run_drift", workflow=changed)

    assert refused.value.changes and refused.value.changes[0].startswith("$.toolsHash: ")
    assert "manifest changed" in str(refused.value)
    assert Run.objects.get(workspace=workspace, run_id="run_drift").last_sequence == before  # nothing written
    done = resume_run(
        workspace=workspace, run_id="run_drift", workflow=build_drill(provider=ScriptedProvider(script=SCRIPT))
    )
    assert done.output == DRILL_OUTPUT


def test_changed_workflow_definition_refuses_resume(workspace: Workspace) -> None:
    with pytest.raises(Crash):
        start_run(
            workspace=workspace,
            input=DRILL_INPUT,
            run_id="run_def",
            workflow=build_drill(provider=ScriptedProvider(script=lambda r: (_ for _ in ()).throw(Crash()))),
        )
    with pytest.raises(CapabilityDriftError, match=r"\$\.workflowDefinitionHash: "):
        resume_run(
            workspace=workspace,
            run_id="run_def",
            workflow=build_drill(provider=ScriptedProvider(script=SCRIPT), system="Different prompt."),
        )


def test_resuming_with_other_input_is_refused(workspace: Workspace) -> None:
    wf = build_drill(provider=ScriptedProvider(script=SCRIPT))
    start_run(workspace=workspace, workflow=wf, input=DRILL_INPUT, run_id="run_input")

    with pytest.raises(RunInputMismatch, match="existing run was started with different input"):
        start_run(workspace=workspace, workflow=wf, input={**DRILL_INPUT, "to": "someone-else"}, run_id="run_input")
    again = start_run(workspace=workspace, workflow=wf, input=DRILL_INPUT, run_id="run_input")
    assert again.output == DRILL_OUTPUT


def test_failing_tool_step_fails_the_run_with_its_error(workspace: Workspace) -> None:
    def broken(args: Any) -> Any:
        raise PermissionError("mailbox locked")

    wf = Workflow(
        name="broken",
        steps=(ToolCall("send", "send", {"to": "ops"}),),
        tools={"send": Tool("send", broken, effect="write")},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed" and outcome.error["name"] == "ToolCallFailed"
    # The tool's error as `Name: message`, not the error dict's Python repr ({'name': ..., 'message': ...}).
    assert outcome.error["message"] == "tool send failed: PermissionError: mailbox locked"
    types = [e["type"] for e in _events(workspace, outcome.run_id)]
    assert types[-3:] == ["harness.tool_call.failed", "StepFailed", "RunFailed"]
    assert Run.objects.get(workspace=workspace, run_id=outcome.run_id).status == "failed"
    _verified(workspace, outcome.run_id)


def test_model_that_never_answers_fails_its_session_step_and_run(workspace: Workspace) -> None:
    looping = ScriptedProvider(script=lambda r: {"toolCalls": [{"id": f"t{r.turn}", "name": "echo", "args": {}}]})
    wf = Workflow(
        name="looping",
        steps=(AIGenerate("chat", "hi", tools=("echo",), max_turns=2),),
        tools={"echo": Tool("echo", lambda a: {})},
        models={"default": looping},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "failed" and outcome.error["name"] == "MaxTurnsExceeded"
    types = [e["type"] for e in _events(workspace, outcome.run_id)]
    assert types[-3:] == ["harness.session.failed", "StepFailed", "RunFailed"]
    assert len(looping.invocations) == 2
    _verified(workspace, outcome.run_id)


def test_zombie_executor_is_fenced_and_the_log_stays_dense(workspace: Workspace) -> None:
    paused = {"first": True}

    def slow_step(run_input: Any, outputs: Any) -> Any:
        if paused.pop("first", False):
            # While this executor is "paused", another one takes the run over.
            acquire_run_lease(workspace=workspace, run_id="run_zombie", owner="executor-b", take_over=True)
        return {"ok": True}

    wf = Workflow(name="zombie", steps=(CodeRun("one", lambda i, o: 1), CodeRun("slow", slow_step)))
    with pytest.raises(Fenced):
        start_run(workspace=workspace, workflow=wf, input={}, run_id="run_zombie")

    events = _events(workspace, "run_zombie")
    assert [e["sequence"] for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["type"] == "StepAttemptStarted" and events[-1]["payload"]["stepPath"] == "slow"
    _verified(workspace, "run_zombie")
    outcome = resume_run(workspace=workspace, run_id="run_zombie", workflow=wf, take_over=True)
    assert outcome.output == {"ok": True}
    _verified(workspace, "run_zombie")


def test_cli_run_prints_the_run_id_alone_and_resume_reports_the_outcome(workspace: Workspace) -> None:
    out = StringIO()
    call_command(
        "ledger",
        "run",
        "triage",
        "--input",
        '{"ticket": "where?"}',
        "--workspace",
        "acme/support",
        stdout=out,
        stderr=StringIO(),
    )
    run_id = out.getvalue().strip()
    assert run_id.startswith("run_") and "\n" not in run_id

    out = StringIO()
    call_command("ledger", "resume", run_id, stdout=out, stderr=StringIO())
    assert json.loads(out.getvalue())["status"] == "completed"


# --- killed executors -------------------------------------------------------------------------


def _manage(*args: str, invocations: Path, **seams: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        INVOCATIONS_ENV: str(invocations),
        "RUNLEDGER_WORKFLOW_MODULES": "tests.runtime_workflows",
    }
    for name in ("RUNLEDGER_KILL_AFTER_SEQUENCE", "RUNLEDGER_KILL_BEFORE_SEQUENCE"):
        env.pop(name, None)
    env.update(seams)
    return subprocess.run(
        [sys.executable, "manage.py", "ledger", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


def _lookup_loop(calls: int) -> Workflow:
    """An agent loop of `calls` model turns that each ask for one lookup, then one that answers."""

    def model(request: ModelRequest) -> dict[str, Any]:
        if request.turn <= calls:
            return {"toolCalls": [{"id": f"t{request.turn}", "name": "lookup", "args": {"n": request.turn}}]}
        return {"text": f"looked up {calls}"}

    return Workflow(
        name=f"lookup_loop_{calls}",
        steps=(AIGenerate("agent", "Look them up.", tools=("lookup",), max_turns=calls + 1),),
        tools={"lookup": Tool("lookup", lambda args: {"n": args["n"], "found": True})},
        models={"default": ScriptedProvider(script=model)},
    )


@pytest.mark.django_db(transaction=True)
def test_a_model_call_with_its_tool_call_is_two_round_trips_on_postgresql(workspace: Workspace) -> None:
    """The two commits the durability contract asks of a model call that asks for a tool (its
    intent before the request leaves; its response with the tool call claimed outbound before the
    tool runs), each one statement: one round trip, no BEGIN, no COMMIT, no lock of its own
    (the gateway's control row attached to the append, ledger/log/statements.py). Counted as the
    difference between a run of 8 and one of 3 such calls, so the run's own start and end, and the
    first use of each statement shape (prepared once per connection), drop out."""
    start_run(workspace=workspace, workflow=_lookup_loop(3), input={})  # prepares the shapes
    with round_trips() as short:
        few = start_run(workspace=workspace, workflow=_lookup_loop(3), input={})
    with round_trips() as long:
        many = start_run(workspace=workspace, workflow=_lookup_loop(8), input={})

    assert (few.output, many.output) == ("looked up 3", "looked up 8")
    types = [e["type"] for e in _events(workspace, many.run_id)]
    assert types.count("harness.model.called") == 9 and types.count("harness.tool_call.succeeded") == 8
    if connection.vendor == "postgresql":
        assert long[0] - short[0] == 2 * 5, (short, long)


@pytest.fixture
def registrations_restored(monkeypatch: pytest.MonkeyPatch) -> Any:
    yield
    monkeypatch.delenv(INVOCATIONS_ENV, raising=False)
    reset_registrations()  # the registered workflows log to no file again


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("registrations_restored")
def test_killed_executor_resumes_to_the_same_output_repeating_only_the_in_flight_call(
    workspace: Workspace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    baseline_calls = tmp_path / "baseline.jsonl"
    done = _manage(
        "run",
        "drill",
        "--input",
        json.dumps(DRILL_INPUT),
        "--workspace",
        "acme/support",
        "--run-id",
        "run_baseline",
        invocations=baseline_calls,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == "run_baseline"
    baseline = _events(workspace, "run_baseline")
    expected_calls = _calls(baseline_calls)
    assert set(expected_calls.values()) == {1} and len(expected_calls) == 8  # 4 model turns, 4 tool runs
    answers = [e for e in baseline if e["type"] in ("harness.model.responded", "harness.tool_call.succeeded")]

    # The real CLI end to end, at two points; tests/test_runtime_kill.py sweeps every point.
    # Right before an answer is committed: the call was made, its record was not.
    kills = [
        ("RUNLEDGER_KILL_AFTER_SEQUENCE", len(baseline) // 2),
        ("RUNLEDGER_KILL_BEFORE_SEQUENCE", answers[2]["sequence"]),
    ]
    for seam, n in kills:
        run_id, calls = f"run_kill_{seam[15:20].lower()}_{n}", tmp_path / f"{seam}-{n}.jsonl"
        killed = _manage(
            "run",
            "drill",
            "--input",
            json.dumps(DRILL_INPUT),
            "--workspace",
            "acme/support",
            "--run-id",
            run_id,
            invocations=calls,
            **{seam: str(n)},
        )
        assert killed.returncode == -signal.SIGKILL, (seam, n, killed.stderr)
        written = Run.objects.get(workspace=workspace, run_id=run_id).last_sequence
        assert written == (n if seam.endswith("AFTER_SEQUENCE") else n - 1)

        # `ledger resume` in this process (the killed one was a real `manage.py ledger run`)
        monkeypatch.setenv(INVOCATIONS_ENV, str(calls))
        reset_registrations()
        out = StringIO()
        call_command("ledger", "resume", run_id, "--workspace", "acme/support", stdout=out, stderr=StringIO())
        assert json.loads(out.getvalue().splitlines()[-1])["output"] == DRILL_OUTPUT
        events = _events(workspace, run_id)
        assert [e["type"] for e in events] == [e["type"] for e in baseline], (seam, n)
        _verified(workspace, run_id)
        in_flight = (
            {_call_of(e, events) for e in events if e["sequence"] == n} if seam.endswith("BEFORE_SEQUENCE") else set()
        )
        assert _calls(calls) == Counter({call: 2 if call in in_flight else 1 for call in expected_calls}), (seam, n)
