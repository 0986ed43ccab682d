"""Run a registered workflow, or resume one, recording every fact through the one write path.

Durability level one: a step with a committed StepCompleted never runs again; its recorded
output is what later steps see. Level two lives in session.py. The executor holds the run's
lease for the whole execution and writes only with its fencing token.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..canonical import digest
from ..errors import NotFound
from ..leases import Lease, LeaseHeld, acquire_run_lease, release_run_lease
from ..models import Run, Workspace
from ..projection import log_of
from ..replay import CapabilityDriftError, manifest_drift
from .errors import RunInputMismatch, RuntimeIntegrityError, StepFailure
from .record import Record, inline_or_ref, read_record
from .recorder import Recorder
from .registry import AIGenerate, CodeRun, Step, ToolCall, Workflow, get_workflow
from .session import run_session
from .toolcalls import call_tool

LEASE_TTL_S = 300.0
_UNSET: Any = object()


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: str  # completed | failed
    output: Any = None
    error: Any = None


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex


def start_run(*, workspace: Workspace, workflow: str | Workflow, input: Any, run_id: str | None = None,
              take_over: bool = False) -> RunOutcome:
    """Start `workflow` on `input` and run it to the end. An existing `run_id` is resumed instead,
    and its input must equal `input`."""
    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    run_id = run_id or new_run_id()
    if Run.objects.filter(workspace=workspace, run_id=run_id).exists():
        return resume_run(workspace=workspace, run_id=run_id, input=input, workflow=wf, take_over=take_over)
    recorder = Recorder(workspace=workspace, run_id=run_id, last_sequence=0)
    recorder.append({"type": "RunStarted", "payload": {
        "workflowVersionId": wf.version_id, "workflow": wf.name, "workflowVersionHash": wf.version,
        "input": input}})
    return _execute(workspace=workspace, run_id=run_id, workflow=wf, take_over=take_over)


def resume_run(*, workspace: Workspace, run_id: str, input: Any = _UNSET, workflow: str | Workflow | None = None,
               take_over: bool = False) -> RunOutcome:
    """Continue a run from where its log ends: completed steps are reused, an open harness session
    fast-forwards, only calls without a terminal event run again."""
    events = _log(workspace, run_id)
    started = events[0]["payload"] if events and events[0]["type"] == "RunStarted" else {}
    if workflow is None:
        name = started.get("workflow")
        if not isinstance(name, str):
            raise RuntimeIntegrityError(f"run {run_id} was not started by the runtime (its RunStarted names "
                                        "no workflow)", runId=run_id)
        workflow = name
    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    if input is not _UNSET:
        recorded = inline_or_ref(workspace, started.get("input"), started.get("inputRef"))
        if digest(recorded) != digest(input):
            raise RunInputMismatch("Run input mismatch: existing run was started with different input.",
                                   runId=run_id)
    return _execute(workspace=workspace, run_id=run_id, workflow=wf, take_over=take_over)


def _log(workspace: Workspace, run_id: str) -> list[dict[str, Any]]:
    run = Run.objects.filter(workspace=workspace, run_id=run_id).first()
    if run is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    return log_of(run)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def _owner_is_dead(owner: str) -> bool:
    """True when the owner is an executor process of this host that no longer exists."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _acquire(workspace: Workspace, run_id: str, take_over: bool) -> Lease:
    owner = _owner()
    try:
        return acquire_run_lease(workspace=workspace, run_id=run_id, owner=owner, ttl_s=LEASE_TTL_S,
                                 take_over=take_over)
    except LeaseHeld as exc:
        # An executor of this host that died (killed, crashed) cannot give its lease back.
        if not _owner_is_dead(str(exc.details.get("owner", ""))):
            raise
        return acquire_run_lease(workspace=workspace, run_id=run_id, owner=owner, ttl_s=LEASE_TTL_S, take_over=True)


def _execute(*, workspace: Workspace, run_id: str, workflow: Workflow, take_over: bool) -> RunOutcome:
    lease = _acquire(workspace, run_id, take_over)
    try:
        record = read_record(run_id, _log(workspace, run_id))
        if record.terminal is not None:
            return _outcome(workspace, run_id, record.terminal)
        _check_version(run_id, record, workflow)
        recorder = Recorder(workspace=workspace, run_id=run_id, last_sequence=record.last_sequence, lease=lease)
        started = record.started or {}
        run_input = inline_or_ref(workspace, started.get("input"), started.get("inputRef"))
        try:
            output = _run_steps(workspace, recorder, record, workflow, run_input)
        except StepFailure as failure:
            recorder.append({"type": "RunFailed", "payload": {
                "workflowVersionId": workflow.version_id, "error": failure.as_error()}})
            return RunOutcome(run_id=run_id, status="failed", error=failure.as_error())
        recorder.append({"type": "RunCompleted", "payload": {"workflowVersionId": workflow.version_id,
                                                              "output": output}})
        return RunOutcome(run_id=run_id, status="completed", output=output)
    finally:
        release_run_lease(workspace=workspace, lease=lease)


def _check_version(run_id: str, record: Record, workflow: Workflow) -> None:
    recorded = (record.started or {}).get("workflowVersionHash")
    if recorded != workflow.version:
        # The steps a resume would run are not the ones the run was started with: fail closed.
        raise CapabilityDriftError(run_id, manifest_drift({"workflowDefinitionHash": recorded},
                                                          {"workflowDefinitionHash": workflow.version}))


def _outcome(workspace: Workspace, run_id: str, terminal: tuple[str, dict[str, Any]]) -> RunOutcome:
    kind, payload = terminal
    if kind == "RunFailed":
        return RunOutcome(run_id=run_id, status="failed", error=payload.get("error"))
    return RunOutcome(run_id=run_id, status="completed",
                      output=inline_or_ref(workspace, payload.get("output"), payload.get("outputRef")))


def _run_steps(workspace: Workspace, recorder: Recorder, record: Record, workflow: Workflow, run_input: Any) -> Any:
    outputs: dict[str, Any] = {}
    for step in workflow.steps:
        path = step.id
        done = record.steps.get(path)
        if done is not None and done.status == "completed":
            outputs[step.id] = inline_or_ref(workspace, done.output, done.output_ref)
            continue
        if done is not None and done.status == "failed":
            # Killed between StepFailed and RunFailed: the failure is recorded, only the run's is due.
            error = done.error if isinstance(done.error, Mapping) else {}
            raise StepFailure(str(error.get("message", f"step {path} failed")), name=str(error.get("name", "StepError")))
        if done is None or not done.scheduled:
            recorder.append({"type": "StepScheduled", "payload": {"stepPath": path, "stepId": step.id,
                                                                  "uses": step.kind}})
        attempt = done.attempt if done is not None and done.status == "running" else 0
        if attempt == 0:
            attempt = 1
            recorder.append({"type": "StepAttemptStarted", "payload": {
                "stepPath": path, "stepId": step.id, "attempt": attempt, "attemptId": f"attempt_{attempt}"}})
        try:
            output = _run_step(recorder, record, workflow, step, path, run_input, outputs)
        except StepFailure as failure:
            recorder.append({"type": "StepFailed", "payload": {
                "stepPath": path, "stepId": step.id, "attempt": attempt, "attemptId": f"attempt_{attempt}",
                "error": {**failure.as_error(), "retriable": False}}})
            raise
        recorder.append({"type": "StepCompleted", "payload": {
            "stepPath": path, "stepId": step.id, "attempt": attempt, "output": output,
            "metadata": {"uses": step.kind}}})
        outputs[step.id] = output
    if workflow.output is not None:
        return workflow.output(run_input, outputs)
    return outputs[workflow.steps[-1].id]


def _run_step(recorder: Recorder, record: Record, workflow: Workflow, step: Step, path: str, run_input: Any,
              outputs: Mapping[str, Any]) -> Any:
    if isinstance(step, CodeRun):
        try:
            return step.fn(run_input, dict(outputs))
        except Exception as exc:  # the step's failure is recorded, not the executor's
            raise StepFailure(str(exc), name=type(exc).__name__) from exc
    if isinstance(step, ToolCall):
        args = step.args(run_input, dict(outputs)) if callable(step.args) else dict(step.args)
        field, value = call_tool(recorder=recorder, record=record, tool=workflow.tools[step.tool], args=args,
                                 call_id=f"{path}:call", step_path=path, caller="code")
        if field == "error":
            raise StepFailure(f"tool {step.tool} failed: {value}", name="ToolCallFailed")
        return value
    if isinstance(step, AIGenerate):
        prompt = step.prompt(run_input, dict(outputs)) if callable(step.prompt) else step.prompt
        return run_session(recorder=recorder, record=record, workflow=workflow, step=step, step_path=path,
                           prompt=prompt)
    raise TypeError(f"unknown step kind {type(step).__name__}")
