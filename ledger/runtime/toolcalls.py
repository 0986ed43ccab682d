"""One tool call through the tool gateway, or its outcome from the log when it was recorded."""

from __future__ import annotations

import hashlib
from typing import Any

from ..replay import gateway, toolapproval
from .errors import WaitingApproval
from .record import Record
from .recorder import Recorder
from .registry import Tool
from .timeouts import CallTimedOut, call_with_timeout


def idempotency_key(run_id: str, step_path: str, call_id: str) -> str:
    """The gateway key of a runtime call: the same run, step and call is the same logical call."""
    key = f"rt:{run_id}:{step_path}:{call_id}"
    return key if len(key) <= 200 else "rt:" + hashlib.sha256(key.encode()).hexdigest()


def call_tool(
    *,
    recorder: Recorder,
    record: Record,
    tool: Tool,
    args: Any,
    call_id: str,
    step_path: str,
    caller: str,
    turn: int | None = None,
    replay: Any = None,
) -> tuple[str, Any]:
    """("result", value) or ("error", {name, message}).

    A call with a terminal event in the log is answered from it and nothing runs. A read call
    that was claimed but never finished is claimed again under the same owner (the run's, since
    the run lease already makes this executor the only writer), which hands back the live claim,
    and runs. A write call that an earlier execution claimed (the claim stamps it outbound) and
    never finished is in doubt, whether or not its lease still runs: that executor stopped after
    the tool may have acted. A call in doubt raises ToolCallInDoubt: it is never retried
    automatically. The tool's declared `timeout_s` is enforced (timeouts.py): a read tool that
    outlives it fails (`ToolTimeout`, which the step's retries may retry), a write tool's call
    becomes in doubt. A re-execution's `replay` policy may answer the call from its original's
    record instead (reexecute.py); then the gateway is not involved and nothing runs.
    """
    recorded = record.tool_outcome(call_id)
    if recorded is not None:
        return recorded
    if replay is not None:
        served = replay.serve_tool(
            recorder=recorder, tool=tool, args=args, call_id=call_id, step_path=step_path, caller=caller, turn=turn
        )
        if served is not None:
            return served
    if toolapproval.needs_approval(recorder.workspace, tool.name, tool.approval):
        _await_approval(
            recorder=recorder,
            record=record,
            tool=tool,
            args=args,
            call_id=call_id,
            step_path=step_path,
            caller=caller,
            turn=turn,
        )
    interrupted = tool.effect == "write" and record.tool_claimed_unfinished(call_id)
    # One commit claims the call, marks it outbound and holds what was deferred before it.
    claimed = recorder.claim_outbound(
        call_id=call_id,
        tool_name=tool.name,
        args=args,
        effect=tool.effect,
        owner=f"runtime:{recorder.run_id}",
        idempotency_key=idempotency_key(recorder.run_id, step_path, call_id),
        timeout_s=tool.timeout_s,
        caller=caller,
        turn=turn,
        step_path=step_path,
    )
    if isinstance(claimed, gateway.Finished):
        return ("result", claimed.result) if claimed.status == "succeeded" else ("error", claimed.error)
    if interrupted:
        # A resume within the dead executor's claim lease (the worker's sweep re-queues at once when
        # the process is gone) would otherwise run again a write that may have acted.
        recorder.declare_in_doubt(claimed=claimed, reason="interrupted")
        raise gateway.ToolCallInDoubt(
            f"tool call {call_id} ({tool.name}, effect write) is in doubt: the execution that made it stopped "
            "after the request left and before its outcome was recorded, so it may have acted; an operator must "
            "reconcile it before the run continues",
            callId=call_id,
            toolName=tool.name,
        )
    try:
        outcome: tuple[str, Any] = ("result", call_with_timeout(tool.fn, args, tool.timeout_s, f"tool {tool.name}"))
    except CallTimedOut as late:
        if tool.effect == "write":
            # It may have acted: in doubt, never retried automatically; the run stops until an
            # operator reconciles the call (docs/design.md §5).
            recorder.declare_in_doubt(claimed=claimed, reason="timeout", timeoutS=late.timeout_s)
            raise gateway.ToolCallInDoubt(
                f"tool call {call_id} ({tool.name}, effect write) is in doubt: it outlived its timeout of "
                f"{late.timeout_s:g} s and may have acted; an operator must reconcile it before the run "
                "continues",
                callId=call_id,
                toolName=tool.name,
            ) from None
        outcome = ("error", {"name": "ToolTimeout", "message": str(late), "timeoutS": late.timeout_s})
    except Exception as exc:  # the tool's failure is the call's recorded error, not ours
        outcome = ("error", {"name": type(exc).__name__, "message": str(exc)})
    # Committed with the next write, before anything else acts outside.
    recorder.defer_completion(claimed=claimed, outcome=outcome[0], value=outcome[1], step_path=step_path)
    return outcome


def _await_approval(
    *,
    recorder: Recorder,
    record: Record,
    tool: Tool,
    args: Any,
    call_id: str,
    step_path: str,
    caller: str,
    turn: int | None,
) -> None:
    """Return when the call is approved for these arguments; else write the request (once per
    arguments) with everything deferred, and stop the run: WaitingApproval."""
    call = record.state.tool_calls.get(call_id)
    decided = toolapproval.verdict(
        workspace=recorder.workspace,
        approval=call.approval if call else None,
        tool_name=tool.name,
        args=args,
        call_id=call_id,
        step_path=step_path,
        caller=caller,
        turn=turn,
    )
    if decided.proceed:
        return
    if decided.request is not None:
        recorder.append(decided.request)
    else:
        recorder.flush()
    raise WaitingApproval(
        run_id=recorder.run_id,
        call_id=call_id,
        tool_name=tool.name,
        args_digest=decided.args_digest,
        step_path=step_path,
    )
