"""The waterfall tab: a run's steps, harness sessions, model and tool calls and sub-runs as timed
bars on one time axis, nested by step path, with the critical path marked.

Times are when the events' facts happened (their `occurredAt`, a span's times for OTLP, else their
recordedAt), read from the fold of the log (a step from its first attempt to
its end, a call from its first to its last event) and, for sub-runs, from their Run rows. Rendered
as HTML/CSS bars (positions in percent of the axis): no build step, no script needed to read it.
A sub-run's own bars load in place when asked (`waterfall/rows/`, htmx), on the parent's axis.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.urls import reverse

from ledger.fold import ModelCall, RunState, ToolCallState
from ledger.models import Run
from ledger.replay.plan import first_sequence
from ledger.replay.runlog import FoldedRun

from ..format import duration

_LAST_SEGMENT = re.compile(r"(\[[^\]]*\]|\.[^.\[]*)\Z")
MAX_ROWS = 1000  # bars drawn, in display order; a longer run says how many it left out
MIN_WIDTH = 0.4  # percent: an instant still shows as a sliver one can click
OPEN_STATUSES = ("running", "started", "called", "scheduled", "pending")


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
    }


def _event_url(urls: dict[str, str], sequence: int) -> str:
    return f"{urls['timeline']}?after={max(sequence - 1, 0)}#event-{sequence}"


def _parent_step(path: str, steps: dict[str, Bar]) -> str | None:
    """The nearest step whose path this one extends (`fan` of `fan[0]`), if there is one."""
    current = path
    while True:
        shorter = _LAST_SEGMENT.sub("", current)
        if shorter == current or not shorter:
            return None
        if shorter in steps:
            return shorter
        current = shorter


def _call_bar(folded: FoldedRun, urls: dict[str, str], call: ModelCall) -> Bar | None:
    first = first_sequence(call)
    start = parse_time(folded.occurred_at(first))
    if start is None:
        return None
    last = call.responded_sequence or call.failed_sequence
    model = f"{call.provider}/{call.model_id}" if call.model_id else "model"
    return Bar(
        "model",
        f"turn {call.turn if call.turn is not None else '?'}",
        call.status,
        start,
        parse_time(folded.occurred_at(last)) if last else None,
        f"{urls['conversation']}#turn-{first}",
        first,
        detail=model,
    )


def _tool_bar(folded: FoldedRun, urls: dict[str, str], tool: ToolCallState, subruns: dict[str, Run]) -> Bar | None:
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
        f"{urls['conversation']}#call-{tool.call_id}",
        first,
        detail=tool.caller or "",
    )
    sub_id = tool.args.get("subRunId") if isinstance(tool.args, dict) else None
    child = subruns.get(sub_id) if isinstance(sub_id, str) else None
    if child is not None:
        _as_subrun(bar, child)
    return bar


def _as_subrun(bar: Bar, child: Run) -> None:
    ws = child.workspace
    bar.kind, bar.subrun, bar.label = "subrun", child, child.run_id
    bar.status = child.status
    bar.start = child.started_at or bar.start
    bar.end = child.finished_at if child.finished else None
    bar.href = reverse("run", args=[ws.tenant.slug, ws.slug, child.run_id])


def _steps(folded: FoldedRun, urls: dict[str, str]) -> dict[str, Bar]:
    bars: dict[str, Bar] = {}
    for path, step in folded.state.steps.items():
        start = parse_time(step.started_at) or parse_time(folded.occurred_at(step.first_sequence))
        if start is None:
            continue
        end = parse_time(step.finished_at) if step.status in ("completed", "failed") else None
        bars[path] = Bar(
            "step", path, step.status, start, end, _event_url(urls, step.first_sequence), step.first_sequence
        )
    return bars


def bars_of(run: Run, folded: FoldedRun, children: list[Run]) -> list[Bar]:
    """The run's bars as a forest: steps (nested by path) holding their sessions, a session its
    calls; a sub-workflow's call is its sub-run's bar. Siblings in log order."""
    state: RunState = folded.state
    urls = _urls(run)
    subruns = {c.run_id: c for c in children}
    steps = _steps(folded, urls)
    roots: list[Bar] = []

    def home(step_path: str | None) -> list[Bar]:
        return steps[step_path].children if step_path in steps else roots

    for path, bar in steps.items():
        parent = _parent_step(path, steps)
        (steps[parent].children if parent else roots).append(bar)
    sessions: dict[int, Bar] = {}
    for index, session in enumerate(state.sessions):
        start = parse_time(folded.occurred_at(session.sequence))
        if start is None:
            continue
        end = parse_time(folded.occurred_at(session.ended_sequence)) if session.ended_sequence else None
        bar = Bar(
            "session",
            session.role or "session",
            session.status,
            start,
            end,
            f"{urls['conversation']}#session-{session.sequence}",
            session.sequence,
        )
        sessions[index] = bar
        home(session.step_path).append(bar)
    for call in state.model_calls:
        model_bar = _call_bar(folded, urls, call)
        if model_bar is not None:
            (sessions[call.session].children if call.session in sessions else home(call.step_path)).append(model_bar)
    shown: set[str] = set()
    for tool in state.tool_calls.values():
        tool_bar = _tool_bar(folded, urls, tool, subruns)
        if tool_bar is None:
            continue
        if tool_bar.subrun is not None:
            shown.add(tool_bar.subrun.run_id)
        (sessions[tool.session].children if tool.session in sessions else home(tool.step_path)).append(tool_bar)
    for child in children:  # sub-runs an external harness linked by parentRunId alone
        if child.run_id not in shown and child.started_at is not None:
            bar = Bar("subrun", child.run_id, child.status, child.started_at, None, "")
            _as_subrun(bar, child)
            roots.append(bar)
    _order(roots)
    return roots


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


def axis_of(folded: FoldedRun, bars: list[Bar]) -> Axis | None:
    """From the run's first event (or earliest bar) to the latest of its last event and its bars."""
    starts = [b.start for b in bars]
    first = parse_time(folded.occurred_at(1))
    if first is not None:
        starts.append(first)
    if not starts:
        return None
    ends = [t for t in [parse_time(folded.occurred_at(len(folded.log))), *(b.end for b in _all(bars))] if t]
    return Axis(min(starts), max([*ends, min(starts)]))


def _all(bars: list[Bar]) -> list[Bar]:
    return [x for b in bars for x in (b, *_all(b.children))]


def waterfall(run: Run, folded: FoldedRun, children: list[Run], axis: Axis | None = None) -> dict[str, Any]:
    """The rows and axis of a run's waterfall; `axis` given: a sub-run drawn on its parent's."""
    bars = bars_of(run, folded, children)
    axis = axis or axis_of(folded, bars)
    if axis is None:
        return {"rows": [], "axis": None, "ticks": []}
    mark_critical(bars, axis.end)
    rows = flatten(bars, axis)
    return {"rows": rows[:MAX_ROWS], "left_out": max(len(rows) - MAX_ROWS, 0), "axis": axis, "ticks": axis.ticks()}
