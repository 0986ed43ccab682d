"""The run at any point: its state after event N, from the fold of events 1..N (DESIGN.md §4).

Nothing is stored for it: the prefix is read and folded when asked, by the same fold the append
transaction uses, so the view cannot disagree with what the run was. The replay plan shown is the
plan of that prefix: what a resume would have done had the run stopped there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ledger.models import Run, ToolCall
from ledger.runlog import FoldedRun, folded, replay_plan_of

OPEN_TOOL_STATUSES = ("started", "in_doubt")


@dataclass(frozen=True)
class ToolAt:
    call_id: str
    tool_name: str
    step_path: str
    status: str  # the call's status after event N, or "not started"
    open: bool


def _tools_at(run: Run, run_at: FoldedRun) -> list[ToolAt]:
    """Every tool call of the whole run as it stood then: those that came later "not started"."""
    rows = ToolCall.objects.filter(run=run).order_by("position").values_list("call_id", "tool_name", "step_path")
    tools = []
    for call_id, tool_name, step_path in rows:
        then = run_at.state.tool_calls.get(call_id)
        status = "not started" if then is None else then.status
        opened = then is not None and then.status in OPEN_TOOL_STATUSES and not then.reconciled
        tools.append(ToolAt(call_id, tool_name, step_path, status, opened))
    return tools


def state_after(run: Run, at: int) -> dict[str, Any]:
    """What the state tab shows of the run after event `at` (1 ≤ at ≤ last sequence)."""
    run_at = folded(run, upto=at)
    state = run_at.state
    event = run_at.log[-1]
    payload = event["payload"] if isinstance(event["payload"], dict) else {}
    plan = replay_plan_of(run, run_at)
    return {
        "at": at,
        "event": event,
        "event_step": payload.get("stepPath") if isinstance(payload.get("stepPath"), str) else "",
        "state": state,
        "steps": list(state.steps.values()),
        "tools": _tools_at(run, run_at),
        "open_model_calls": [c for c in state.model_calls if c.status == "called"],
        "plan": plan,
    }
