"""Run a registered workflow, or resume one, recording every fact through the one write path.

Durability level one: a step with a committed StepCompleted never runs again; its recorded
output is what later steps see (a decision's recorded target steers a resumed loop the same
way). Level two lives in session.py. The executor only decides what runs next: the recorder
(recorder.py) holds the run's lease for the whole execution, hands over what the log already
holds (the fold's state), and writes, renewing the lease, with its fencing token.

A sub-workflow is a run of its own, executed here in the same process under its own lease. Its
id is reserved from the parent's run id and step path, and written to the parent's log
(`harness.tool_call.started`, caller `workflow`) before the sub-run starts; on the parent's
resume a sub-run that already finished is not run again, its recorded outcome is written to the
parent.

A parallel group's branches run on threads (at most the group's max_concurrency and the
process's RUNLEDGER_PARALLEL_THREADS), each with a copy of the runner bound to a view of the
recorder (`Recorder.branch`); a resume runs only the branches without a StepCompleted. A failed
attempt with retries left records its `retryAt` (retry.py) before waiting for it, so a resumed
run waits only for what is left.
"""

from __future__ import annotations

import contextvars
import copy
import hashlib
import json
import threading
import time
import uuid
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db import connections

from ..canonical import digest
from ..errors import LedgerError
from ..log.envelopes import format_recorded_at, log_of
from ..models import RunStatus, Workspace
from ..reads import selectors
from ..replay.cancellation import is_cancelled
from ..replay.gateway import ToolCallInDoubt, first_call_in_doubt
from ..replay.plan import CapabilityDriftError, manifest_drift
from .errors import WAITING_APPROVAL, RunInputMismatch, RuntimeIntegrityError, StepFailure, WaitingApproval
from .record import ENDED, Record, attempt_of, inline_or_ref, read_record, retriable
from .recorder import Recorder, threads_allowed
from .registry import AIGenerate, CodeRun, Decision, Parallel, Step, SubWorkflow, ToolStep, Workflow, get_workflow
from .retry import next_try_at, recorded_retry_at, wait_until
from .session import call_prefix, run_session
from .toolcalls import call_tool

# Call ids are stored in 200 characters and carry the step path plus attempt, turn and call suffixes.
MAX_BRANCH_PATH = 120
_UNSET: Any = object()


@dataclass(frozen=True)
class RunOutcome:
    run_id: str
    status: str  # completed | failed | waiting_approval (a tool call waits for an approver; resume after)
    output: Any = None
    error: Any = None


def new_run_id() -> str:
    return "run_" + uuid.uuid4().hex


def sub_run_id(parent_run_id: str, call_prefix: str) -> str:
    """The reserved id of the sub-run a step (attempt) of `parent_run_id` starts: the same step
    always names the same sub-run, so a resumed parent finds it."""
    return "run_sub_" + hashlib.sha256(f"{parent_run_id}\n{call_prefix}".encode()).hexdigest()[:32]


def start_run(
    *,
    workspace: Workspace,
    workflow: str | Workflow,
    input: Any,
    run_id: str | None = None,
    take_over: bool = False,
    parent_run_id: str | None = None,
    parent: Recorder | None = None,
    outer_loop_id: str | None = None,
    label: str | None = None,
    requested_by: str | None = None,
) -> RunOutcome:
    """Start `workflow` on `input` and run it to the end. An existing `run_id` is resumed instead,
    and its input must equal `input`. `outer_loop_id` names the outer loop (outer_loop.py) this run
    is a cycle of. `requested_by` (a username) is recorded as the run's requester: who may not
    approve its tool calls (ledger/replay/toolapproval.py): on the run's head (`Run.started_by`,
    set by the write that starts it), and in RunStarted's `requestedBy` for the reader of the log."""
    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    run_id = run_id or new_run_id()
    if selectors.find_run(workspace, run_id) is not None:
        return resume_run(
            workspace=workspace, run_id=run_id, input=input, workflow=wf, take_over=take_over, parent=parent
        )
    recorder = Recorder(
        workspace=workspace, run_id=run_id, last_sequence=0, parent=parent, started_by=requested_by or ""
    )
    payload = {
        "workflowVersionId": wf.version_id,
        "workflow": wf.name,
        "workflowVersionHash": wf.version,
        "input": input,
    }
    if parent_run_id is not None:
        payload["parentRunId"] = parent_run_id
    if outer_loop_id is not None:
        payload["outerLoopId"] = outer_loop_id
    if label is not None:
        payload["label"] = label
    if requested_by:
        payload["requestedBy"] = requested_by
    recorder.append({"type": "RunStarted", "payload": payload})
    return _execute(workspace=workspace, run_id=run_id, workflow=wf, take_over=take_over, parent=parent)


def resume_run(
    *,
    workspace: Workspace,
    run_id: str,
    input: Any = _UNSET,
    workflow: str | Workflow | None = None,
    take_over: bool = False,
    parent: Recorder | None = None,
    replay: Any = None,
) -> RunOutcome:
    """Continue a run from where its log ends: completed steps are reused, an open harness session
    fast-forwards, only calls without a terminal event run again. `replay` is a re-execution's
    policy (reexecute.py): which calls are served from an original's record instead."""
    run = selectors.get_run(workspace, run_id)
    state = read_record(run_id, log_of(run), run=run).state
    if workflow is None:
        if state.workflow is None:
            raise RuntimeIntegrityError(
                f"run {run_id} was not started by the runtime (its RunStarted names no workflow)", runId=run_id
            )
        workflow = state.workflow
    wf = get_workflow(workflow) if isinstance(workflow, str) else workflow
    if input is not _UNSET:
        recorded = inline_or_ref(run, state.input, state.input_ref)
        if digest(recorded) != digest(input):
            raise RunInputMismatch("Run input mismatch: existing run was started with different input.", runId=run_id)
    return _execute(workspace=workspace, run_id=run_id, workflow=wf, take_over=take_over, parent=parent, replay=replay)


def _refuse_in_doubt(workspace: Workspace, run_id: str) -> None:
    """A tool call in doubt (its lease ran out after the request left) stops the run until an
    operator reconciles it: refuse before writing anything, naming the call and where to settle it."""
    claim = first_call_in_doubt(workspace=workspace, run_id=run_id)
    if claim is None:
        return
    raise ToolCallInDoubt(
        f"run {run_id} cannot continue: tool call {claim.call_id} ({claim.tool_name}) is in doubt, its "
        f"request left and no outcome was recorded. An operator must reconcile it first: POST /api/v1/runs/{run_id}/"
        f"tool-calls/{claim.call_id}/reconcile from a console session (outcome succeeded with its result, or "
        "failed with its error, and a note), or the reconcile form on the run page's evidence tab; then resume "
        "the run.",
        runId=run_id,
        callId=claim.call_id,
        toolName=claim.tool_name,
    )


def _execute(
    *,
    workspace: Workspace,
    run_id: str,
    workflow: Workflow,
    take_over: bool,
    parent: Recorder | None = None,
    replay: Any = None,
) -> RunOutcome:
    _refuse_in_doubt(workspace, run_id)
    origin = replay.origin if replay is not None else None
    with Recorder.leased(
        workspace=workspace, run_id=run_id, take_over=take_over, parent=parent, origin=origin
    ) as recorder:
        record = recorder.record
        if record.finished:
            return _outcome(record)
        _check_version(run_id, record, workflow)
        run_input = record.value(record.state.input, record.state.input_ref)
        try:
            return _run_to_end(workspace, recorder, workflow, run_input, replay)
        except LedgerError:
            # Cancelled (ledger/replay/cancellation.py): the log ended the run, and this write, the
            # executor's next boundary, was refused for it. Stop here; nothing more is written.
            cancelled = _cancelled(workspace, run_id)
            if cancelled is None:
                raise
            recorder.discard()
            return cancelled
        except WaitingApproval as waiting:
            if parent is not None:
                raise  # the parent waits with its sub-run
            return RunOutcome(run_id=run_id, status=WAITING_APPROVAL, error=waiting.as_error())


def _run_to_end(
    workspace: Workspace, recorder: Recorder, workflow: Workflow, run_input: Any, replay: Any
) -> RunOutcome:
    run_id = recorder.run_id
    try:
        output = _Runner(workspace, recorder, workflow, run_input, replay).run()
    except StepFailure as failure:
        recorder.append(
            {"type": "RunFailed", "payload": {"workflowVersionId": workflow.version_id, "error": failure.as_error()}}
        )
        return RunOutcome(run_id=run_id, status=RunStatus.FAILED, error=failure.as_error())
    recorder.append({"type": "RunCompleted", "payload": {"workflowVersionId": workflow.version_id, "output": output}})
    return RunOutcome(run_id=run_id, status=RunStatus.COMPLETED, output=output)


def _cancelled(workspace: Workspace, run_id: str) -> RunOutcome | None:
    """The outcome of a run that was cancelled while this executor held it; None otherwise."""
    run = selectors.find_run(workspace, run_id)
    if run is None or run.status != RunStatus.FAILED or not is_cancelled(run.error):
        return None
    return RunOutcome(run_id=run_id, status=RunStatus.FAILED, error=run.error)


def _check_version(run_id: str, record: Record, workflow: Workflow) -> None:
    recorded = record.state.workflow_version_hash
    if recorded != workflow.version:
        # The steps a resume would run are not the ones the run was started with: fail closed.
        raise CapabilityDriftError(
            run_id, manifest_drift({"workflowDefinitionHash": recorded}, {"workflowDefinitionHash": workflow.version})
        )


def _outcome(record: Record) -> RunOutcome:
    state = record.state
    if state.status == RunStatus.FAILED:
        return RunOutcome(run_id=state.run_id, status=RunStatus.FAILED, error=state.error)
    return RunOutcome(
        run_id=state.run_id, status=RunStatus.COMPLETED, output=record.value(state.output, state.output_ref)
    )


def _finished_run(workspace: Workspace, run_id: str) -> RunOutcome | None:
    """The outcome of a run that has ended, from its log; None when it is absent or unfinished."""
    run = selectors.find_run(workspace, run_id)
    if run is None or not run.finished:
        return None
    record = read_record(run_id, log_of(run), run=run)
    return _outcome(record) if record.finished else None


def _failure(error: Any, default: str) -> StepFailure:
    error = error if isinstance(error, Mapping) else {}
    return StepFailure(str(error.get("message", default)), name=str(error.get("name", "StepError")))


class _Runner:
    """One execution of a workflow's steps: fresh work appended, recorded work reused."""

    def __init__(
        self, workspace: Workspace, recorder: Recorder, workflow: Workflow, run_input: Any, replay: Any = None
    ) -> None:
        self.workspace, self.recorder, self.workflow = workspace, recorder, workflow
        self.record = recorder.record
        self.run_input, self.replay = run_input, replay

    def run(self) -> Any:
        steps = self.workflow.steps
        index = {s.id: i for i, s in enumerate(steps)}
        regions = self.workflow.loop_regions()
        region_of = {i: region for region in regions for i in range(region.start, region.end + 1)}
        visits = {region.decision.id: 0 for region in regions}  # the pass each loop is on
        outputs: dict[str, Any] = {}
        pc = 0
        while pc < len(steps):
            step = steps[pc]
            region = region_of.get(pc)
            visit = visits[region.decision.id] if region is not None else None
            path = step.id if visit is None else f"{step.id}.visit[{visit}]"
            output = self.step(step, path, self.run_input, outputs, visit=visit)
            outputs[step.id] = output
            target = output.get("target") if isinstance(step, Decision) and isinstance(output, Mapping) else None
            if target is None:
                pc += 1
            elif index[target] <= pc and region is not None:
                visits[region.decision.id] += 1
                pc = index[target]
            else:
                pc = index[target]
        if self.workflow.output is not None:
            return _user_code(self.workflow.output, self.run_input, outputs)  # raising fails the run
        return outputs[steps[-1].id]

    def step(self, step: Step, path: str, arg: Any, outputs: Mapping[str, Any], *, visit: int | None = None) -> Any:
        """Run one step at `path` through its attempts; its output, or StepFailure once it is out of them."""
        done = self.record.step(path)
        if done is not None and done.status == "completed":
            return self.record.value(done.output, done.output_ref)
        if done is not None and done.status == "failed" and not retriable(done):
            # Killed between StepFailed and what follows it: the failure is recorded, not redone.
            raise _failure(done.error, f"step {path} failed")
        # A step's facts are deferred: its start commits in one write with the end of the step
        # before it (the step boundary), just before its body runs.
        defer = self.recorder.defer
        if done is None or not done.scheduled:
            defer({"type": "StepScheduled", "payload": {"stepPath": path, "stepId": step.id, "uses": step.kind}})
        if done is not None and done.status == "running":
            attempt = attempt_of(done)
        else:
            if done is not None:  # killed while waiting for a recorded retry: only what is left of it
                wait_until(recorded_retry_at(done.error))
            attempt = (attempt_of(done) if done is not None else 0) + 1
            defer(_attempt_started(step, path, attempt))
        while True:
            self.recorder.flush()
            try:
                output = self._body(step, path, attempt, arg, outputs, visit)
            except StepFailure as failure:
                will_retry = attempt <= step.retries
                retry_at = next_try_at(step.backoff, attempt) if will_retry else None
                error = {**failure.as_error(), "retriable": will_retry}
                if retry_at is not None:
                    error["retryAt"] = format_recorded_at(retry_at)
                defer(
                    {
                        "type": "StepFailed",
                        "payload": {
                            "stepPath": path,
                            "stepId": step.id,
                            "attempt": attempt,
                            "attemptId": f"attempt_{attempt}",
                            "error": error,
                        },
                    }
                )
                if not will_retry:
                    raise
                if retry_at is not None:
                    self.recorder.flush()  # the retry's moment is on the log before the wait
                    wait_until(retry_at)
                attempt += 1
                defer(_attempt_started(step, path, attempt))
                continue
            defer(
                {
                    "type": "StepCompleted",
                    "payload": {
                        "stepPath": path,
                        "stepId": step.id,
                        "attempt": attempt,
                        "output": output,
                        "metadata": {"uses": step.kind},
                    },
                }
            )
            return output

    def _body(
        self, step: Step, path: str, attempt: int, arg: Any, outputs: Mapping[str, Any], visit: int | None
    ) -> Any:
        if isinstance(step, CodeRun):
            return _user_code(step.fn, arg, outputs)
        if isinstance(step, ToolStep):
            args = _user_code(step.args, arg, outputs) if callable(step.args) else dict(step.args)
            field, value = call_tool(
                recorder=self.recorder,
                record=self.record,
                tool=self.workflow.tools[step.tool],
                args=args,
                call_id=f"{call_prefix(path, attempt)}:call",
                step_path=path,
                caller="code",
                replay=self.replay,
            )
            if field == "error":
                raise StepFailure(f"tool {step.tool} failed: {_error_text(value)}", name="ToolCallFailed")
            return value
        if isinstance(step, AIGenerate):
            prompt = _user_code(step.prompt, arg, outputs) if callable(step.prompt) else step.prompt
            return run_session(
                recorder=self.recorder,
                record=self.record,
                workflow=self.workflow,
                step=step,
                step_path=path,
                prompt=prompt,
                attempt=attempt,
                replay=self.replay,
            )
        if isinstance(step, Decision):
            return self._decide(step, path, arg, outputs, visit)
        if isinstance(step, Parallel):
            return self._parallel(step, path, attempt, outputs)
        if isinstance(step, SubWorkflow):
            return self._sub_workflow(step, path, attempt, arg, outputs)
        raise TypeError(f"unknown step kind {type(step).__name__}")

    def _decide(self, step: Decision, path: str, arg: Any, outputs: Mapping[str, Any], visit: int | None) -> Any:
        target = _user_code(step.route, arg, outputs)
        ids = [s.id for s in self.workflow.steps]
        if target is None:
            return {"target": None}
        if target not in ids:
            raise StepFailure(
                f"decision {step.id} routed to {target!r}, which is not a step of {self.workflow.name}",
                name="invalid_route",
            )
        if ids.index(target) <= ids.index(step.id):
            if target != step.loop_to:
                raise StepFailure(
                    f"decision {step.id} routed back to {target!r}; it may only loop to its loop_to ({step.loop_to!r})",
                    name="invalid_route",
                )
            next_visit = (visit or 0) + 1
            if next_visit >= step.max_visits:
                raise StepFailure(
                    f"decision {step.id} routed to {target!r} for visit {next_visit + 1} of its loop; "
                    f"max_visits is {step.max_visits}",
                    name="max_visits_exceeded",
                )
        return {"target": target}

    def _parallel(self, step: Parallel, path: str, attempt: int, outputs: Mapping[str, Any]) -> Any:
        items = _user_code(step.items, self.run_input, outputs)
        if isinstance(items, Mapping):
            keyed: list[tuple[str | int, Any]] = [(str(key), item) for key, item in items.items()]
        elif isinstance(items, (list, tuple)):
            keyed = list(enumerate(items))
        else:
            raise StepFailure(
                f"the items of {step.id} must be a list or a dict, got {type(items).__name__}", name="InvalidItems"
            )
        too_long = next((key for key, _ in keyed if len(f"{path}[{key}]") > MAX_BRANCH_PATH), None)
        if too_long is not None:
            raise StepFailure(
                f"the item key {str(too_long)[:40]!r}… of {step.id} makes a step path longer than "
                f"{MAX_BRANCH_PATH} characters; use shorter keys (or a list)",
                name="InvalidItems",
            )
        if len(keyed) > step.max_branches:
            raise StepFailure(
                f"{step.id} has {len(keyed)} items; max_branches is {step.max_branches}", name="too_many_branches"
            )
        group = self.record.group(path)  # recorded by an earlier execution of this attempt
        defer = self.recorder.defer  # committed with the boundary of the branch step that follows
        if group is None:
            defer(
                {
                    "type": "ParallelGroupStarted",
                    "payload": {
                        "stepPath": path,
                        "attempt": attempt,
                        "branchCount": len(keyed),
                        "maxConcurrency": step.max_concurrency,
                        "failureMode": step.failure_mode,
                    },
                }
            )
        scheduled = set(group.branches) if group is not None else set()
        due = [
            {
                "type": "ParallelBranchScheduled",
                "payload": {"stepPath": path, "branchPath": f"{path}[{key}]", "itemKey": key, "branchIndex": i},
            }
            for i, (key, _) in enumerate(keyed)
            if f"{path}[{key}]" not in scheduled
        ]
        if due:
            defer(*due)
        ended = {p for p, b in group.branches.items() if b.status in ENDED} if group is not None else set()
        # Branches a resume finds completed are answered from the log, here; only the rest run.
        unfinished = [(key, item) for key, item in keyed if not self._completed(f"{path}[{key}]")]
        threads = min(step.max_concurrency, settings.RUNLEDGER_PARALLEL_THREADS, len(unfinished))
        if threads > 1 and threads_allowed():
            self.recorder.flush()  # the group's start is on the log before any branch writes
            fresh = self._concurrently(step, path, unfinished, outputs, ended, threads)
        else:
            fresh = self._one_by_one(step, path, unfinished, outputs, ended)
        results: list[tuple[Any, Any]] = []
        for key, item in keyed:
            branch_path = f"{path}[{key}]"
            if branch_path not in fresh:
                fresh[branch_path] = self._branch(step, path, key, item, outputs, ended)
            outcome, value = fresh[branch_path]
            if outcome == "failed" and not step.allow_failure:
                if group is None or group.status not in ENDED:
                    defer(
                        {
                            "type": "ParallelGroupFailed",
                            "payload": {
                                "stepPath": path,
                                "error": {"name": "BranchFailed", "message": f"{branch_path}: {value['message']}"},
                            },
                        }
                    )
                raise StepFailure(f"branch {branch_path} failed: {value['message']}", name="BranchFailed")
            results.append((key, value if outcome == "completed" else {"status": "failed", "error": value}))
        if group is None or group.status not in ENDED:
            defer(
                {
                    "type": "ParallelGroupCompleted",
                    "payload": {"stepPath": path, "branchCount": len(keyed), "fanInOrder": [key for key, _ in keyed]},
                }
            )
        return dict(results) if isinstance(items, Mapping) else [output for _, output in results]

    def _completed(self, branch_path: str) -> bool:
        done = self.record.step(branch_path)
        return done is not None and done.status == "completed"

    def _branch(
        self, step: Parallel, path: str, key: Any, item: Any, outputs: Mapping[str, Any], ended: set[str]
    ) -> tuple[str, Any]:
        """Run one branch (its step through its attempts) and defer its end: ("completed", output)
        or ("failed", error)."""
        branch_path = f"{path}[{key}]"
        try:
            output = self.step(step.branch, branch_path, item, outputs)
        except StepFailure as failure:
            error = failure.as_error()
            if branch_path not in ended:
                self.recorder.defer(
                    {
                        "type": "ParallelBranchFailed",
                        "payload": {"stepPath": path, "branchPath": branch_path, "error": error},
                    }
                )
            return "failed", error
        if branch_path not in ended:
            self.recorder.defer(
                {"type": "ParallelBranchCompleted", "payload": {"stepPath": path, "branchPath": branch_path}}
            )
        return "completed", output

    def _one_by_one(
        self, step: Parallel, path: str, todo: list[tuple[Any, Any]], outputs: Mapping[str, Any], ended: set[str]
    ) -> dict[str, tuple[str, Any]]:
        """The branches in this thread, in item order; a failure stops the rest (fail_fast)."""
        done: dict[str, tuple[str, Any]] = {}
        for key, item in todo:
            done[f"{path}[{key}]"] = outcome = self._branch(step, path, key, item, outputs, ended)
            if outcome[0] == "failed" and not step.allow_failure:
                break
        return done

    def _concurrently(
        self,
        step: Parallel,
        path: str,
        todo: list[tuple[Any, Any]],
        outputs: Mapping[str, Any],
        ended: set[str],
        threads: int,
    ) -> dict[str, tuple[str, Any]]:
        """The branches on `threads` threads, each with its own view of the recorder (its facts in its
        own commits, under the run's one lease and write lock) and its own database connection,
        closed when it ends. A failed branch (fail_fast) or an executor error keeps the branches not
        yet started from starting; those running finish. An executor error (fenced, a call in doubt,
        an integrity error, the process being told to stop) is raised once all have stopped."""
        stop = threading.Event()
        done: dict[str, tuple[str, Any]] = {}
        errors: list[BaseException] = []

        def work(key: Any, item: Any) -> None:
            if stop.is_set():
                return
            runner = copy.copy(self)
            runner.recorder = self.recorder.branch()
            try:
                outcome = runner._branch(step, path, key, item, outputs, ended)
                if outcome[0] == "failed" and not step.allow_failure:
                    stop.set()  # before its failure commits: no branch starts once that is on the log
                runner.recorder.flush()  # the branch's end commits when it ends
                done[f"{path}[{key}]"] = outcome
            except BaseException as exc:  # noqa: BLE001 - handed to the executor's thread below
                errors.append(exc)
                stop.set()
            finally:
                connections.close_all()  # this thread's own

        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"branch:{path}") as pool:
            for key, item in todo:
                # Each branch sees the caller's context (ledger.clock's backdating, for one).
                pool.submit(contextvars.copy_context().run, work, key, item)
        if errors:
            raise errors[0]
        return done

    def _sub_workflow(self, step: SubWorkflow, path: str, attempt: int, arg: Any, outputs: Mapping[str, Any]) -> Any:
        sub_input = _user_code(step.input, arg, outputs) if callable(step.input) else dict(step.input)
        prefix = call_prefix(path, attempt)
        call_id = f"{prefix}:workflow"
        child_id = sub_run_id(self.recorder.run_id, prefix)
        recorded = self.record.tool_outcome(call_id)
        if recorded is None:
            began = time.monotonic()
            outcome = _finished_run(self.workspace, child_id)  # finished while the parent was down
            if outcome is None:
                # Unregistered here is a deployment problem, not the step's: refuse, record nothing.
                workflow = get_workflow(step.workflow)
                if not self.record.tool_started(call_id):
                    # The reservation is on the parent's log before the sub-run exists.
                    self.recorder.append(
                        {
                            "type": "harness.tool_call.started",
                            "payload": {
                                "callId": call_id,
                                "caller": "workflow",
                                "toolName": f"workflow:{step.workflow}",
                                "args": {"subRunId": child_id, "workflow": step.workflow, "input": sub_input},
                                "effect": "write",
                                "stepPath": path,
                                "subRunId": child_id,
                            },
                        }
                    )
                if self.replay is not None:  # the sub-run is re-executed too, against its original's record
                    outcome = self.replay.run_child(
                        workspace=self.workspace,
                        workflow=workflow,
                        input=sub_input,
                        run_id=child_id,
                        call_id=call_id,
                        parent=self.recorder,
                    )
                else:
                    outcome = start_run(
                        workspace=self.workspace,
                        workflow=workflow,
                        input=sub_input,
                        run_id=child_id,
                        parent_run_id=self.recorder.run_id,
                        parent=self.recorder,
                    )
            field = "result" if outcome.status == RunStatus.COMPLETED else "error"
            value = outcome.output if field == "result" else outcome.error
            # Committed with the step's end: the sub-run's own log already holds its outcome.
            self.recorder.defer(
                {
                    "type": f"harness.tool_call.{'succeeded' if field == 'result' else 'failed'}",
                    "payload": {
                        "callId": call_id,
                        field: value,
                        "stepPath": path,
                        "subRunId": child_id,
                        "durationMs": round((time.monotonic() - began) * 1000),
                    },
                }
            )
            recorded = (field, value)
        field, value = recorded
        if field == "result":
            return value
        if step.allow_failure:
            return {"status": "failed", "subRunId": child_id, "error": value}
        message = value.get("message") if isinstance(value, Mapping) else value
        raise StepFailure(f"sub-run {child_id} ({step.workflow}) failed: {message}", name="SubRunFailed")


def _attempt_started(step: Step, path: str, attempt: int) -> dict[str, Any]:
    return {
        "type": "StepAttemptStarted",
        "payload": {"stepPath": path, "stepId": step.id, "attempt": attempt, "attemptId": f"attempt_{attempt}"},
    }


def _error_text(error: Any) -> str:
    """A tool's recorded error as people read it, `Name: message` (a record from elsewhere may hold
    any JSON: then that JSON)."""
    if isinstance(error, Mapping) and isinstance(error.get("message"), str):
        return f"{error['name']}: {error['message']}" if error.get("name") else error["message"]
    return error if isinstance(error, str) else json.dumps(error, ensure_ascii=False)


def _user_code(fn: Any, arg: Any, outputs: Mapping[str, Any]) -> Any:
    try:
        return fn(arg, dict(outputs))
    except Exception as exc:  # the step's failure is recorded, not the executor's
        raise StepFailure(str(exc), name=type(exc).__name__) from exc
