"""The conversation tab: every harness session of a run read as a conversation.

Built from the fold (sessions, model calls and tool calls, with the sequences of their events)
and the log it folded (what a model was sent, for which the fold keeps only the prompt hash), so a
run written by an external harness through the API reads like one our runtime executed. Calls
recorded outside any session (a `tool.call` step, a sub-workflow) are grouped by step after the
sessions. One read of the log, whatever the run's length; the page shows a window of sessions.
A member the log moved into an artifact (a long answer's `response.textRef`, a tool's
`resultRef`) is shown as stored there, with its verified download, and not read: the page stays
cheap however long the answer (a replay reads it back: ledger.log.artifacts.as_recorded).
"""

from __future__ import annotations

import bisect
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from ledger.fold import ModelCall, RunState, ToolCallState
from ledger.log import artifacts as artifact_store
from ledger.log.verify import artifact_refs
from ledger.models import Workspace
from ledger.reads.messages import plain_message
from ledger.replay.plan import first_sequence, superseded
from ledger.replay.runlog import FoldedRun, SnapshotRun

from ..format import duration
from ..rows import artifact_url

SESSIONS_PER_PAGE = 25
Reader = FoldedRun | SnapshotRun  # the whole log folded, or a snapshot reading single events


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


# What a moved member is called on the page, by its name in the payload (moved_members).
_STORED_AS = {
    "request": "request",
    "response": "response",
    "response.text": "response text",
    "response.toolCalls": "tool calls requested",
    "response.messages": "response messages",
    "args": "arguments",
    "result": "result",
    "error": "error",
    "otel": "the span as exported (OpenTelemetry)",
}
STORED = "(stored as an artifact)"


@dataclass
class ToolView:
    call: ToolCallState
    origin: str
    args: str
    outcome: str | None  # the result or the error, pretty; None while it has none
    started_at: str | None
    artifacts: list[dict[str, str]]
    stored: list[dict[str, str | None]] = field(default_factory=list)  # members kept as artifacts

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
    stored: list[dict[str, str | None]] = field(default_factory=list)  # members kept as artifacts
    late: bool = False  # reported after the run ended (docs/otlp.md): counted in its cost all the same
    # A call that asked for several choices (OpenAI's `n`): each answer message, in order; empty
    # otherwise (the response is `response_text` and `response_tool_calls`, the first choice's).
    choices: list[Message] = field(default_factory=list)

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


def _payloads(folded: Reader, *sequences: int | None) -> list[Any]:
    return [folded.payload(s) for s in sequences if folded.event(s) is not None]


def _artifacts(workspace: Workspace, payloads: list[Any]) -> list[dict[str, str]]:
    refs = sorted({ref for payload in payloads for ref in artifact_refs(payload)})
    return [
        {"id": ref.removeprefix("artifact://"), "url": artifact_url(workspace, ref.removeprefix("artifact://"))}
        for ref in refs
    ]


def _stored(workspace: Workspace, folded: Reader, *sequences: int | None) -> dict[str, dict[str, str | None]]:
    """Per member of these events that the log moved into an artifact (`response.text`, `result`,
    …): what it is and its download (None for an imported log's ref). Reads no artifact."""
    stored: dict[str, dict[str, str | None]] = {}
    for sequence in sequences:
        env = folded.event(sequence)
        if env is None or not isinstance(env["payload"], dict):
            continue
        for name, ref in artifact_store.moved_members(env["type"], env["payload"]).items():
            artifact_id = ref.removeprefix("artifact://")
            ours = artifact_store.parse_ref(ref) is not None
            stored[name] = {
                "what": _STORED_AS.get(name, name.removeprefix("response.")),
                "id": artifact_id,
                "url": artifact_url(workspace, artifact_id) if ours else None,
            }
    return stored


def _others(links: list[dict[str, str]], stored: list[dict[str, str | None]]) -> list[dict[str, str]]:
    """The artifact links not already shown as a stored member."""
    shown = {s["id"] for s in stored}
    return [a for a in links if a["id"] not in shown]


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


def _request(folded: Reader, call: ModelCall) -> tuple[list[Message], bool]:
    payloads = _payloads(folded, call.called_sequence)
    request = payloads[0].get("request") if payloads and isinstance(payloads[0], dict) else None
    if not isinstance(request, dict):
        return [], False
    messages = request.get("messages")
    listed = [_message(m) for m in messages] if isinstance(messages, list) else []
    return listed, isinstance(request.get("messagesFrom"), int) and request["messagesFrom"] > 0


def _choices(folded: Reader, call: ModelCall, response: dict[str, Any]) -> list[Message]:
    """Every choice of a call that asked for several (`n` > 1: GenAI's `choice.count`, OpenAI's
    `n`, in the recorded request or its parameters), one answer message each, as recorded in
    `response.messages` (the call's text is the first's: docs/otlp.md "Several choices")."""
    messages = response.get("messages")
    if not isinstance(messages, list) or len(messages) < 2:
        return []
    payloads = _payloads(folded, call.called_sequence)
    request = payloads[0].get("request") if payloads and isinstance(payloads[0], dict) else None
    request = request if isinstance(request, dict) else {}
    parameters = request.get("parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    asked = [parameters.get("choice.count"), parameters.get("n"), request.get("n")]
    if not any(isinstance(n, int) and not isinstance(n, bool) and n > 1 for n in asked):
        return []
    return [_message(m) for m in messages]


def _recorded(folded: Reader, sequence: int | None, name: str) -> bool:
    """Whether the event holds `name`: a tracer that captured no content records none."""
    payloads = _payloads(folded, sequence)
    return not payloads or not isinstance(payloads[0], dict) or name in payloads[0]


def _tool_view(workspace: Workspace, folded: Reader, tool: ToolCallState) -> ToolView:
    failed = tool.status == "failed"
    has_outcome = tool.status in ("succeeded", "failed") or tool.reconciled
    args_stored = _stored(workspace, folded, tool.started_sequence).get("args")
    outcome_stored = _stored(workspace, folded, tool.ended_sequence).get("error" if failed else "result")
    if args_stored:
        args = STORED
    else:
        args = pretty(tool.args) if _recorded(folded, tool.started_sequence, "args") else "(not recorded)"
    outcome: str | None = None
    if has_outcome and outcome_stored:
        outcome = STORED
    elif has_outcome:
        recorded = failed or _recorded(folded, tool.ended_sequence, "result")
        outcome = pretty(tool.error if failed else tool.result) if recorded else "(not recorded)"
    stored = [s for s in (args_stored, outcome_stored) if s is not None]
    return ToolView(
        call=tool,
        origin=_origin(tool.origin),
        args=args,
        outcome=outcome,
        started_at=folded.occurred_at(tool.started_sequence),
        artifacts=_others(_artifacts(workspace, _payloads(folded, tool.started_sequence, tool.ended_sequence)), stored),
        stored=stored,
    )


def _turn_view(workspace: Workspace, folded: Reader, calls: list[ModelCall], index: int) -> TurnView:
    call = calls[index]
    response = call.response if isinstance(call.response, dict) else {}
    text = response.get("text")
    tool_calls = response.get("toolCalls")
    messages, incremental = _request(folded, call)
    stored = list(_stored(workspace, folded, call.called_sequence, call.responded_sequence).values())
    events = _payloads(folded, call.called_sequence, call.responded_sequence, call.failed_sequence)
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
        artifacts=_others(_artifacts(workspace, events), stored),
        stored=stored,
        late=any(isinstance(payload, dict) and payload.get("late") is True for payload in events),
        choices=_choices(folded, call, response),
    )


def _attach(
    view: SessionView, workspace: Workspace, folded: Reader, calls: list[ModelCall], tools: list[ToolCallState]
) -> SessionView:
    """Turns in order, each tool call under the turn whose call came last before it."""
    view.turns = [_turn_view(workspace, folded, calls, i) for i in range(len(calls))]
    starts = sorted((first_sequence(c), i) for i, c in enumerate(calls))
    for tool in tools:
        before = bisect.bisect_left(starts, (first_sequence(tool), -1))
        target = view.turns[max(i for _, i in starts[:before])].tools if before else view.loose_tools
        target.append(_tool_view(workspace, folded, tool))
    return view


@dataclass
class _Group:
    """A session of the run (or the calls of one step outside any session), before it is drawn."""

    first_sequence: int
    session: int | None  # index into RunState.sessions; None: calls of no session, by step
    step_path: str | None
    calls: list[ModelCall] = field(default_factory=list)
    tools: list[ToolCallState] = field(default_factory=list)


# The groups of recently read states, by the state's identity (a state read through
# ledger/log/snapshots.py is shared and never changed): a second page of a long run's conversation
# groups nothing again. The state is held with its groups, so its id cannot be reused meanwhile.
_GROUPED: OrderedDict[int, tuple[RunState, list[_Group]]] = OrderedDict()
_GROUPED_KEPT = 16
_GROUPED_LOCK = threading.Lock()


def _groups(state: RunState) -> list[_Group]:
    """Every session of the run, then the calls of no session grouped by step, in log order."""
    with _GROUPED_LOCK:
        hit = _GROUPED.get(id(state))
        if hit is not None and hit[0] is state:
            _GROUPED.move_to_end(id(state))
            return hit[1]
    sessions = [_Group(s.sequence, i, s.step_path) for i, s in enumerate(state.sessions)]
    loose: dict[str | None, _Group] = {}

    def home(session: int | None, step_path: str | None, first: int) -> _Group:
        if session is not None and 0 <= session < len(sessions):
            return sessions[session]
        group = loose.get(step_path)
        if group is None:
            group = loose[step_path] = _Group(first, None, step_path)
        return group

    items: list[ModelCall | ToolCallState] = [*state.model_calls, *state.tool_calls.values()]
    for item in items:
        first = first_sequence(item)
        group = home(item.session, item.step_path, first)
        if isinstance(item, ModelCall):
            group.calls.append(item)
        else:
            group.tools.append(item)
        if group.session is None:
            group.first_sequence = min(group.first_sequence, first)
    groups = sorted([*sessions, *loose.values()], key=lambda g: g.first_sequence)
    with _GROUPED_LOCK:
        _GROUPED[id(state)] = (state, groups)
        while len(_GROUPED) > _GROUPED_KEPT:
            _GROUPED.popitem(last=False)
    return groups


def _view(workspace: Workspace, folded: Reader, group: _Group) -> SessionView:
    if group.session is None:
        view = SessionView(
            title="Outside a harness session",
            step_path=group.step_path,
            status=None,
            attempt=None,
            manifest_hash=None,
            system_prompt_hash=None,
            first_sequence=group.first_sequence,
            error=None,
        )
    else:
        session = folded.state.sessions[group.session]
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
    return _attach(view, workspace, folded, group.calls, group.tools)


def conversation_page(
    workspace: Workspace, folded: Reader, start: int = 0, size: int = SESSIONS_PER_PAGE
) -> tuple[list[SessionView], int]:
    """The sessions `start`..`start + size` of the run (in log order) drawn, and how many it has.
    Only the events of the sessions drawn are read (in one query); the others are only counted."""
    groups = _groups(folded.state)
    window = groups[start : start + size]
    folded.prefetch(
        sequence
        for group in window
        for sequence in (
            *(s for c in group.calls for s in (c.called_sequence, c.responded_sequence, c.failed_sequence)),
            *(s for t in group.tools for s in (t.started_sequence, t.ended_sequence)),
        )
    )
    return [_view(workspace, folded, group) for group in window], len(groups)


def conversations(workspace: Workspace, folded: Reader) -> list[SessionView]:
    """Every session of the run, then the calls of no session grouped by step, in log order."""
    views, _ = conversation_page(workspace, folded, 0, len(_groups(folded.state)))
    return views
