"""The run at any point: its state after event N, the fold of events 1..N (docs/design.md §4).

Folded from the nearest fold snapshot at or below N (ledger/log/snapshots.py: the fold of a
prefix, by the same fold the append transaction uses, so the view cannot disagree with what the run
was), then forward to N: at most `snapshots.EVERY` events, whatever the run's length. The replay
plan shown is the plan of that prefix: what a resume would have done had the run stopped there.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.utils.safestring import SafeString, mark_safe

from ledger.fold import RunState
from ledger.fold.state import StepState
from ledger.models import Run
from ledger.replay.runlog import SnapshotRun, snapshot, tool_call_starts
from ledger.replay.stored_plan import replay_plan_at

from ..templatetags.console_format import escaped, kept_value, money, shown_name

OPEN_TOOL_STATUSES = ("started", "in_doubt")
SHOWN = 200  # steps, tool calls and plan sessions listed: the ones nearest event N


@dataclass(frozen=True)
class ToolAt:
    call_id: str
    tool_name: str
    step_path: str
    status: str  # the call's status after event N, or "not started"
    open: bool
    sequence: int  # of its last event up to N, or of its start (after N) when not started


def _tools_at(run: Run, run_at: SnapshotRun) -> list[ToolAt]:
    """Every tool call of the whole run as it stood then: those that came later "not started"."""
    tools = []
    for call_id, tool_name, step_path, started in tool_call_starts(run):
        then = run_at.state.tool_calls.get(call_id)
        if then is None:
            tools.append(ToolAt(call_id, tool_name, step_path, "not started", False, started or 0))
            continue
        opened = then.status in OPEN_TOOL_STATUSES and not then.reconciled
        last = then.ended_sequence or then.started_sequence or 0
        tools.append(ToolAt(call_id, tool_name, step_path, then.status, opened, last))
    return tools


T = TypeVar("T")


def _nearest(items: list[T], position: Callable[[T], int], at: int) -> tuple[list[T], int]:
    """At most SHOWN of the items, those whose position is nearest event N, in their order;
    and how many were left out."""
    if len(items) <= SHOWN:
        return items, 0
    kept = set(sorted(range(len(items)), key=lambda i: abs(at - position(items[i])))[:SHOWN])
    return [item for i, item in enumerate(items) if i in kept], len(items) - SHOWN


# The steps listed of recently read states, by the state's identity (the state held, so its id is
# not reused): a state read through the snapshots is shared and never changed, and choosing the
# SHOWN steps nearest N sorts all of the state's steps (10,000 at event 50,000 of the bench's run).
_STEPS_NEAR: OrderedDict[int, tuple[RunState, int, tuple[list[Any], int]]] = OrderedDict()
_STEPS_NEAR_LOCK = threading.Lock()


def _steps_near(state: RunState, at: int) -> tuple[list[Any], int]:
    with _STEPS_NEAR_LOCK:
        hit = _STEPS_NEAR.get(id(state))
        if hit is not None and hit[0] is state and hit[1] == at:
            _STEPS_NEAR.move_to_end(id(state))
            return hit[2]
    chosen = _nearest(list(state.steps.values()), lambda s: s.last_sequence, at)
    with _STEPS_NEAR_LOCK:
        _STEPS_NEAR[id(state)] = (state, at, chosen)
        while len(_STEPS_NEAR) > 16:
            _STEPS_NEAR.popitem(last=False)
    return chosen


def state_after(run: Run, at: int) -> dict[str, Any]:
    """What the state tab shows of the run after event `at` (1 ≤ at ≤ last sequence)."""
    run_at = snapshot(run, upto=at)
    state = run_at.state
    event = run_at.event(at)
    assert event is not None  # 1 <= at <= the last sequence
    payload = event["payload"] if isinstance(event["payload"], dict) else {}
    plan = replay_plan_at(run, state)
    steps, steps_left_out = _steps_near(state, at)
    tools, tools_left_out = _nearest(_tools_at(run, run_at), lambda t: t.sequence, at)
    return {
        "at": at,
        "event": event,
        "steps_rows": render_steps(steps),
        "event_step": payload.get("stepPath") if isinstance(payload.get("stepPath"), str) else "",
        "state": state,
        "steps": steps,
        "steps_left_out": steps_left_out,
        "tools": tools,
        "tools_left_out": tools_left_out,
        "open_model_calls": [
            state.model_calls[i] for i in sorted(state.pending_model_calls) if state.model_calls[i].status == "called"
        ],
        "plan": plan,
    }


def render_steps(steps: list[StepState]) -> SafeString:
    """The state tab's steps (up to SHOWN), a row each, as its template wrote them (Django's
    engine took ~0.2 ms a row: a lookup, a filter and escaping per value)."""
    rows = []
    for s in steps:
        path, status = escaped(kept_value(s.step_path)), escaped(s.status)
        rows.append(
            f'<tr data-step="{path}"><td class="mono">{escaped(shown_name(s.step_path))}</td>\n'
            f'      <td><span class="status status-{status}">{status}</span></td>'
            f'<td class="num">{len(s.attempts)}</td>\n'
            f"      <td>{escaped(money(s.usage.cost_usd))}</td></tr>"
        )
    return mark_safe("".join(rows))  # every value in it is escaped above
