"""Re-execution through the runtime (docs/design.md §5 item 5): the five modes, one write path.

`execute_reexecution` runs one mode of a run; `mode_plan` says what a mode would do without
doing it. Every mode but `resume` makes a new run whose RunStarted carries `replayOf` (the
original) and `reexecutionId`, plus `reexecution: {mode, fromStep?, modelOverrides?}` so that
calling again after the executor died resumes the same new run under the same rules (committed
calls are never made twice, a run is never started twice).

- `simulate`: the workflow's code runs again; every model and tool call is answered from the
  original's record (`origin: simulated`, `replayOf` = the original event), matched by its call
  identity (step path, attempt, turn, call index: the call id) and checked against it (the prompt
  hash of a model call, tool name and canonical args of a tool call). A call the record cannot
  answer is written as `harness.replay.diverged` and fails its step (ReplayDiverged): it is
  never made live.
- `evaluate`: model calls live, through the requested model mapping (`model_overrides`: slot ->
  {provider, model}, providers.py's registry); tool calls answered from the original's record
  by tool name and canonical args (the same step's call first). A tool call the record cannot
  answer is a `harness.replay.diverged` and reaches the model as a tool error.
- `fork` from step X: the original's events before X's first event are copied into the new run
  (`origin: recorded` on model and tool events, `replayOf` on each), with the rows that resolve an
  imported log's refs among them (artifacts.carry_imported), so the executor reuses those steps as
  completed; X onward runs live (optionally with another input and models).
- `rerun`: everything live, the same input (or `input`).
- `resume`: the original run continues (`ledger resume`); in-doubt tool calls still block.

`simulate` and `evaluate` execute a copy of the workflow whose tools have no function (and, for
simulate, whose models have no provider): the live path is not reachable from these executions,
whatever the workflow asks for. Sub-runs are re-executed the same way against their original
sub-runs. Calls served from the record cost nothing: the fold keeps their tokens in
`replayed_usage`, outside the run's spend (docs/operations.md).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..canonical import digest
from ..errors import Conflict, NotFound
from ..fold import ModelCall, RunState, ToolCallState, fold
from ..fold.pricing import prices_for
from ..log import append, artifacts
from ..log.envelopes import log_of
from ..log.redaction import Redactor, policy
from ..log.verify import artifact_refs
from ..log.vocabulary import MODEL_AND_TOOL_PREFIXES, TERMINAL_RUN_TYPES
from ..models import Run, Workspace
from ..replay.divergence import rename_runs
from .errors import InvalidReexecution, ReplayDiverged, UnknownModelProvider, UnknownStep, UnknownWorkflow
from .executor import RunOutcome, resume_run, sub_run_id
from .providers import ModelReply, ModelRequest, known_providers, provider_for
from .record import inline_or_ref, recorded_field
from .recorder import Recorder
from .registry import AIGenerate, Parallel, Step, SubWorkflow, Tool, ToolCall, Workflow, get_workflow

MODES = ("simulate", "evaluate", "resume", "fork", "rerun")
NEW_RUN_MODES = ("simulate", "evaluate", "fork", "rerun")
DIVERGED = "harness.replay.diverged"
# Copied prefixes go in batches below the log's append' limit.
COPY_BATCH = 2000
# Who a re-execution's new run was started by (Run.started_by): its worker, for the request.
REEXECUTION = "system:reexecution"


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class ReexecutionConflict(Conflict):
    code = "reexecution_conflict"


# --- the original run, folded --------------------------------------------------------------


@dataclass
class _Original:
    """An original run's log and fold, indexed by call identity for serving its calls."""

    run_id: str
    log: list[dict[str, Any]]
    state: RunState
    run: Run | None = None
    model_calls: dict[str, ModelCall] = field(default_factory=dict)
    by_tool: dict[tuple[str, str], list[ToolCallState]] = field(default_factory=dict)

    @classmethod
    def load(cls, workspace: Workspace, run_id: str) -> _Original:
        run = Run.objects.filter(workspace=workspace, run_id=run_id).first()
        if run is None:
            raise NotFound(f"run {run_id} not found", runId=run_id)
        log = log_of(run)
        original = cls(run_id=run_id, log=log, state=fold(log, prices=prices_for(workspace), run_id=run_id), run=run)
        for call in original.state.model_calls:
            if call.call_id is not None:
                original.model_calls[call.call_id] = call  # a later record of one call id wins
        for tool in original.state.tool_calls.values():
            if tool.caller != "workflow" and tool.tool_name is not None and tool.status in ("succeeded", "failed"):
                original.by_tool.setdefault((tool.tool_name, _args_digest(original.args(tool))), []).append(tool)
        return original

    @classmethod
    def empty(cls, run_id: str) -> _Original:
        return cls(run_id=run_id, log=[], state=RunState(run_id=run_id))

    def event(self, sequence: int | None) -> dict[str, Any] | None:
        return self.log[sequence - 1] if sequence and 0 < sequence <= len(self.log) else None

    def event_id(self, sequence: int | None) -> str | None:
        env = self.event(sequence)
        return env["eventId"] if env is not None else None

    def recorded(self, sequence: int | None, name: str, folded: Any) -> Any:
        """Field `name` of event `sequence` as it was recorded (Record.recorded): what is served."""
        return recorded_field(self.run, self.log, sequence, name, folded)

    def value(self, value: Any, ref: str | None) -> Any:
        """A run-level value of the original (its input) as recorded (record.inline_or_ref)."""
        if not ref:
            return value
        if self.run is None:
            raise NotFound(f"run {self.run_id} not found", runId=self.run_id)
        return inline_or_ref(self.run, value, ref)

    def as_recorded(self, env: Mapping[str, Any]) -> Mapping[str, Any]:
        if self.run is None:
            return env["payload"]
        return artifacts.as_recorded(self.run, env["type"], env["payload"])

    def args(self, call: ToolCallState) -> Any:
        return self.recorded(call.started_sequence, "args", call.args)

    def outcome(self, call: ToolCallState) -> tuple[str, Any]:
        field_ = "result" if call.status == "succeeded" else "error"
        return field_, self.recorded(call.ended_sequence, field_, call.result if field_ == "result" else call.error)

    @property
    def started(self) -> dict[str, Any]:
        first = self.log[0] if self.log else None
        return dict(first["payload"]) if first is not None and first["type"] == "RunStarted" else {}


def _args_digest(args: Any) -> str:
    try:
        return digest(args)
    except Exception:  # noqa: BLE001 - an imported log's args without a canonical form match nothing
        return ""


def sub_run_renames(original: _Original, run_id: str) -> dict[str, str]:
    """{the id run `run_id` gives a sub-run: the id the original gave it at the same step}; both
    are sub_run_id(parent, call prefix), so this needs no look at the new run's log."""
    renames = {}
    for call_id, call in original.state.tool_calls.items():
        sub = call.args.get("subRunId") if call.caller == "workflow" and isinstance(call.args, Mapping) else None
        if isinstance(sub, str) and call_id.endswith(":workflow"):
            renames[sub_run_id(run_id, call_id.removesuffix(":workflow"))] = sub
    return renames


# --- the policy the executor consults -------------------------------------------------------


class _NoLiveModel:
    """The model of a slot in a simulation: its name and id (what the prompt hash and manifest
    hold) without any provider behind it."""

    def __init__(self, name: str, model_id: str) -> None:
        self.name, self.model_id = name, model_id

    def generate(self, request: ModelRequest) -> ModelReply:
        raise RuntimeError(f"no live model path in a simulation ({request.step_path} turn {request.turn})")


class _Guarded:
    """A live model behind a guard asked before each call: its name and model id unchanged."""

    def __init__(self, inner: Any, guard: Callable[[ModelRequest], None]) -> None:
        self.inner, self.guard = inner, guard
        self.name, self.model_id = inner.name, inner.model_id

    def generate(self, request: ModelRequest) -> ModelReply:
        self.guard(request)
        return self.inner.generate(request)


def _as_raised(error: Any) -> Any:
    """A recorded tool error with its keys in the order toolcalls.py builds them ({name,
    message}): the log keeps canonical (sorted) JSON, and a step's failure message quotes the
    error as the live call's dict printed, so the served one must print the same."""
    if not isinstance(error, Mapping) or not {"name", "message"} <= error.keys():
        return error
    return {
        "name": error["name"],
        "message": error["message"],
        **{k: v for k, v in error.items() if k not in ("name", "message")},
    }


def _no_live_tool(name: str) -> Any:
    def unreachable(args: Any) -> Any:
        raise RuntimeError(f"tool {name} has no live path in this re-execution")

    unreachable.__qualname__ = f"no_live_path_{name}"
    return unreachable


@dataclass
class Replay:
    """One re-execution's rules, handed to the executor (executor.resume_run's `replay`)."""

    mode: str
    original: _Original
    reexecution_id: str
    model_overrides: Mapping[str, Mapping[str, str]]
    redactor: Redactor
    # An evaluation's prompt change (step id -> {system?, prompt?}): applied to this run's own
    # workflow, not to its sub-runs' (check_prompt_overrides).
    prompt_overrides: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # Asked before each live model call (raises to refuse it: the call fails, the provider is
    # never asked); an evaluation's spend ceiling (ledger/evaluation/budget.py).
    guard: Callable[[ModelRequest], None] | None = None
    _renames: dict[tuple[str, str], dict[str, str]] = field(default_factory=dict, repr=False)

    @property
    def origin(self) -> str:
        """What the run's own (not served) model and tool events are: nothing is live in a simulation."""
        return "simulated" if self.mode == "simulate" else "live"

    def workflow(self, workflow: Workflow) -> Workflow:
        """The workflow as this mode may execute it: without tool functions in simulate and
        evaluate, without providers in simulate, with the model mapping otherwise."""
        if self.prompt_overrides:
            workflow = with_prompts(workflow, self.prompt_overrides)
        tools, models = dict(workflow.tools), dict(workflow.models)
        if self.mode in ("simulate", "evaluate"):
            tools = {name: replace(tool, fn=_no_live_tool(name)) for name, tool in tools.items()}
        if self.mode == "simulate":
            models = {slot: _NoLiveModel(p.name, p.model_id) for slot, p in models.items()}
        else:
            for slot, target in self.model_overrides.items():
                if slot in models:
                    models[slot] = provider_for(
                        provider=str(target["provider"]), model=str(target["model"]), current=models[slot]
                    )
            if self.guard is not None:
                models = {slot: _Guarded(p, self.guard) for slot, p in models.items()}
        return replace(workflow, tools=tools, models=models)

    def as_original(self, run_id: str, value: Any) -> Any:
        """`value` with this run's sub-run ids written as the original's: a sub-run's id is its
        identity, not content, so a request that differs from the original's only by naming the
        re-executed sub-run instead of the original one is the same request."""
        key = (self.original.run_id, run_id)
        if key not in self._renames:
            self._renames[key] = sub_run_renames(self.original, run_id)
        return rename_runs(value, self._renames[key])

    # -- models --

    def serve_model(
        self,
        *,
        recorder: Recorder,
        step_path: str,
        call_id: str,
        turn: int,
        prompt_hash: str,
        request: Mapping[str, Any],
        body: Mapping[str, Any],
    ) -> ModelReply | dict[str, Any] | None:
        """The original's answer to this model call (a reply, or its recorded error); None when
        models are live in this mode. Raises ReplayDiverged when the record cannot answer."""
        if self.mode != "simulate":
            return None
        call = self.original.model_calls.get(call_id)
        where = {"stepPath": step_path, "kind": "model", "callId": call_id, "turn": turn}
        if call is None:
            self._diverge(
                recorder,
                where,
                "not_in_record",
                f"step {step_path} turn {turn}: the original made no model call {call_id}",
            )
        assert call is not None
        if (
            call.prompt_hash is not None
            and call.prompt_hash != prompt_hash
            and call.prompt_hash != digest(self.as_original(recorder.run_id, body))
        ):
            self._diverge(
                recorder,
                where,
                "request_changed",
                f"step {step_path} turn {turn}: the request differs from the original's "
                f"({call.prompt_hash} -> {prompt_hash})",
                expected=call.prompt_hash,
                actual=prompt_hash,
            )
        answer = self.original.event(call.responded_sequence if call.status == "responded" else call.failed_sequence)
        if call.status not in ("responded", "failed") or answer is None:
            self._diverge(
                recorder,
                where,
                "unanswered",
                f"step {step_path} turn {turn}: the original's call {call_id} has no answer",
            )
        assert answer is not None
        # As recorded: an answer too long to keep inline is served whole, read back from its artifacts.
        p = self.original.as_recorded(answer)
        served = {"origin": "simulated"}
        called = {
            "turn": turn,
            "callId": call_id,
            "stepPath": step_path,
            "promptHash": prompt_hash,
            "request": dict(request),
            **served,
            "replayOf": self.original.event_id(call.called_sequence) or answer["eventId"],
        }
        if call.status == "responded":
            response: Mapping[str, Any] = p["response"] if isinstance(p.get("response"), Mapping) else {}
            recorder.defer(
                {"type": "harness.model.called", "payload": called},
                {
                    "type": "harness.model.responded",
                    "payload": {
                        "turn": turn,
                        "callId": call_id,
                        "stepPath": step_path,
                        "model": p.get("model"),
                        "response": response,
                        **served,
                        "replayOf": answer["eventId"],
                    },
                },
            )
            return ModelReply(
                text=response.get("text"),
                tool_calls=list(response.get("toolCalls") or []),
                usage=dict(response.get("usage") or {}),
            )
        error: Mapping[str, Any] = (
            p["error"]
            if isinstance(p.get("error"), Mapping)
            else {"name": "ModelCallFailed", "message": str(p.get("error"))}
        )
        failed = {
            "turn": turn,
            "callId": call_id,
            "stepPath": step_path,
            "error": error,
            **served,
            "replayOf": answer["eventId"],
        }
        if isinstance(p.get("model"), Mapping):
            failed["model"] = p["model"]
        recorder.defer(
            {"type": "harness.model.called", "payload": called}, {"type": "harness.model.failed", "payload": failed}
        )
        return dict(error)

    # -- tools --

    def _recorded_under_other_rules(self, call: ToolCallState, args: Any) -> bool:
        """Whether the recorded call's arguments, redacted by today's rules, are `args`: the
        workspace's redaction rules may have changed since the original was recorded."""
        return _args_digest(self.redactor(self.original.args(call))) == _args_digest(args)

    def serve_tool(
        self, *, recorder: Recorder, tool: Tool, args: Any, call_id: str, step_path: str, caller: str, turn: int | None
    ) -> tuple[str, Any] | None:
        """("result"|"error", value) from the original's record; None when tools are live here."""
        if self.mode not in ("simulate", "evaluate"):
            return None
        args = self.redactor(args)  # the record holds args as redacted
        where: dict[str, Any] = {
            "stepPath": step_path,
            "kind": "tool",
            "callId": call_id,
            "toolName": tool.name,
            "args": args,
        }
        if turn is not None:
            where["turn"] = turn
        if self.mode == "simulate":
            call = self.original.state.tool_calls.get(call_id)
            if call is None or call.caller == "workflow":
                self._diverge(
                    recorder,
                    where,
                    "not_in_record",
                    f"step {step_path}: the original made no tool call {call_id} ({tool.name})",
                )
            assert call is not None
            recorded_args = self.original.args(call)
            recorded = _args_digest(recorded_args)
            if call.tool_name != tool.name or (
                recorded != _args_digest(args)
                and recorded != _args_digest(self.as_original(recorder.run_id, args))
                and not self._recorded_under_other_rules(call, args)
            ):
                self._diverge(
                    recorder,
                    where,
                    "request_changed",
                    f"step {step_path}: tool call {call_id} asks for {tool.name} with other arguments "
                    f"than the original ({call.tool_name})",
                    expected={"toolName": call.tool_name, "args": recorded_args},
                )
            if call.status not in ("succeeded", "failed"):
                self._diverge(
                    recorder,
                    where,
                    "unanswered",
                    f"step {step_path}: the original's tool call {call_id} has no outcome ({call.status})",
                )
        else:
            candidates = self.original.by_tool.get((tool.name, _args_digest(args)), [])
            if not candidates:
                candidates = [
                    c
                    for (name, _), calls in self.original.by_tool.items()
                    if name == tool.name
                    for c in calls
                    if self._recorded_under_other_rules(c, args)
                ]
            call = next((c for c in candidates if c.step_path == step_path), candidates[0] if candidates else None)
            if call is None:
                # Answered to the model as an error; the call itself never leaves.
                error = {
                    "name": "ReplayDiverged",
                    "message": f"{tool.name} with these arguments is not in the original's record; "
                    "an evaluation never calls a tool live",
                }
                recorder.append(
                    {"type": DIVERGED, "payload": {**where, "reason": "not_in_record", "message": error["message"]}}
                )
                recorder.defer(
                    *self._tool_events(tool, args, call_id, step_path, caller, turn, "error", error, None, None, 0)
                )
                return "error", error
        field_, value = self.original.outcome(call)
        if field_ == "error":
            value = _as_raised(value)
        recorder.defer(
            *self._tool_events(
                tool,
                args,
                call_id,
                step_path,
                caller,
                turn,
                field_,
                value,
                self.original.event_id(call.started_sequence),
                self.original.event_id(call.ended_sequence),
                call.duration_ms or 0,
            )
        )
        return field_, value

    @staticmethod
    def _tool_events(
        tool: Tool,
        args: Any,
        call_id: str,
        step_path: str,
        caller: str,
        turn: int | None,
        field_: str,
        value: Any,
        started_of: str | None,
        ended_of: str | None,
        duration_ms: float,
    ) -> list[dict[str, Any]]:
        started: dict[str, Any] = {
            "callId": call_id,
            "caller": caller,
            "toolName": tool.name,
            "args": args,
            "effect": tool.effect,
            "stepPath": step_path,
            "origin": "simulated",
        }
        ended: dict[str, Any] = {
            "callId": call_id,
            field_: value,
            "durationMs": duration_ms,
            "stepPath": step_path,
            "origin": "simulated",
        }
        if turn is not None:
            started["turn"] = turn
        if started_of is not None:
            started["replayOf"] = started_of
        if ended_of is not None:
            ended["replayOf"] = ended_of
        kind = "succeeded" if field_ == "result" else "failed"
        return [
            {"type": "harness.tool_call.started", "payload": started},
            {"type": f"harness.tool_call.{kind}", "payload": ended},
        ]

    def _diverge(self, recorder: Recorder, where: Mapping[str, Any], reason: str, message: str, **details: Any) -> None:
        recorder.append(
            {
                "type": DIVERGED,
                "payload": {**where, "reason": reason, "message": message, **details, "replayOf": self.original.run_id},
            }
        )
        raise ReplayDiverged(f"{message}; a {self.mode} never makes a call live", reason=reason, **dict(where))

    # -- sub-runs --

    def run_child(
        self, *, workspace: Workspace, workflow: Workflow, input: Any, run_id: str, call_id: str, parent: Recorder
    ) -> RunOutcome:
        """Re-execute a sub-run this run's step starts, against the sub-run the original's same
        step started (a simulation whose original started none diverges)."""
        reserved = self.original.state.tool_calls.get(call_id)
        sub = reserved.args.get("subRunId") if reserved is not None and isinstance(reserved.args, Mapping) else None
        if isinstance(sub, str) and self.mode in ("simulate", "evaluate"):
            original = _Original.load(workspace, sub)
        elif self.mode == "simulate":
            self._diverge(
                parent,
                {
                    "stepPath": str(reserved.step_path if reserved else call_id.split(":")[0]),
                    "kind": "sub_run",
                    "callId": call_id,
                },
                "not_in_record",
                f"the original started no sub-run for {call_id}",
            )
            raise AssertionError("unreachable")
        else:
            original = _Original.empty(sub if isinstance(sub, str) else "")
        child = replace(
            self, original=original, mode="rerun" if self.mode == "fork" else self.mode, prompt_overrides={}
        )
        return _run(
            workspace=workspace,
            replay=child,
            workflow=workflow,
            run_id=run_id,
            run_input=input,
            spec={"mode": child.mode},
            replay_of=sub if isinstance(sub, str) else None,
            parent=parent,
        )


# --- the entry points -----------------------------------------------------------------------


def execute_reexecution(
    *,
    workspace: Workspace,
    original_run_id: str,
    mode: str,
    new_run_id: str,
    reexecution_id: str,
    from_step: str | None = None,
    input: Any = UNSET,
    model_overrides: Mapping[str, Mapping[str, str]] | None = None,
    guard: Callable[[ModelRequest], None] | None = None,
    prompt_overrides: Mapping[str, Mapping[str, str]] | None = None,
    workflow: str | None = None,
    workflow_version: str | None = None,
) -> RunOutcome:
    """Execute `mode` of `original_run_id` to the end and return the outcome of the run it made
    (or of the original, for `resume`). Calling it again for the same `new_run_id` resumes that
    run (after a killed worker); a finished one returns its recorded outcome.

    `prompt_overrides` (step id -> {system?, prompt?}) and `workflow` (a registered workflow's
    name, pinned to `workflow_version` when given) are an evaluation's changes beyond a model
    mapping (docs/evaluations.md "Changes"): the new run executes the original's workflow with
    those prompts, or the named workflow, with the original's input (or `input`)."""
    if mode not in MODES:
        raise InvalidReexecution(f"unknown mode {mode!r}; one of {', '.join(MODES)}", mode=mode)
    if mode == "resume":
        return resume_run(workspace=workspace, run_id=original_run_id)
    original = _Original.load(workspace, original_run_id)
    existing = Run.objects.filter(workspace=workspace, run_id=new_run_id).first()
    if existing is not None:
        spec = _existing_spec(existing, original_run_id, reexecution_id)
        mode, from_step, model_overrides = spec["mode"], spec.get("fromStep"), spec.get("modelOverrides")
        prompt_overrides, workflow = spec.get("promptOverrides"), spec.get("workflow")
        workflow_version = spec.get("workflowVersionId")
    if workflow and mode != "evaluate":
        raise InvalidReexecution("another workflow is a change of mode evaluate only", field="workflow")
    chosen = registered_workflow(workflow, workflow_version) if workflow else _workflow_of(original)
    overrides = _check_overrides(chosen, mode, model_overrides)
    prompts = check_prompt_overrides(chosen, prompt_overrides) if prompt_overrides else {}
    if prompts and mode != "evaluate":
        raise InvalidReexecution("prompt overrides are a change of mode evaluate only", field="promptOverrides")
    cut = _fork_cut(original, from_step) if mode == "fork" else None
    replay = Replay(
        mode=mode,
        original=original,
        reexecution_id=reexecution_id,
        model_overrides=overrides,
        redactor=policy(workspace.redact_keys, workspace.redact_value_patterns),
        guard=guard,
        prompt_overrides=prompts,
    )
    spec = {
        "mode": mode,
        **({"fromStep": from_step} if mode == "fork" else {}),
        **({"modelOverrides": {k: dict(v) for k, v in overrides.items()}} if overrides else {}),
        **({"promptOverrides": {k: dict(v) for k, v in prompts.items()}} if prompts else {}),
        **({"workflow": chosen.name, "workflowVersionId": chosen.version_id} if workflow else {}),
    }
    if input is UNSET:
        started = original.started
        run_input = original.value(started.get("input"), started.get("inputRef"))
    else:
        run_input = input
    prefix = _copied_prefix(original, cut) if cut is not None else []
    return _run(
        workspace=workspace,
        replay=replay,
        workflow=chosen,
        run_id=new_run_id,
        run_input=run_input,
        spec=spec,
        replay_of=original_run_id,
        prefix=prefix,
    )


def _run(
    *,
    workspace: Workspace,
    replay: Replay,
    workflow: Workflow,
    run_id: str,
    run_input: Any,
    spec: Mapping[str, Any],
    replay_of: str | None,
    parent: Recorder | None = None,
    prefix: Sequence[Mapping[str, Any]] = (),
) -> RunOutcome:
    derived = replay.workflow(workflow)
    run = Run.objects.filter(workspace=workspace, run_id=run_id).first()
    if run is None:
        payload: dict[str, Any] = {
            "workflowVersionId": derived.version_id,
            "workflow": derived.name,
            "workflowVersionHash": derived.version,
            "input": run_input,
            "reexecutionId": replay.reexecution_id,
            "reexecution": dict(spec),
        }
        if replay_of:
            payload["replayOf"] = replay_of
        if parent is not None:
            payload["parentRunId"] = parent.run_id
        # Started by the re-execution's worker; the person is the request's requester, which the
        # "not your own" rules read from the request (ReexecutionRequest.requested_by).
        Recorder(workspace=workspace, run_id=run_id, last_sequence=0, parent=parent, started_by=REEXECUTION).append(
            {"type": "RunStarted", "payload": payload}, *prefix[: COPY_BATCH - 1]
        )
        copied = min(len(prefix), COPY_BATCH - 1)
        last = 1 + copied
    else:
        last = run.last_sequence
        copied = last - 1  # the executor writes nothing before the whole prefix is copied
    for start in range(copied, len(prefix), COPY_BATCH):
        last = append(
            workspace=workspace, run_id=run_id, events=list(prefix[start : start + COPY_BATCH]), expected_sequence=last
        ).last_sequence
    # The copied events of an imported run name its artifacts by the other system's refs.
    foreign = {r for e in prefix for r in artifact_refs(e["payload"], imported=True) if not artifacts.parse_ref(r)}
    if foreign and replay.original.run is not None:
        artifacts.carry_imported(replay.original.run, Run.objects.get(workspace=workspace, run_id=run_id), foreign)
    return resume_run(workspace=workspace, run_id=run_id, workflow=derived, parent=parent, replay=replay)


def _existing_spec(run: Run, original_run_id: str, reexecution_id: str) -> dict[str, Any]:
    """The rules a new run was started under, refusing a run that belongs to another request."""
    first = log_of(run)[:1]
    started = first[0]["payload"] if first and first[0]["type"] == "RunStarted" else {}
    spec = started.get("reexecution")
    if (
        started.get("replayOf") != original_run_id
        or started.get("reexecutionId") != reexecution_id
        or not isinstance(spec, Mapping)
        or spec.get("mode") not in NEW_RUN_MODES
    ):
        raise ReexecutionConflict(
            f"run {run.run_id} exists and is not re-execution {reexecution_id} of {original_run_id}", runId=run.run_id
        )
    return dict(spec)


def _workflow_of(original: _Original) -> Workflow:
    name = original.started.get("workflow")
    if not isinstance(name, str):
        raise UnknownWorkflow(
            f"run {original.run_id} was not started by this deployment's runtime (its RunStarted "
            "names no workflow); an external executor must re-execute it",
            runId=original.run_id,
        )
    return get_workflow(name)


def registered_workflow(name: str, version_id: str | None = None) -> Workflow:
    """The registered workflow `name`, refused when it is not at `version_id` (when given): what
    an evaluation's workflow change runs, pinned to the version it was approved for."""
    workflow = get_workflow(name)
    if version_id and workflow.version_id != version_id:
        raise InvalidReexecution(
            f"workflow {name} is registered here at version {workflow.version_id}, not {version_id}",
            field="workflow",
            workflow=name,
            registered=workflow.version_id,
        )
    return workflow


# --- prompt overrides ------------------------------------------------------------------------

ORIGINAL_PROMPT = "{original}"
PROMPT_KEYS = ("system", "prompt")


def prompt_steps(workflow: Workflow) -> dict[str, AIGenerate]:
    """The workflow's prompts by the name a prompt override gives them: the id of each
    `AIGenerate` step, and the id of each `Parallel` whose branch is one (all its branches)."""
    found: dict[str, AIGenerate] = {}
    for step in workflow.steps:
        if isinstance(step, AIGenerate):
            found[step.id] = step
        elif isinstance(step, Parallel) and isinstance(step.branch, AIGenerate):
            found[step.id] = step.branch
    return found


def check_prompt_overrides(workflow: Workflow, value: Any) -> dict[str, dict[str, str]]:
    """`{step id: {system?, prompt?}}`, each naming one of `prompt_steps(workflow)`; a prompt may
    quote the prompt the workflow's code built as `{original}`."""
    if not isinstance(value, Mapping) or not value:
        raise InvalidReexecution("promptOverrides is an object: step id -> {system?, prompt?}", field="promptOverrides")
    steps = prompt_steps(workflow)
    checked: dict[str, dict[str, str]] = {}
    for name, override in value.items():
        if name not in steps:
            raise InvalidReexecution(
                f"workflow {workflow.name} has no prompt {name!r} (its ai.generate steps: {sorted(steps)})",
                field="promptOverrides",
                step=name,
            )
        if (
            not isinstance(override, Mapping)
            or not override
            or set(override) - set(PROMPT_KEYS)
            or not all(isinstance(v, str) for v in override.values())
            or ("prompt" in override and not override["prompt"].strip())
        ):
            raise InvalidReexecution(
                f"promptOverrides[{name!r}] is {{system?, prompt?}}: strings, at least one, a prompt not empty",
                field="promptOverrides",
                step=name,
            )
        checked[str(name)] = {k: str(override[k]) for k in PROMPT_KEYS if k in override}
    return checked


class _PromptTemplate:
    """A prompt override as the step's prompt callable: the text, with `{original}` replaced by
    the prompt the workflow's own code (or string) gives. Named by the text's digest, so the new
    run's workflow version tells one override from another."""

    def __init__(self, text: str, original: Any) -> None:
        self.text, self.original = text, original
        self.__qualname__ = f"prompt_override_{digest(text).removeprefix('sha256:')[:16]}"

    def __call__(self, run_input: Any, outputs: Mapping[str, Any]) -> str:
        if ORIGINAL_PROMPT not in self.text:
            return self.text
        built = self.original(run_input, outputs) if callable(self.original) else self.original
        return self.text.replace(ORIGINAL_PROMPT, str(built))


def _with_prompt(step: AIGenerate, override: Mapping[str, str]) -> AIGenerate:
    changed = step
    if "system" in override:
        changed = replace(changed, system=override["system"])
    if "prompt" in override:
        changed = replace(changed, prompt=_PromptTemplate(override["prompt"], step.prompt))
    return changed


def with_prompts(workflow: Workflow, overrides: Mapping[str, Mapping[str, str]]) -> Workflow:
    """`workflow` with the prompts of `overrides` (checked by check_prompt_overrides)."""
    steps: list[Step] = []
    for step in workflow.steps:
        override = overrides.get(step.id)
        if override is not None and isinstance(step, AIGenerate):
            step = _with_prompt(step, override)
        elif override is not None and isinstance(step, Parallel) and isinstance(step.branch, AIGenerate):
            step = replace(step, branch=_with_prompt(step.branch, override))
        steps.append(step)
    return replace(workflow, steps=tuple(steps))


def _check_overrides(workflow: Workflow, mode: str, overrides: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    if not overrides:
        return {}
    if mode == "simulate":
        raise InvalidReexecution(
            "a simulation serves every model call from the record; it takes no model overrides", field="modelOverrides"
        )
    checked: dict[str, dict[str, str]] = {}
    for slot, target in overrides.items():
        if slot not in workflow.models:
            raise InvalidReexecution(
                f"workflow {workflow.name} has no model slot {slot!r} (slots: {sorted(workflow.models)})",
                field="modelOverrides",
                slot=slot,
            )
        if (
            not isinstance(target, Mapping)
            or not isinstance(target.get("provider"), str)
            or not isinstance(target.get("model"), str)
            or not target["model"]
        ):
            raise InvalidReexecution(
                f"the override of slot {slot!r} needs a provider and a model", field="modelOverrides", slot=slot
            )
        if target["provider"] not in known_providers():
            raise UnknownModelProvider(
                f"no model provider named {target['provider']!r} is registered (known: {known_providers()})",
                provider=target["provider"],
            )
        checked[str(slot)] = {"provider": target["provider"], "model": target["model"]}
    return checked


# --- fork: where step X starts in the original ----------------------------------------------


def _belongs(path: Any, step: str) -> bool:
    return isinstance(path, str) and (path == step or path.startswith((f"{step}[", f"{step}.visit[")))


def _fork_cut(original: _Original, from_step: str | None) -> int:
    """The index in the original's log of step X's first event."""
    if not from_step:
        raise InvalidReexecution("a fork needs fromStep, the step it runs live from", field="fromStep")
    for index, env in enumerate(original.log):
        if _belongs(env["payload"].get("stepPath"), from_step):
            return index
    raise UnknownStep(
        f"run {original.run_id} has no step {from_step!r} (steps: {list(original.state.steps)})",
        field="fromStep",
        stepPath=from_step,
    )


def _copied_prefix(original: _Original, cut: int) -> list[dict[str, Any]]:
    """The original's events before step X, as the fork's new run records them."""
    copied = []
    for env in original.log[1:cut]:
        if env["type"] == "RunStarted" or env["type"] in TERMINAL_RUN_TYPES:
            continue
        payload = {**env["payload"], "replayOf": env["eventId"]}
        if env["type"].startswith(MODEL_AND_TOOL_PREFIXES):
            payload["origin"] = "recorded"
        event: dict[str, Any] = {"type": env["type"], "payload": payload}
        if env.get("occurrenceId"):
            event["occurrenceId"] = env["occurrenceId"]
        copied.append(event)
    return copied


# --- the plan -------------------------------------------------------------------------------

_STEP_ID = re.compile(r"^[^.\[]+")


def mode_plan(
    *,
    workspace: Workspace,
    run_id: str,
    mode: str,
    from_step: str | None = None,
    model_overrides: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, Any]:
    """What `mode` of `run_id` would do, from the fold of its log; nothing is executed.

    `{runId, mode, fromStep, workflow, workflowRegistered, modelOverrides, liveModelCalls,
    liveToolCalls, steps: [{stepPath, status, action}], sessions: [{stepPath, calls: [{kind,
    callId, turn?, toolName?, effect?, source}]}], liveWriteTools: [{stepPath, toolName, caller,
    source, callId?, args?}]}`.

    A step's `action`: `reuse` (its recorded outcome is taken as is), `simulate` (its code runs,
    every call answered from the record), `evaluate` (code runs, models live, tools from the
    record) or `live`. A call's `source`: `record` or `live` (`blocked` for a resume's in-doubt
    call). `liveWriteTools` lists every write-effect tool call the plan may make live: the
    recorded ones in steps that run live (`source: record`, with callId and args) and, when the
    workflow is registered here, every write tool those steps may call (`source: workflow`;
    a model may call a tool its original never did). Empty for simulate and evaluate.
    """
    if mode not in MODES:
        raise InvalidReexecution(f"unknown mode {mode!r}; one of {', '.join(MODES)}", mode=mode)
    original = _Original.load(workspace, run_id)
    name = original.started.get("workflow")
    workflow: Workflow | None = None
    if isinstance(name, str):
        try:
            workflow = get_workflow(name)
        except UnknownWorkflow:
            workflow = None
    overrides = (
        _check_overrides(workflow, mode, model_overrides)
        if workflow is not None
        else {slot: dict(target) for slot, target in (model_overrides or {}).items()}
    )
    state = original.state
    cut_sequence = _fork_cut(original, from_step) + 1 if mode == "fork" else None

    def step_action(path: str) -> str:
        step = state.steps[path]
        if mode in ("simulate", "evaluate"):
            return mode
        if mode == "fork":
            assert cut_sequence is not None
            return "reuse" if step.first_sequence < cut_sequence else "live"
        if mode == "resume":
            return "reuse" if step.status == "completed" else "live"
        return "live"

    actions = {path: step_action(path) for path in state.steps}

    def source(kind: str, path: str | None, answered: bool, status: str | None = None) -> str:
        # A call outside any step (a harness's own, an OpenTelemetry call after its run ended) is
        # served as the mode serves every call: a simulation makes none live.
        action = actions.get(path or "", mode if mode in ("simulate", "evaluate") else "live")
        if action == "simulate" or (action == "evaluate" and kind == "tool"):
            return "record"
        if action == "reuse":
            return "record"
        if mode == "resume":
            if status == "in_doubt":
                return "blocked"
            return "record" if answered else "live"
        return "live"

    sessions: dict[str | None, list[tuple[int, dict[str, Any]]]] = {}
    for call in state.model_calls:
        entry = {
            "kind": "model",
            "callId": call.call_id,
            "turn": call.turn,
            "source": source("model", call.step_path, call.status == "responded"),
        }
        sessions.setdefault(call.step_path, []).append((_seq(call.called_sequence, call.responded_sequence), entry))
    write_tools: list[dict[str, Any]] = []
    for tool in state.tool_calls.values():
        started = original.event(tool.started_sequence)
        effect = started["payload"].get("effect") if started is not None else None
        src = source("tool", tool.step_path, tool.status in ("succeeded", "failed"), tool.status)
        entry = {
            "kind": "tool",
            "callId": tool.call_id,
            "turn": tool.turn,
            "toolName": tool.tool_name,
            "effect": effect,
            "source": src,
        }
        sessions.setdefault(tool.step_path, []).append((_seq(tool.started_sequence, tool.ended_sequence), entry))
        if src == "live" and effect == "write" and tool.caller != "workflow":
            write_tools.append(
                {
                    "stepPath": tool.step_path,
                    "toolName": tool.tool_name,
                    "caller": tool.caller,
                    "source": "record",
                    "callId": tool.call_id,
                    "args": tool.args,
                }
            )
    if workflow is not None and mode not in ("simulate", "evaluate"):
        write_tools += _declared_write_tools(workflow, _live_from(workflow, state, actions))
    return {
        "runId": run_id,
        "mode": mode,
        "fromStep": from_step if mode == "fork" else None,
        "workflow": name if isinstance(name, str) else None,
        "workflowRegistered": workflow is not None,
        "modelOverrides": overrides,
        "liveModelCalls": mode in ("evaluate", "fork", "rerun", "resume"),
        "liveToolCalls": mode in ("fork", "rerun", "resume"),
        "steps": [
            {"stepPath": path, "status": step.status, "action": actions[path]} for path, step in state.steps.items()
        ],
        "sessions": [
            {"stepPath": path, "calls": [entry for _, entry in sorted(calls, key=lambda c: c[0])]}
            for path, calls in sorted(sessions.items(), key=lambda item: min(c[0] for c in item[1]))
        ],
        "liveWriteTools": write_tools,
    }


def _seq(*candidates: int | None) -> int:
    return min((c for c in candidates if c is not None), default=0)


def _live_from(workflow: Workflow, state: RunState, actions: Mapping[str, str]) -> int:
    """The index of the first of the workflow's steps that may run live (len(steps) if none)."""
    index = {step.id: i for i, step in enumerate(workflow.steps)}
    done = {
        index[m.group(0)]
        for path, action in actions.items()
        if action == "reuse"
        and (m := _STEP_ID.match(path))
        and m.group(0) in index
        and state.steps[path].status == "completed"
    }
    live = [
        index[m.group(0)]
        for path, action in actions.items()
        if action == "live" and (m := _STEP_ID.match(path)) and m.group(0) in index
    ]
    if live:
        return min(live)
    return 0 if not done else min(set(range(len(workflow.steps))) - done, default=len(workflow.steps))


def _declared_write_tools(
    workflow: Workflow, start: int, prefix: str = "", seen: frozenset[str] = frozenset()
) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for step in workflow.steps[start:]:
        found += _step_write_tools(workflow, step, prefix + step.id, seen | {workflow.name})
    return found


def _step_write_tools(workflow: Workflow, step: Step, path: str, seen: frozenset[str]) -> list[dict[str, Any]]:
    if isinstance(step, Parallel):
        return _step_write_tools(workflow, step.branch, f"{path}[*]", seen)
    if isinstance(step, ToolCall) and workflow.tools[step.tool].effect == "write":
        return [{"stepPath": path, "toolName": step.tool, "caller": "code", "source": "workflow"}]
    if isinstance(step, AIGenerate):
        return [
            {"stepPath": path, "toolName": name, "caller": "model", "source": "workflow"}
            for name in step.tools
            if workflow.tools[name].effect == "write"
        ]
    if isinstance(step, SubWorkflow) and step.workflow not in seen:
        try:
            child = get_workflow(step.workflow)
        except UnknownWorkflow:
            return []
        return _declared_write_tools(child, 0, f"{path}/", seen)
    return []
