"""The waterfall tab: a run's steps, harness sessions, model and tool calls and sub-runs as timed
bars on one time axis, nested by step path, with the critical path marked.

Times are when the events' facts happened (their `occurredAt`, a span's times for OTLP, else their
recordedAt), read from the fold of the log (a step from its first attempt to
its end, a call from its first to its last event) and, for sub-runs, from their Run rows. Rendered
as HTML/CSS bars (positions in percent of the axis): no build step, no script needed to read it.
A sub-run's own bars load in place when asked (`waterfall/rows/`, htmx), on the parent's axis.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote, urlencode

from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import slugify

from ledger.fold import HarnessSession, ModelCall, RunState, ToolCallState
from ledger.models import Run
from ledger.replay.plan import first_sequence
from ledger.replay.runlog import FoldedRun, SnapshotRun

from ..format import duration
from ..templatetags.console_format import count, escaped, money, shown_attr, shown_name, words

# What a URL's #fragment keeps as it is (RFC 3986 pchar, / and ?); the rest of a call id, percent-encoded.
FRAGMENT_SAFE = "!$&'()*+,;=:@/?~"

_LAST_SEGMENT = re.compile(r"(\[[^\]]*\]|\.[^.\[]*)\Z")
MAX_ROWS = 1000  # bars drawn of a page, in display order; a longer page says how many it left out
ROOTS_PER_PAGE = 50  # top-level bars (with all they hold) on a page of the waterfall
MIN_WIDTH = 0.4  # percent: an instant still shows as a sliver one can click
OPEN_STATUSES = ("running", "started", "called", "scheduled", "pending")
Reader = FoldedRun | SnapshotRun  # the whole log folded, or a snapshot reading single events


def parse_time(value: str | datetime | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


@dataclass
class Bar:
    kind: str  # step | session | model | tool | subrun
    label: str
    status: str
    start: datetime
    end: datetime | None  # None: still open
    href: str
    first_sequence: int = 0
    detail: str = ""  # what else the label says (a model, a tool's caller)
    subrun: Run | None = None
    children: list[Bar] = field(default_factory=list)
    critical: bool = False
    depth: int = 0
    left: float = 0.0
    width: float = 0.0
    cost: Decimal | None = None  # what the step or model call cost, None: unpriced or not a call
    tokens_in: int | None = None
    tokens_out: int | None = None
    usage_reported: bool = True  # False: a model call whose usage gave no token count (cost n/a)
    detail_url: str = ""  # the bar's detail panel (a step, model or tool call), loaded in place
    detail_id: str = ""

    @property
    def has_usage(self) -> bool:
        return self.tokens_in is not None or self.cost is not None or not self.usage_reported

    @property
    def open(self) -> bool:
        return self.end is None

    @property
    def took(self) -> str:
        if self.end is None:
            return "still open"
        return duration(max((self.end - self.start).total_seconds(), 0.0))

    @property
    def pattern(self) -> str:
        """What the bar's fill says beside its colour (never colour alone)."""
        if self.status in ("failed", "in_doubt"):
            return "hatched"
        return "striped" if self.open else "solid"


@dataclass
class Axis:
    start: datetime
    end: datetime

    @property
    def seconds(self) -> float:
        return max((self.end - self.start).total_seconds(), 0.001)

    def place(self, bar: Bar) -> None:
        end = bar.end or self.end
        bar.left = min(max((bar.start - self.start).total_seconds() / self.seconds * 100, 0.0), 100.0)
        bar.width = max(min((end - bar.start).total_seconds() / self.seconds * 100, 100.0 - bar.left), MIN_WIDTH)

    def ticks(self, count: int = 5) -> list[dict[str, Any]]:
        return [{"left": 100 * i / count, "label": f"+{duration(self.seconds * i / count)}"} for i in range(count + 1)]


def _urls(run: Run) -> dict[str, str]:
    ws = run.workspace
    args = [ws.tenant.slug, ws.slug, run.run_id]
    return {
        "conversation": reverse("run-tab", args=[*args, "conversation"]),
        "timeline": reverse("run-tab", args=[*args, "timeline"]),
        "detail": reverse("run-waterfall-detail", args=args),
        "run": run.run_id,
    }


def _with_detail(bar: Bar, urls: dict[str, str], kind: str, key: str) -> Bar:
    bar.detail_url = f"{urls['detail']}?{urlencode({'kind': kind, 'id': key})}"
    bar.detail_id = f"wf-detail-{urls['run']}-{kind}-{bar.first_sequence}"
    return bar


def _event_url(urls: dict[str, str], sequence: int) -> str:
    return f"{urls['timeline']}?after={max(sequence - 1, 0)}#event-{sequence}"


def _parent_step(path: str, steps: Mapping[str, Any]) -> str | None:
    """The nearest step whose path this one extends (`fan` of `fan[0]`), if there is one."""
    current = path
    while True:
        shorter = _LAST_SEGMENT.sub("", current)
        if shorter == current or not shorter:
            return None
        if shorter in steps:
            return shorter
        current = shorter


def _call_bar(folded: Reader, urls: dict[str, str], call: ModelCall) -> Bar | None:
    first = first_sequence(call)
    start = parse_time(folded.occurred_at(first))
    if start is None:
        return None
    last = call.responded_sequence or call.failed_sequence
    model = f"{call.provider}/{call.model_id}" if call.model_id else "model"
    bar = Bar(
        "model",
        f"turn {call.turn if call.turn is not None else '?'}",
        call.status,
        start,
        parse_time(folded.occurred_at(last)) if last else None,
        f"{urls['conversation']}#turn-{first}",
        first,
        detail=model,
        cost=call.cost,
    )
    if call.usage is not None and not call.usage_reported:
        bar.usage_reported = False  # its zero tokens are no count
    elif call.usage is not None:
        bar.tokens_in, bar.tokens_out = int(call.usage.input_tokens), int(call.usage.output_tokens)
    return _with_detail(bar, urls, "model", str(first))


def _tool_bar(folded: Reader, urls: dict[str, str], tool: ToolCallState, subruns: dict[str, Run]) -> Bar | None:
    first = first_sequence(tool)
    start = parse_time(folded.occurred_at(first))
    if start is None:
        return None
    end = parse_time(folded.occurred_at(tool.ended_sequence)) if tool.ended_sequence else None
    bar = Bar(
        "tool",
        tool.tool_name or tool.call_id,
        tool.status,
        start,
        end,
        # Percent-encoded: a call id is what a harness wrote (a browser decodes a fragment to find
        # the tool call's id, console_format.kept_value on the Conversation tab).
        f"{urls['conversation']}#call-{quote(tool.call_id, safe=FRAGMENT_SAFE)}",
        first,
        detail=tool.caller or "",
    )
    sub_id = tool.args.get("subRunId") if isinstance(tool.args, dict) else None
    child = subruns.get(sub_id) if isinstance(sub_id, str) else None
    if child is not None:
        _as_subrun(bar, child)
        return bar
    return _with_detail(bar, urls, "tool", tool.call_id)


def _as_subrun(bar: Bar, child: Run) -> None:
    ws = child.workspace
    bar.kind, bar.subrun, bar.label = "subrun", child, child.run_id
    bar.status = child.status
    bar.start = child.started_at or bar.start
    bar.end = child.finished_at if child.finished else None
    bar.href = reverse("run", args=[ws.tenant.slug, ws.slug, child.run_id])


Item = ModelCall | ToolCallState | HarnessSession  # what a node draws besides a step


@dataclass
class Layout:
    """Where every step, session and call of a state goes, before anything is timed: the steps'
    tree (from their paths), and what each step, session or the top level holds. Built once per
    state (a state read through ledger/log/snapshots.py is shared and never changed), so a page of
    a long run's waterfall times and draws only the bars it shows."""

    step_children: dict[str | None, list[str]]  # None: the top level
    held: dict[tuple[str, Any], list[tuple[int, Item]]]  # ("step", path) | ("session", i) | ("top", None)
    order: list[int] | None = None  # indexes of roots() in time order, once known

    def roots(self) -> list[tuple[str, Any]]:
        """The top level: steps of no parent step, then what no step holds (in log order)."""
        return [("step", p) for p in self.step_children.get(None, [])] + [
            ("item", i) for i in range(len(self.held.get(("top", None), [])))
        ]


def _layout(state: RunState) -> Layout:
    with _LAID_OUT_LOCK:
        hit = _LAID_OUT.get(id(state))
        if hit is not None and hit[0] is state:
            _LAID_OUT.move_to_end(id(state))
            return hit[1]
    step_children: dict[str | None, list[str]] = {}
    for path in state.steps:
        step_children.setdefault(_parent_step(path, state.steps), []).append(path)
    held: dict[tuple[str, Any], list[tuple[int, Item]]] = {}

    def home(session: int | None, step_path: str | None) -> tuple[str, Any]:
        if session is not None and 0 <= session < len(state.sessions):
            return ("session", session)
        return ("step", step_path) if step_path in state.steps else ("top", None)

    for index, session in enumerate(state.sessions):
        held.setdefault(home(None, session.step_path), []).append((index, session))
    for call in state.model_calls:
        held.setdefault(home(call.session, call.step_path), []).append((-1, call))
    for tool in state.tool_calls.values():
        held.setdefault(home(tool.session, tool.step_path), []).append((-1, tool))
    layout = Layout(step_children, held)
    with _LAID_OUT_LOCK:
        _LAID_OUT[id(state)] = (state, layout)
        while len(_LAID_OUT) > 16:
            _LAID_OUT.popitem(last=False)
    return layout


_LAID_OUT: OrderedDict[int, tuple[RunState, Layout]] = OrderedDict()
_LAID_OUT_LOCK = threading.Lock()


def _sequences(item: Item) -> tuple[int | None, ...]:
    if isinstance(item, HarnessSession):
        return (item.sequence, item.ended_sequence)
    if isinstance(item, ModelCall):
        return (item.called_sequence, item.responded_sequence, item.failed_sequence)
    return (item.started_sequence, item.ended_sequence)


def _needed(state: RunState, layout: Layout, node: tuple[str, Any]) -> list[int | None]:
    """The events whose times the node's bars (its own and its descendants') need."""
    kind, key = node
    if kind == "item":
        _, item = layout.held[("top", None)][key]
        found = list(_sequences(item))
        if isinstance(item, HarnessSession):
            found += [s for _, held in layout.held.get(("session", key), []) for s in _sequences(held)]
        return found
    step = state.steps[key]
    found = [None if step.started_at else step.first_sequence]
    for index, item in layout.held.get(("step", key), []):
        found += _sequences(item)
        if isinstance(item, HarnessSession):
            found += [s for _, held in layout.held.get(("session", index), []) for s in _sequences(held)]
    for child in layout.step_children.get(key, []):
        found += _needed(state, layout, ("step", child))
    return found


def _item_bar(
    folded: Reader, urls: dict[str, str], layout: Layout, subruns: dict[str, Run], index: int, item: Item
) -> Bar | None:
    if isinstance(item, ModelCall):
        return _call_bar(folded, urls, item)
    if isinstance(item, ToolCallState):
        return _tool_bar(folded, urls, item, subruns)
    start = parse_time(folded.occurred_at(item.sequence))
    if start is None:
        return None
    end = parse_time(folded.occurred_at(item.ended_sequence)) if item.ended_sequence else None
    bar = Bar(
        "session",
        item.role or "session",
        item.status,
        start,
        end,
        f"{urls['conversation']}#session-{item.sequence}",
        item.sequence,
    )
    bar.children = _drawn(folded, urls, layout, subruns, layout.held.get(("session", index), []))
    return bar


def _drawn(
    folded: Reader, urls: dict[str, str], layout: Layout, subruns: dict[str, Run], items: list[tuple[int, Item]]
) -> list[Bar]:
    bars = [_item_bar(folded, urls, layout, subruns, index, item) for index, item in items]
    return [b for b in bars if b is not None]


def _step_bar(folded: Reader, urls: dict[str, str], layout: Layout, subruns: dict[str, Run], path: str) -> Bar | None:
    step = folded.state.steps[path]
    start = parse_time(step.started_at) or parse_time(folded.occurred_at(step.first_sequence))
    if start is None:
        return None
    end = parse_time(step.finished_at) if step.status in ("completed", "failed") else None
    bar = Bar("step", path, step.status, start, end, _event_url(urls, step.first_sequence), step.first_sequence)
    if step.usage.calls:
        bar.cost = step.usage.cost_usd
        bar.tokens_in, bar.tokens_out = int(step.usage.input_tokens), int(step.usage.output_tokens)
    _with_detail(bar, urls, "step", path)
    children = [_step_bar(folded, urls, layout, subruns, child) for child in layout.step_children.get(path, [])]
    bar.children = [b for b in children if b is not None] + _drawn(
        folded, urls, layout, subruns, layout.held.get(("step", path), [])
    )
    return bar


def _root_times(folded: Reader, layout: Layout, roots: list[tuple[str, Any]]) -> list[tuple[datetime, int]]:
    """When each top-level node starts (and its first sequence), for their order: a step's from the
    state, what no step holds from its first event (read for all of them, in one query)."""
    state = folded.state
    top = layout.held.get(("top", None), [])
    folded.prefetch(
        [state.steps[k].first_sequence for kind, k in roots if kind == "step" and not state.steps[k].started_at]
        + [_first(top[k][1]) for kind, k in roots if kind == "item"]
    )
    times = []
    for kind, key in roots:
        if kind == "step":
            step = state.steps[key]
            moment = parse_time(step.started_at) or parse_time(folded.occurred_at(step.first_sequence))
            times.append((moment or _NEVER, step.first_sequence))
        else:
            first = _first(top[key][1])
            times.append((parse_time(folded.occurred_at(first)) or _NEVER, first))
    return times


def _first(item: Item) -> int:
    return item.sequence if isinstance(item, HarnessSession) else first_sequence(item)


_NEVER = datetime.max.replace(tzinfo=UTC)


def bars_of(
    run: Run, folded: Reader, children: list[Run], start: int = 0, size: int | None = None
) -> tuple[list[Bar], int]:
    """The run's top-level bars `start`..`start + size` (all by default) as a forest, and how many
    top-level bars the run has: steps (nested by path) holding their sessions, a session its calls;
    a sub-workflow's call is its sub-run's bar. Siblings in time order. Only the events of the bars
    drawn are read (one query), besides the first event of each top-level bar no step holds."""
    state: RunState = folded.state
    urls = _urls(run)
    subruns = {c.run_id: c for c in children}
    layout = _layout(state)
    roots = layout.roots()
    if layout.order is None:  # the state and the events' times never change: ordered once per state
        layout.order = sorted(range(len(roots)), key=_root_times(folded, layout, roots).__getitem__)
    order = layout.order
    window = [roots[i] for i in order[start : None if size is None else start + size]]
    folded.prefetch(s for node in window for s in _needed(state, layout, node))
    top = layout.held.get(("top", None), [])
    bars: list[Bar] = []
    for kind, key in window:
        bar = (
            _step_bar(folded, urls, layout, subruns, key)
            if kind == "step"
            else _item_bar(folded, urls, layout, subruns, *top[key])
        )
        if bar is not None:
            bars.append(bar)
    shown = {b.subrun.run_id for b in _all(bars) if b.subrun is not None}
    linked = {
        tool.args.get("subRunId") for tool in state.tool_calls.values() if isinstance(tool.args, dict)
    }  # drawn as their call's bar, on whichever page that is
    extra = [c for c in children if c.run_id not in shown and c.run_id not in linked and c.started_at is not None]
    if start + len(window) >= len(roots):  # sub-runs an external harness linked by parentRunId alone: last page
        for child in extra:
            bar = Bar("subrun", child.run_id, child.status, child.started_at or _NEVER, None, "")
            _as_subrun(bar, child)
            bars.append(bar)
    _order(bars)
    return bars, len(roots) + len(extra)


def _order(bars: list[Bar]) -> None:
    bars.sort(key=lambda b: (b.start, b.first_sequence))
    for bar in bars:
        _order(bar.children)


def mark_critical(bars: list[Bar], end: datetime) -> None:
    """The chain that decides when the run ended: from the sibling that ends last, back through
    the sibling that ended last before it began, and so on; then the same inside each of them."""
    limit: datetime | None = end
    remaining = list(bars)
    while remaining and limit is not None:
        candidates = [b for b in remaining if (b.end or end) <= limit + timedelta(milliseconds=1)]
        if not candidates:
            break
        last = max(candidates, key=lambda b: (b.end or end, b.start))
        last.critical = True
        mark_critical(last.children, last.end or end)
        remaining = [b for b in remaining if b is not last and b.start < last.start]
        limit = last.start


def flatten(bars: list[Bar], axis: Axis, depth: int = 0) -> list[Bar]:
    """Rows in display order, each placed on the axis and given its depth."""
    rows = []
    for bar in bars:
        bar.depth = depth
        axis.place(bar)
        rows.append(bar)
        rows.extend(flatten(bar.children, axis, depth + 1))
    return rows


def axis_of(folded: Reader, bars: list[Bar]) -> Axis | None:
    """From the run's first event (or earliest bar) to the latest of its last event, its steps'
    ends and the bars drawn."""
    folded.prefetch([1, folded.last_sequence])
    starts = [b.start for b in bars]
    first = parse_time(folded.occurred_at(1))
    if first is not None:
        starts.append(first)
    if not starts:
        return None
    ends = [
        t
        for t in [
            parse_time(folded.occurred_at(folded.last_sequence)),
            parse_time(folded.state.finished_at),
            *(b.end for b in _all(bars)),
        ]
        if t
    ]
    return Axis(min(starts), max([*ends, min(starts)]))


def _all(bars: list[Bar]) -> list[Bar]:
    return [x for b in bars for x in (b, *_all(b.children))]


def waterfall(
    run: Run, folded: Reader, children: list[Run], axis: Axis | None = None, start: int = 0, size: int = ROOTS_PER_PAGE
) -> dict[str, Any]:
    """The rows and axis of a page of a run's waterfall (top-level bars `start`.. with what they
    hold); `axis` given: a sub-run drawn on its parent's."""
    bars, total = bars_of(run, folded, children, start, size)
    axis = axis or axis_of(folded, bars)
    if axis is None:
        return {"rows": [], "axis": None, "ticks": [], "total": total, "shown": 0}
    mark_critical(bars, axis.end)
    rows = flatten(bars, axis)
    return {
        "rows": rows[:MAX_ROWS],
        "left_out": max(len(rows) - MAX_ROWS, 0),
        "axis": axis,
        "ticks": axis.ticks(),
        "total": total,
        "shown": len(bars),
    }


# --- a bar's detail panel, and the steps tab's one-line readings ------------------------------------

SUMMARY_CHARS = 80  # a one-line summary longer than this ends in "…"; the whole value is a click away
DETAIL_KINDS = ("step", "model", "tool")


def as_text(value: Any) -> str:
    """A payload as the console shows it whole: a string as is, anything else as indented JSON."""
    return value if isinstance(value, str) else json.dumps(value, indent=2, ensure_ascii=False, default=str)


def one_line(value: Any) -> str:
    """A payload on one readable line: compact JSON (or the string), whitespace collapsed, cut at
    SUMMARY_CHARS with "…"."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


def error_line(error: Any) -> str:
    """An error as "name: message" (either alone when only one was recorded); "" for none."""
    if error is None or error == "":
        return ""
    if isinstance(error, dict):
        name = error.get("name") or error.get("type") or error.get("code")
        message = error.get("message")
        if name or message:
            return ": ".join(str(part) for part in (name, message) if part)
    return one_line(error)


def bar_detail(folded: Reader, kind: str, key: str) -> dict[str, Any] | None:
    """What a step's or call's detail panel shows: its payloads (input or arguments, output or
    result, or its error), model, tokens, cost and duration; None when the run has no such thing."""
    state: RunState = folded.state
    if kind == "step":
        step = state.steps.get(key)
        if step is None:
            return None
        start = parse_time(step.started_at) or parse_time(folded.occurred_at(step.first_sequence))
        end = parse_time(step.finished_at) if step.status in ("completed", "failed") else None
        first = folded.payload(step.first_sequence)
        payload = first.get("input") if isinstance(first, dict) else None
        usage = step.usage
        return {
            "kind": "step",
            "name": key,
            "status": step.status,
            "input": None if payload is None else as_text(payload),
            "output": as_text(step.output) if step.has_output else None,
            "output_ref": step.output_ref,
            "error": error_line(step.error),
            "error_text": None if step.error is None else as_text(step.error),
            "tokens": (int(usage.input_tokens), int(usage.output_tokens)) if usage.calls else None,
            "cost": usage.cost_usd if usage.calls else None,
            "model": "",
            "took": _took(start, end),
        }
    if kind == "model":
        try:
            sequence = int(key)
        except ValueError:
            return None
        call = next((c for c in state.model_calls if first_sequence(c) == sequence), None)
        if call is None:
            return None
        last = call.responded_sequence or call.failed_sequence
        folded.prefetch([sequence, last])
        called = folded.payload(call.called_sequence)
        request = called.get("request") if isinstance(called, dict) else None
        return {
            "kind": "model",
            "name": f"turn {call.turn if call.turn is not None else '?'}",
            "status": call.status,
            "input": None if request is None else as_text(request),
            "output": None if call.response is None else as_text(call.response),
            "output_ref": None,
            "error": error_line(call.error),
            "error_text": None if call.error is None else as_text(call.error),
            "tokens": (
                (int(call.usage.input_tokens), int(call.usage.output_tokens))
                if call.usage and call.usage_reported
                else None
            ),
            "usage_not_reported": call.usage is not None and not call.usage_reported,
            "cost": call.cost,
            "model": f"{call.provider}/{call.model_id}" if call.model_id else "",
            "took": _took(
                parse_time(folded.occurred_at(sequence)), parse_time(folded.occurred_at(last)) if last else None
            ),
        }
    if kind == "tool":
        tool = state.tool_calls.get(key)
        if tool is None:
            return None
        first = first_sequence(tool)
        folded.prefetch([first, tool.ended_sequence])
        end = parse_time(folded.occurred_at(tool.ended_sequence)) if tool.ended_sequence else None
        return {
            "kind": "tool",
            "name": tool.tool_name or tool.call_id,
            "status": tool.status,
            "input": as_text(tool.args),
            "output": None if tool.result is None else as_text(tool.result),
            "output_ref": None,
            "error": error_line(tool.error),
            "error_text": None if tool.error is None else as_text(tool.error),
            "tokens": None,
            "cost": None,
            "model": "",
            "took": _took(parse_time(folded.occurred_at(first)), end),
        }
    return None


def _took(start: datetime | None, end: datetime | None) -> str:
    if start is None:
        return ""
    if end is None:
        return "still open"
    return duration(max((end - start).total_seconds(), 0.0))


# --- drawing ---------------------------------------------------------------------------------


def render_bars(rows: list[Bar], axis: Axis | None) -> SafeString:
    """The bars of a page (or of a sub-run drawn in place) as HTML, one row each. Written out
    here rather than by a template: a page draws up to MAX_ROWS bars, and Django's engine took
    ~0.4 ms a bar (a lookup and a filter per value), most of the page. Every value is escaped as
    the engine escapes it, through the filters the template used."""
    out = []
    for bar in rows:
        status = slugify(bar.status)
        kind = escaped(bar.kind)
        label = escaped(shown_attr(bar.label))  # in attributes only: `{{ bar.label|shown_attr }}`
        took = escaped(bar.took)
        cost = escaped(money(bar.cost)) if bar.cost is not None else ""
        tokens = f"{escaped(count(bar.tokens_in))} in / {escaped(count(bar.tokens_out))} out"
        left, width = f"{bar.left:.3f}", f"{bar.width:.3f}"  # `|stringformat:'.3f'` of a float
        critical = " critical" if bar.critical else ""
        subrun = escaped(bar.subrun.run_id) if bar.subrun is not None else ""
        marks = f' data-subrun="{subrun}"' if bar.subrun is not None else ""
        out.append(
            f'<div class="wf-row kind-{kind} wf-{status} pattern-{escaped(bar.pattern)}{critical}" role="listitem" '
            f'data-depth="{bar.depth}" data-kind="{kind}"{marks}>\n'
        )
        out.append('  <span class="wf-label">')
        if bar.subrun is not None:
            assert axis is not None
            ws = bar.subrun.workspace
            url = escaped(reverse("run-waterfall-rows", args=[ws.tenant.slug, ws.slug, bar.subrun.run_id]))
            out.append(
                f'<button type="button" class="wf-expand" aria-expanded="false" aria-controls="wf-sub-{subrun}"\n'
                f'      aria-label="Show the bars of sub-run {subrun}"\n'
                f'      hx-get="{url}?from={escaped(quote(axis.start.isoformat()))}&amp;to={escaped(quote(axis.end.isoformat()))}'
                f'&amp;depth={bar.depth + 1}"\n'
                f'      hx-target="#wf-sub-{subrun}" hx-trigger="click once">▸</button>'
            )
        mono = " mono" if bar.kind == "subrun" else ""
        out.append(
            f'\n    <span class="wf-kind">{kind}</span> <a class="wf-link{mono}" href="{escaped(bar.href)}">'
            f"{escaped(shown_name(bar.label))}</a>\n    "
        )
        if bar.detail:
            out.append(f'<span class="muted mono">{escaped(shown_name(bar.detail))}</span>')
        out.append(f'\n    <span class="muted took">{took}</span>')
        if bar.has_usage:
            usage = cost
            if bar.tokens_in is not None:
                usage += f" · {tokens}"
            elif not bar.usage_reported:
                usage += "n/a · usage not reported"
            out.append(f' <span class="wf-usage">{usage}</span>')
        if bar.status:
            out.append(f' <span class="status status-{status}">{escaped(words(bar.status))}</span>')
        if bar.critical:
            out.append(' <span class="visually-hidden">on the critical path</span>')
        out.append('</span>\n  <span class="wf-track">')
        detail_id = escaped(bar.detail_id)
        if bar.detail_url:
            title = f"{kind} {label}: {took}"
            if bar.cost is not None:
                title += f" · {cost}"
            if bar.tokens_in is not None:
                title += f" · {tokens} tokens"
            elif not bar.usage_reported:
                title += " · n/a, usage not reported"
            out.append(
                f'<button type="button" class="wf-bar wf-expand" aria-expanded="false" aria-controls="{detail_id}"\n'
                f'      aria-label="Details of {kind} {label}" hx-get="{escaped(bar.detail_url)}" '
                f'hx-target="#{detail_id}" hx-trigger="click once"\n'
                f'      data-left="{left}" data-width="{width}" title="{title}"></button>'
            )
        else:
            out.append(
                f'<a class="wf-bar" href="{escaped(bar.href)}" tabindex="-1" aria-hidden="true" data-left="{left}" '
                f'data-width="{width}" title="{kind} {label}: {took}"></a>'
            )
        out.append("</span>\n</div>")
        if bar.detail_url:
            out.append(
                f'<div class="wf-children wf-detail" id="{detail_id}" role="listitem" '
                f'aria-label="Details of {kind} {label}"></div>'
            )
        if bar.subrun is not None:
            out.append(f'<div class="wf-children" id="wf-sub-{subrun}" role="presentation"></div>')
        out.append("\n")
    out.append("\n")
    return mark_safe("".join(out))  # every value in it is escaped above
