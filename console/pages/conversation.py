"""The conversation tab: every harness session of a run read as a conversation.

Built from the fold (sessions, model calls and tool calls, with the sequences of their events)
and the log it folded (what a model was sent, for which the fold keeps only the prompt hash), so a
run written by an external harness through the API reads like one our runtime executed. Calls
recorded outside any session (a `tool.call` step, a sub-workflow) are grouped by step after the
sessions. One read of the log, whatever the run's length; the page shows a window of sessions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from ledger.fold import ModelCall, RunState, ToolCallState
from ledger.log.verify import artifact_refs
from ledger.models import Workspace
from ledger.reads.messages import plain_message
from ledger.replay.plan import first_sequence, superseded
from ledger.replay.runlog import FoldedRun

from ..format import duration
from ..rows import artifact_url

SESSIONS_PER_PAGE = 25


def pretty(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False)


def requested(tool_calls: Any) -> str | None:
    """A model's tool-call requests, one a line: `lookup_order({"orderId": "B-2"})  #c1`."""
    if not tool_calls:
        return None
    if not isinstance(tool_calls, list) or not all(isinstance(c, dict) for c in tool_calls):
        return pretty(tool_calls)
    lines = []
    for call in tool_calls:
        args = call.get("args", call.get("arguments", call.get("input")))
        line = f"{call.get('name', call.get('toolName', '?'))}({json.dumps(args, ensure_ascii=False)})"
        lines.append(f"{line}  #{call['id']}" if "id" in call else line)
    return "\n".join(lines)


@dataclass
class ToolView:
    call: ToolCallState
    origin: str
    args: str
    outcome: str | None  # the result or the error, pretty; None while it has none
    started_at: str | None
    artifacts: list[dict[str, str]]

    @property
    def anchor(self) -> str:
        return f"call-{self.call.call_id}"


@dataclass
class Message:
    role: str
    text: str  # the content as text (or JSON when it is not a string)
    tool_calls: str | None = None  # an assistant message's tool calls, pretty
    result: str | None = None  # a tool message's result, pretty


@dataclass
class TurnView:
    call: ModelCall
    origin: str
    retried: bool  # a failed call the harness made again: the retry is the turn that counts
    messages: list[Message]
    incremental: bool  # the request carries only the messages since the last turn
    response_text: str | None
    response_tool_calls: str | None
    called_at: str | None
    answered_at: str | None
    error: str | None  # a failed call's error, pretty
    artifacts: list[dict[str, str]]
    tools: list[ToolView] = field(default_factory=list)

    @property
    def waited(self) -> str | None:
        """How long the answer took, when it was recorded apart from the call."""
        if self.called_at is None or self.answered_at is None or self.called_at == self.answered_at:
            return None
        took = datetime.fromisoformat(self.answered_at) - datetime.fromisoformat(self.called_at)
        return duration(max(took.total_seconds(), 0.0))

    @property
    def anchor(self) -> str:
        return f"turn-{first_sequence(self.call)}"


@dataclass
class SessionView:
    title: str  # the role, or "Outside a harness session"
    step_path: str | None
    status: str | None
    attempt: int | None
    manifest_hash: str | None
    system_prompt_hash: str | None
    first_sequence: int
    error: str | None
    turns: list[TurnView] = field(default_factory=list)
    loose_tools: list[ToolView] = field(default_factory=list)  # tool calls before any turn

    @property
    def cost(self) -> Decimal | None:
        costs = [t.call.cost for t in self.turns if t.call.cost is not None]
        return sum(costs, Decimal(0)) if costs else None


def _origin(origin: str | None) -> str:
    """As on the timeline's badges: an original run's calls happened live."""
    return origin or "live"


def _payloads(folded: FoldedRun, *sequences: int | None) -> list[Any]:
    return [folded.log[s - 1]["payload"] for s in sequences if s is not None and 0 < s <= len(folded.log)]


def _artifacts(workspace: Workspace, payloads: list[Any]) -> list[dict[str, str]]:
    refs = sorted({ref for payload in payloads for ref in artifact_refs(payload)})
    return [
        {"id": ref.removeprefix("artifact://"), "url": artifact_url(workspace, ref.removeprefix("artifact://"))}
        for ref in refs
    ]


def _message(raw: Any) -> Message:
    if not isinstance(raw, dict):
        return Message(role="?", text=pretty(raw))
    raw = plain_message(raw)  # GenAI `parts`, OpenInference, the OpenAI SDK's tool calls
    content = raw.get("content")
    text = "" if content is None else pretty(content)
    tool_calls = raw.get("toolCalls") or raw.get("tool_calls")
    result = raw.get("result", raw.get("output"))
    return Message(
        role=str(raw.get("role", "?")),
        text=text,
        tool_calls=requested(tool_calls),
        result=pretty(result) if "result" in raw or "output" in raw else None,
    )


def _request(folded: FoldedRun, call: ModelCall) -> tuple[list[Message], bool]:
    payloads = _payloads(folded, call.called_sequence)
    request = payloads[0].get("request") if payloads and isinstance(payloads[0], dict) else None
    if not isinstance(request, dict):
        return [], False
    messages = request.get("messages")
    listed = [_message(m) for m in messages] if isinstance(messages, list) else []
    return listed, isinstance(request.get("messagesFrom"), int) and request["messagesFrom"] > 0


def _recorded(folded: FoldedRun, sequence: int | None, name: str) -> bool:
    """Whether the event holds `name`: a tracer that captured no content records none."""
    payloads = _payloads(folded, sequence)
    return not payloads or not isinstance(payloads[0], dict) or name in payloads[0]


def _tool_view(workspace: Workspace, folded: FoldedRun, tool: ToolCallState) -> ToolView:
    outcome = tool.error if tool.status == "failed" else tool.result
    has_outcome = tool.status in ("succeeded", "failed") or tool.reconciled
    return ToolView(
        call=tool,
        origin=_origin(tool.origin),
        args=pretty(tool.args) if _recorded(folded, tool.started_sequence, "args") else "(not recorded)",
        outcome=(
            pretty(outcome)
            if has_outcome and (tool.status != "succeeded" or _recorded(folded, tool.ended_sequence, "result"))
            else "(not recorded)"
            if has_outcome
            else None
        ),
        started_at=folded.occurred_at(tool.started_sequence),
        artifacts=_artifacts(workspace, _payloads(folded, tool.started_sequence, tool.ended_sequence)),
    )


def _turn_view(workspace: Workspace, folded: FoldedRun, calls: list[ModelCall], index: int) -> TurnView:
    call = calls[index]
    response = call.response if isinstance(call.response, dict) else {}
    text = response.get("text")
    tool_calls = response.get("toolCalls")
    messages, incremental = _request(folded, call)
    return TurnView(
        call=call,
        origin=_origin(call.origin),
        retried=superseded(calls, index),
        messages=messages,
        incremental=incremental,
        response_text=text if isinstance(text, str) and text else None,
        response_tool_calls=requested(tool_calls),
        called_at=folded.occurred_at(call.called_sequence),
        answered_at=folded.occurred_at(call.responded_sequence or call.failed_sequence),
        error=pretty(call.error) if call.status == "failed" else None,
        artifacts=_artifacts(
            workspace, _payloads(folded, call.called_sequence, call.responded_sequence, call.failed_sequence)
        ),
    )


def _attach(
    view: SessionView, workspace: Workspace, folded: FoldedRun, calls: list[ModelCall], tools: list[ToolCallState]
) -> SessionView:
    """Turns in order, each tool call under the turn whose call came last before it."""
    view.turns = [_turn_view(workspace, folded, calls, i) for i in range(len(calls))]
    starts = [first_sequence(c) for c in calls]
    for tool in tools:
        before = [i for i, start in enumerate(starts) if start < first_sequence(tool)]
        target = view.turns[before[-1]].tools if before else view.loose_tools
        target.append(_tool_view(workspace, folded, tool))
    return view


def conversations(workspace: Workspace, folded: FoldedRun) -> list[SessionView]:
    """Every session of the run, then the calls of no session grouped by step, in log order."""
    state: RunState = folded.state
    calls_of: dict[int | None, list[ModelCall]] = {}
    for call in state.model_calls:
        calls_of.setdefault(call.session, []).append(call)
    tools_of: dict[int | None, list[ToolCallState]] = {}
    for tool in state.tool_calls.values():
        tools_of.setdefault(tool.session, []).append(tool)

    views: list[SessionView] = []
    for index, session in enumerate(state.sessions):
        manifest = session.manifest if isinstance(session.manifest, dict) else {}
        prompt_hash = manifest.get("systemPromptHash")
        view = SessionView(
            title=session.role or "harness session",
            step_path=session.step_path,
            status=session.status,
            attempt=session.attempt,
            manifest_hash=session.manifest_hash,
            system_prompt_hash=prompt_hash if isinstance(prompt_hash, str) else None,
            first_sequence=session.sequence,
            error=None if session.error is None else pretty(session.error),
        )
        views.append(_attach(view, workspace, folded, calls_of.get(index, []), tools_of.get(index, [])))

    loose_calls, loose_tools = calls_of.get(None, []), tools_of.get(None, [])
    steps = list(dict.fromkeys([c.step_path for c in loose_calls] + [t.step_path for t in loose_tools]))
    for step_path in steps:
        own_calls = [c for c in loose_calls if c.step_path == step_path]
        own_tools = [t for t in loose_tools if t.step_path == step_path]
        first = min([*(first_sequence(c) for c in own_calls), *(first_sequence(t) for t in own_tools)])
        view = SessionView(
            title="Outside a harness session",
            step_path=step_path,
            status=None,
            attempt=None,
            manifest_hash=None,
            system_prompt_hash=None,
            first_sequence=first,
            error=None,
        )
        views.append(_attach(view, workspace, folded, own_calls, own_tools))
    views.sort(key=lambda v: v.first_sequence)
    return views
