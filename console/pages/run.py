"""The run page: a header, and tabs that are each an htmx partial and a plain page.

Every tab is served two ways from one template: an htmx request gets the partial alone, a plain
request (a link, a reload, a history restore) the whole page with that tab open. Timeline rows are
rendered by one row template for the page, the `timeline/rows/` fragment and the WebSocket push
(console/live/run.py), so a row looks the same however it arrived.

Query counts do not grow with the run: every list is one query (or a replay-plan/evidence read,
which is a constant number of queries over the whole log), the timeline reads one page of events
(of the events that match its search, when it has one), and the steps and costs tabs one page of
steps (`?start=N`, by position). The conversation, waterfall and state tabs read the log (or its
prefix up to `?at=N`) once and fold it: the fold is the one reading of a log (ledger/replay/runlog.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger import limits
from ledger.errors import LedgerError, NotFound
from ledger.limits import day_in_range
from ledger.log import artifacts, snapshots
from ledger.models import ReexecutionRequest, Run, Step, ToolCall
from ledger.reads import attention, failure, reexecutions, selectors, serialize
from ledger.reads.subruns import subrun_tree
from ledger.replay import cancellation, evidence, gateway, runlog
from ledger.replay.feedback import record_feedback
from ledger.replay.stored_plan import plan_index, replay_plan_at, sessions_of_steps
from ledger.runtime.outer_loop import outer_loop_of, record_run_id
from ledger.tenancy.access import Access

from .. import cursors
from ..format import coverage, tokens
from ..rows import artifact_url, event_row, render_event_row
from ..timeline import annotate
from .at import state_after
from .conversation import SESSIONS_PER_PAGE, conversation_page
from .errors import error_page
from .filters import BROKEN
from .guard import member_access, switcher, wants_fragment
from .reexecution import reexecution_rows, run_origin
from .share import panel_context
from .waterfall import (
    DETAIL_KINDS,
    ROOTS_PER_PAGE,
    Axis,
    as_text,
    bar_detail,
    error_line,
    one_line,
    parse_time,
    render_bars,
    waterfall,
)

TABS = ("timeline", "conversation", "waterfall", "state", "steps", "subruns", "evidence", "costs")
TAB_LABELS = {
    "timeline": "Timeline",
    "conversation": "Conversation",
    "waterfall": "Waterfall",
    "state": "At event N",
    "steps": "Steps & replay plan",
    "subruns": "Sub-runs",
    "evidence": "Evidence",
    "costs": "Costs",
}
SEARCH_FIELDS = ("type", "step", "tool", "q")
MAX_SEARCH = 200  # characters of one search field
PAGE_SIZE = 200
MAX_PAGE_SIZE = 1000
# The events a live timeline keeps while its page stays open on a run that goes on: the oldest
# rows go past it (static/js/live.js), so a page left open on a long run stays as light as a reload.
LIVE_TIMELINE_KEEP = 1000
STEPS_PAGE_SIZE = 200  # steps per page of the steps and costs tabs, by position
EVIDENCE_PAGE_SIZE = 200  # tool calls, and cost entries, per page of the evidence tab
COSTS_CURSOR = "evidence-costs"  # the kind of the evidence tab's sealed `?costs=` cursors (scope: the run)
MISSING_SHOWN = 50  # replayReady's missing items listed before "and N more"
FEEDBACK_SHOWN = 50
NO_RATINGS = selectors.FeedbackSummary(0, None, [])  # what feedback_summary answers for a run no one rated
MAX_CATEGORY = 100
MAX_COMMENT = 10_000


class BadParameter(Exception):
    """A query or form value the console cannot use: a readable 400, never a 500."""


# --- lookups and parameters ------------------------------------------------------------------


def _run_or_404(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> tuple[Access, Run]:
    member = member_access(request, tenant, workspace, run_id=run_id)
    assert member.run is not None
    return member, member.run


def _int_param(request: HttpRequest, name: str, default: int, *, minimum: int, maximum: int = limits.MAX_ROW_ID) -> int:
    raw = request.GET.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadParameter(f"{name} must be a whole number, got {raw[:40]!r}") from None
    if not minimum <= value <= maximum:  # at most a bigint: the database's integers are 64-bit
        raise BadParameter(f"{name} must be between {minimum} and {maximum}, got {raw[:40]}")
    return value


def _moment(raw: str | None) -> datetime | None:
    """An ISO 8601 time from the query (UTC when it names no offset), within ledger.limits'
    calendar range; None for anything else."""
    moment = parse_time(raw)
    if moment is None or not day_in_range(moment.date()):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _bad_request(request: HttpRequest, message: str) -> HttpResponse:
    """The styled 400 (console/pages/errors.py), with the way back: this page without the query."""
    return error_page(request, 400, message, back_url=request.path, back_label="This page without the parameters")


def _tab_url(run: Run, tab: str) -> str:
    ws = run.workspace
    return reverse("run-tab", args=[ws.tenant.slug, ws.slug, run.run_id, tab])


def _tabs(run: Run) -> list[dict[str, str]]:
    """The tab bar's links: the run's address and the tab's name (a slug, as `run-tab` takes it),
    `_tab_url`'s answer without a reverse per tab."""
    ws = run.workspace
    base = reverse("run", args=[ws.tenant.slug, ws.slug, run.run_id])
    return [{"name": t, "label": TAB_LABELS[t], "url": f"{base}{t}/"} for t in TABS]


# --- header ----------------------------------------------------------------------------------


@dataclass
class FeedbackForm:
    rating: str = ""
    category: str = ""
    comment: str = ""
    error: str = ""


def _feedback_context(run: Run, form: FeedbackForm | None = None, *, rated: bool = True) -> dict[str, Any]:
    """`rated`: False when the run is known to have no rating (selectors.neighbourhood)."""
    summary = selectors.feedback_summary(run, latest=FEEDBACK_SHOWN) if rated else NO_RATINGS
    return {
        "feedback_count": summary.count,
        "feedback_average": None if summary.average is None else f"{summary.average:.1f}",
        "feedback_rows": [serialize.feedback(f, run.run_id) for f in summary.latest],
        "feedback_form": form or FeedbackForm(),
        "feedback_url": reverse("run-feedback", args=[run.workspace.tenant.slug, run.workspace.slug, run.run_id]),
        "ratings": range(1, 6),
    }


GLANCE_KEYS = 12  # an input's or output's top-level keys shown in the header before "and N more"


def _readable(value: Any) -> str:
    """A value as a person reads it: a string as itself, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, indent=None if not isinstance(value, dict | list) else 1)


def _glance(value: Any) -> dict[str, Any] | None:
    """An input or output for the header: an object's top-level fields one a line (each value
    readable, a long one folded by long_text), anything else as one text. None when absent."""
    if value is None:
        return None
    if isinstance(value, dict) and value:
        items = list(value.items())
        return {
            "fields": [{"key": str(k), "text": _readable(v)} for k, v in items[:GLANCE_KEYS]],
            "more": max(0, len(items) - GLANCE_KEYS),
        }
    return {"text": _readable(value)}


def _failure(run: Run) -> dict[str, str] | None:
    """The run's error as name, message and step (the fold's RunFailed payload, any shape)."""
    error = run.error
    if error is None:
        return None
    if not isinstance(error, dict):
        return {"name": "", "message": _readable(error), "step": ""}
    step = error.get("stepPath") or error.get("step") or ""
    message = error.get("message")
    return {
        "name": str(error.get("name") or error.get("type") or ""),
        "message": message if isinstance(message, str) else _readable({k: v for k, v in error.items() if k != "name"}),
        "step": step if isinstance(step, str) else _readable(step),
    }


def _output_url(run: Run) -> str | None:
    """The download of an output kept as an artifact: ours by its sha256, an imported log's
    through the artifact it was stored as (its foreign id has nothing to download)."""
    if not run.output_ref:
        return None
    stored = artifacts.resolve(run, [run.output_ref]).get(run.output_ref)
    return artifact_url(run.workspace, stored.artifact_id) if stored is not None else None


def _glance_context(run: Run, asked: list[ReexecutionRequest], *, sub_runs: bool = True) -> dict[str, Any]:
    """The run at a glance: input, output or error, tokens, cost of the run and of its tree,
    models, re-executions of it (`asked`: the first GLANCE_KEYS) and the evidence zip
    (docs/operations.md "The run page"). `sub_runs`: False when the run is known to have none."""
    ws = run.workspace
    tree = subrun_tree(run) if sub_runs else subrun_tree(run, family=[run])
    models = [f"{m['provider']}/{m['model_id']}" for m in selectors.costs_by_model(run)]
    zip_url = reverse("api-run-evidence-zip", args=[run.run_id])
    return {
        "glance": {
            "input": _glance(run.input),
            "output": _glance(run.output),
            "output_url": _output_url(run),
            "failure": _failure(run),
            "tokens": tokens(run),
            "tree": tree.usage if tree.size > 1 else None,
            "tree_size": tree.size - 1,
            "tree_finished": not tree.open,
            "models": models,
            "reexecutions": [
                {
                    "request": rx,
                    # An approved request has its new run's id reserved, but the run exists only
                    # once an executor started it (as the Approvals page links it).
                    "url": reverse("run", args=[ws.tenant.slug, ws.slug, rx.new_run_id])
                    if rx.new_run_id and rx.status in ReexecutionRequest.Status.started()
                    else None,
                    "waiting": rx.status == ReexecutionRequest.Status.APPROVED,
                }
                for rx in asked
            ],
            "evidence_zip_url": f"{zip_url}?workspace={quote(ws.tenant.slug)}/{quote(ws.slug)}",
        }
    }


def _header_context(run: Run, near: selectors.Neighbourhood) -> dict[str, Any]:
    ws = run.workspace
    parent_url = None
    if run.parent_run_id:
        parent_url = reverse("run", args=[ws.tenant.slug, ws.slug, run.parent_run_id])
    # The RunStarted that names the loop is the log's first event: its answer holds at every head.
    loop = snapshots.at_head(run, "outer_loop", lambda: outer_loop_of(run))
    # The requests to re-execute the run, the one that made it and its pending one: one query.
    around = reexecutions.around_run(ws, run.run_id, limit=GLANCE_KEYS) if near.requests else reexecutions.NONE_AROUND
    return {
        **_glance_context(run, around.listed, sub_runs=near.sub_runs),
        "header_url": reverse("run-header", args=[ws.tenant.slug, ws.slug, run.run_id]),
        "parent_url": parent_url,
        "outer_loop": {
            "id": loop[0],
            "cycle": loop[1],
            "record": run.run_id == record_run_id(loop[0]),
            "url": reverse("outer-loop", args=[ws.tenant.slug, ws.slug, loop[0]]),
        }
        if loop
        else None,
        "ws_param": f"{ws.tenant.slug}/{ws.slug}",
        "origin": run_origin(run, around.made),
        "attention": attention.of_run(run, pending=[around.pending] if around.pending else []),
        "failure": failure.of_run(run),
        # A failed run has its RunFailed at least: the jump always lands, and it follows the run live.
        "first_failure_url": _tab_url(run, "timeline") + "?first=failure" if run.status == "failed" else None,
    }


# --- tabs ------------------------------------------------------------------------------------


@dataclass
class Tab:
    template: str
    context: dict[str, Any] = field(default_factory=dict)
    status: int = 200


def _search(request: HttpRequest) -> runlog.EventFilter:
    values = {name: request.GET.get(name, "").strip() for name in SEARCH_FIELDS}
    for name, value in values.items():
        if len(value) > MAX_SEARCH:
            raise BadParameter(f"{name} is at most {MAX_SEARCH} characters")
    return runlog.EventFilter(type=values["type"], step=values["step"], tool=values["tool"], text=values["q"])


def _timeline(request: HttpRequest, member: Access, run: Run) -> Tab | HttpResponse:
    limit = _int_param(request, "limit", PAGE_SIZE, minimum=1, maximum=MAX_PAGE_SIZE)
    jump = request.GET.get("first", "")
    if jump:
        return _jump(run, jump, limit)
    after = _int_param(request, "after", 0, minimum=0) if request.GET.get("after", "") != "" else None
    search = _search(request)
    if search:
        return _search_page(request, run, search, after or 0, limit)
    return _timeline_page(run, after, limit)


def _jump(run: Run, kind: str, limit: int) -> HttpResponse:
    """To the page of the run's first failure (or first in-doubt call), that event marked."""
    if kind not in ("failure", "in_doubt"):
        raise BadParameter("first must be failure or in_doubt")
    sequence = runlog.first_sequence(run, "failure" if kind == "failure" else "in_doubt")
    if sequence is None:
        what = "failure" if kind == "failure" else "in-doubt tool call"
        raise BadParameter(f"this run has no {what}")
    return redirect(f"{_tab_url(run, 'timeline')}?after={sequence - 1}&limit={limit}#event-{sequence}")


def _jumps(run: Run) -> dict[str, bool]:
    """Which of the timeline's jumps can work: offered only where the run has what they jump to.
    The log only grows, so the answer holds for the run's head (read once per head, not per page)."""
    return snapshots.at_head(
        run,
        "jumps",
        lambda: {
            "failure": runlog.first_sequence(run, "failure") is not None,
            "in_doubt": runlog.first_sequence(run, "in_doubt") is not None,
        },
    )


def _search_context(request: HttpRequest, run: Run) -> dict[str, Any]:
    return {
        "search": {name: request.GET.get(name, "").strip() for name in SEARCH_FIELDS},
        "timeline_url": _tab_url(run, "timeline"),
        "jumps": _jumps(run),
    }


def _search_page(request: HttpRequest, run: Run, search: runlog.EventFilter, after: int, limit: int) -> Tab:
    """The events that match, a page at a time (by sequence, like the unfiltered timeline); not live."""
    envelopes = runlog.search_events(run, search, after=after, limit=limit + 1)
    more = len(envelopes) > limit
    rows = [event_row(e, run.workspace) for e in envelopes[:limit]]
    annotate(rows, envelopes[:limit], run, gaps=False)  # matches are not consecutive: no gaps
    query = "&".join(
        f"{name}={quote(request.GET.get(name, '').strip())}"
        for name in SEARCH_FIELDS
        if request.GET.get(name, "").strip()
    )
    base = f"{_tab_url(run, 'timeline')}?{query}&limit={limit}"
    ws = run.workspace
    return Tab(
        "console/run/timeline.html",
        {
            **_search_context(request, run),
            "rows": rows,
            "after": after,
            "limit": limit,
            "newest": False,
            "searching": True,
            "last_on_page": rows[-1]["sequence"] if rows else after,
            "older_url": None,
            "newer_url": f"{base}&after={rows[-1]['sequence']}" if more else None,
            "newest_url": base if after else None,
            "rows_url": reverse("run-timeline-rows", args=[ws.tenant.slug, ws.slug, run.run_id]),
            "ws_path": f"/ws/runs/{run.run_id}/",
        },
    )


def _timeline_page(run: Run, after: int | None, limit: int) -> Tab:
    """Events after `after` (default: the newest page); live only on the newest page."""
    last = run.last_sequence
    # Past the end is the (empty) end: a live view from there would wait for sequences that
    # belong to no page.
    after = max(0, last - limit) if after is None else min(after, last)
    envelopes = selectors.events(run, after=after, limit=limit)
    rows = [event_row(e, run.workspace) for e in envelopes]
    annotate(rows, envelopes, run)
    shown_last = rows[-1]["sequence"] if rows else after
    newest = after + limit >= last
    base = _tab_url(run, "timeline")
    ws = run.workspace
    return Tab(
        "console/run/timeline.html",
        {
            "search": {},
            "timeline_url": base,
            "jumps": _jumps(run),
            "rows": rows,
            "after": after,
            "limit": limit,
            "newest": newest,
            "last_on_page": shown_last,
            # The page just before this one's first event, never one that repeats this one's rows.
            "older_url": f"{base}?after={max(0, after - limit)}&limit={min(limit, after)}" if after > 0 else None,
            "newer_url": f"{base}?after={shown_last}&limit={limit}" if not newest else None,
            "newest_url": base if not newest else None,
            "rows_url": reverse("run-timeline-rows", args=[ws.tenant.slug, ws.slug, run.run_id]),
            "caption_url": reverse("run-timeline-caption", args=[ws.tenant.slug, ws.slug, run.run_id]),
            "ws_path": f"/ws/runs/{run.run_id}/",
            "live_keep": LIVE_TIMELINE_KEEP,
        },
    )


def _pager(
    base: str, start: int, shown: int, total: int, size: int, *, param: str = "start", keep: str = ""
) -> dict[str, Any]:
    """Links around a window of `size` items from position `start` (0-based) of `total`, the start
    in `?param=`; `keep` is the rest of the query the links carry (`name=value&…`)."""
    end = start + size
    rest = f"&{keep}" if keep else ""
    return {
        "start": start,
        "first_shown": start + 1,
        "last_shown": start + shown,
        "total": total,
        "paged": total > size or start > 0,
        "previous_url": (f"{base}?{param}={max(0, start - size)}{rest}" if start > 0 else None),
        "next_url": f"{base}?{param}={end}{rest}" if end < total else None,
        "first_url": (f"{base}?{keep}" if keep else base) if start > 0 else None,
    }


def _step_page(request: HttpRequest, run: Run, tab: str) -> tuple[list[Step], dict[str, Any]]:
    """One page of the run's steps by position (`?start=N`, 0-based) and its pager."""
    start = _int_param(request, "start", 0, minimum=0)
    steps, total = selectors.steps_page(run, start=start, size=STEPS_PAGE_SIZE)
    return steps, _pager(_tab_url(run, tab), start, len(steps), total, STEPS_PAGE_SIZE)


def _conversation(request: HttpRequest, member: Access, run: Run) -> Tab:
    """Every harness session as a conversation, a window of sessions at a time."""
    start = _int_param(request, "start", 0, minimum=0)
    shown, total = conversation_page(run.workspace, runlog.snapshot(run), start) if run.last_sequence else ([], 0)
    pager = _pager(_tab_url(run, "conversation"), start, len(shown), total, SESSIONS_PER_PAGE)
    return Tab("console/run/conversation.html", {"sessions": shown, "pager": pager})


def _waterfall(request: HttpRequest, member: Access, run: Run) -> Tab:
    """A page of the waterfall: ROOTS_PER_PAGE top-level bars (`?start=N`) with what they hold."""
    start = _int_param(request, "start", 0, minimum=0)
    children = runlog.children_of(run) if _neighbourhood(run).sub_runs else []
    view = (
        waterfall(run, runlog.snapshot(run), children, start=start)
        if run.last_sequence
        else {"rows": [], "axis": None, "ticks": [], "total": 0, "shown": 0}
    )
    pager = _pager(_tab_url(run, "waterfall"), start, view["shown"], view["total"], ROOTS_PER_PAGE)
    bars = render_bars(view["rows"], view["axis"])
    return Tab("console/run/waterfall.html", {**view, "bars": bars, "run_id": run.run_id, "pager": pager})


def _state(request: HttpRequest, member: Access, run: Run) -> Tab:
    """The run after event N (`?at=N`, default: the last), from the fold of events 1..N."""
    if not run.last_sequence:
        return Tab("console/run/state.html", {"at": None})
    at = _int_param(request, "at", run.last_sequence, minimum=1, maximum=run.last_sequence)
    base = _tab_url(run, "state")
    return Tab(
        "console/run/state.html",
        {
            **state_after(run, at),
            "last": run.last_sequence,
            "state_url": base,
            "previous_url": f"{base}?at={at - 1}" if at > 1 else None,
            "next_url": f"{base}?at={at + 1}" if at < run.last_sequence else None,
            "events_url": f"{_tab_url(run, 'timeline')}?after={max(at - 1, 0)}#event-{at}",
        },
    )


def _steps(request: HttpRequest, member: Access, run: Run) -> Tab:
    steps, pager = _step_page(request, run, "steps")
    plan = replay_plan_at(run, runlog.snapshot(run).state) if run.last_sequence else None
    should_run = plan_index(plan).should_run if plan else {}
    rows = [
        {
            "step": s,
            "path": s.step_path,
            "status": s.status,
            "attempts": len(s.attempts or []),
            "visit": s.visit,
            "tokens": tokens(s),
            "should_run": should_run.get(s.step_path, s.status != "completed"),
            "error": s.error,
            "error_line": error_line(s.error),
            "output_line": one_line(s.output) if s.has_output else "",
            "output_text": as_text(s.output) if s.has_output else "",
        }
        for s in steps
    ]
    sessions = []
    missing: list[str] = []
    if plan:
        missing = plan["replayReady"]["missing"]
        in_doubt = gateway.calls_in_doubt(run, plan)
        # Sessions of no step go with the first page.
        on_page = sessions_of_steps(plan, (s.step_path for s in steps), stepless=pager["start"] == 0)
        sessions = [
            {
                **session,
                "calls": [
                    {**call, "in_doubt": call["kind"] == "tool" and call.get("callId") in in_doubt}
                    for call in session["calls"]
                ],
            }
            for session in on_page
        ]
    return Tab(
        "console/run/steps.html",
        {
            "steps": rows,
            "plan": plan,
            "sessions": sessions,
            "pager": pager,
            "missing": missing[:MISSING_SHOWN],
            "missing_more": max(0, len(missing) - MISSING_SHOWN),
        },
    )


def _subruns(request: HttpRequest, member: Access, run: Run) -> Tab:
    tree = subrun_tree(run)
    return Tab("console/run/subruns.html", {"tree": tree, "descendants": tree.size - 1})


@dataclass
class ReconcileForm:
    outcome: str = "succeeded"
    value: str = ""
    note: str = ""
    error: str = ""


def _evidence(request: HttpRequest, member: Access, run: Run, forms: dict[str, ReconcileForm] | None = None) -> Tab:
    """The evidence bundle's verdicts, artifacts, approvals and feedback, with its two long lists
    paged (`?calls=N`, `?costs=<cursor>`, EVIDENCE_PAGE_SIZE rows each) and the calls in doubt
    first: a 100,000-event run has 20,000 of each, which the bundle (evidence.json, the zip) lists
    whole. Both pages are read by key, never by OFFSET: the calls by their dense position, the costs
    after (or before) a sequence, which the sealed cursor holds with the page's position."""
    calls_start = _int_param(request, "calls", 0, minimum=0)
    costs_cursor = request.GET.get("costs", "")
    costs_at, costs_after, costs_before = _costs_position(run, costs_cursor)
    checked = evidence.verdicts(run)
    near = _neighbourhood(run)  # no rating or request: their lists are not asked for
    rows = reexecution_rows(run, evidence.approvals(run) if near.requests else [])
    reconcilable_calls = gateway.in_doubt_call_ids(run)
    can_reconcile = member.allows("operator")
    ws = run.workspace
    forms = forms or {}

    def row(call: ToolCall) -> dict[str, Any]:
        shown = serialize.tool_call(call)
        reconcilable = shown["callId"] in reconcilable_calls
        return {
            **shown,
            "in_doubt": shown["status"] == "in_doubt" or reconcilable,
            "reconcilable": reconcilable and can_reconcile,
            "args_json": json.dumps(shown["args"], indent=2, ensure_ascii=False),
            "outcome_json": json.dumps(
                shown["result"] if shown["error"] is None else shown["error"], indent=2, ensure_ascii=False
            ),
            "form": forms.get(shown["callId"], ReconcileForm()),
            "reconcile_url": reverse("run-reconcile", args=[ws.tenant.slug, ws.slug, run.run_id, shown["callId"]]),
        }

    doubtful, in_doubt_count = selectors.tool_calls_in_doubt(run, reconcilable_calls, size=EVIDENCE_PAGE_SIZE)
    calls, calls_total = selectors.tool_calls_page(run, start=calls_start, size=EVIDENCE_PAGE_SIZE)
    costs, costs_total = selectors.costs_page(run, size=EVIDENCE_PAGE_SIZE, after=costs_after, before=costs_before)
    base = _tab_url(run, "evidence")
    artifacts = [
        {**a, "url": artifact_url(ws, a["artifactId"]) if a["size"] is not None else None} for a in checked["artifacts"]
    ]
    return Tab(
        "console/run/evidence.html",
        {
            "bundle": {**checked, "feedback": evidence.feedback(run) if near.ratings else []},
            "in_doubt_calls": [row(c) for c in doubtful],
            "in_doubt_count": in_doubt_count,
            "tool_calls": [row(c) for c in calls],
            "calls_pager": _pager(
                base,
                calls_start,
                len(calls),
                calls_total,
                EVIDENCE_PAGE_SIZE,
                param="calls",
                keep=f"costs={costs_cursor}" if costs_cursor else "",
            ),
            "artifacts": artifacts,
            "costs": [serialize.cost(c) for c in costs],
            "costs_pager": _costs_pager(
                run, base, costs_at, [c.sequence for c in costs], costs_total, keep=f"calls={calls_start}"
            ),
            "can_reconcile": can_reconcile,
            # Reconciled, and nothing went on since: say what continues the run (no dead end).
            "resume_after_reconcile": not in_doubt_count and selectors.waits_for_resume_after_reconcile(run),
            "reexecutions": rows,
            # Back from the re-execution form (`?requested=`): what became of the request just made.
            "just_requested": next((r for r in rows if r["id"] == request.GET.get("requested")), None),
            "approvals_url": reverse("approvals", args=[ws.tenant.slug, ws.slug]),
        },
    )


def _costs_position(run: Run, raw: str) -> tuple[int, int, int | None]:
    """What the evidence tab's `?costs=` cursor holds: the page's position (for "201–400 of N"),
    and the sequence its entries come after, or before (a previous page). The first page has none."""
    if not raw:
        return 0, 0, None
    try:
        position = cursors.unseal(raw, kind=COSTS_CURSOR, scope=run)
        at, key = position["at"], position.get("after", position.get("before"))
        for number in (at, key):  # ours, but a key can leak: range-checked as well
            if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= limits.MAX_ROW_ID:
                raise ValueError("not a position")
    except (ValueError, TypeError, KeyError):  # cursors.NotOurs is a ValueError
        raise BadParameter(f"costs: {BROKEN}") from None
    return (at, key, None) if "after" in position else (at, 0, key)


def _costs_pager(run: Run, base: str, at: int, sequences: list[int], total: int, *, keep: str) -> dict[str, Any]:
    """The pager of a page of cost entries at position `at` holding `sequences`: as `_pager`'s,
    its links carrying sealed keys (`?costs=<cursor>`) instead of positions."""
    rest = f"&{keep}" if keep else ""
    first_url = f"{base}?{keep}" if keep else base

    def url(**position: int) -> str:
        return f"{base}?costs={cursors.seal(position, kind=COSTS_CURSOR, scope=run)}{rest}"

    end = at + len(sequences)
    previous_url = None
    if at > 0:
        previous_url = (
            url(before=sequences[0], at=at - EVIDENCE_PAGE_SIZE) if sequences and at > EVIDENCE_PAGE_SIZE else first_url
        )
    return {
        "start": at,
        "first_shown": at + 1,
        "last_shown": end,
        "total": total,
        "paged": total > EVIDENCE_PAGE_SIZE or at > 0,
        "previous_url": previous_url,
        "next_url": url(after=sequences[-1], at=end) if sequences and end < total else None,
        "first_url": first_url if at > 0 else None,
    }


def _costs(request: HttpRequest, member: Access, run: Run) -> Tab:
    """Per step (a page of them), per model (summed in the database) and the run's totals."""
    steps, pager = _step_page(request, run, "costs")
    rows = [{"step": s, "path": s.step_path, "tokens": tokens(s)} for s in steps]
    models = [{**m, "coverage": coverage(m["priced"], m["calls"] - m["priced"])} for m in selectors.costs_by_model(run)]
    return Tab(
        "console/run/costs.html",
        {
            "steps": rows,
            "pager": pager,
            "models": models,
            "total_tokens": tokens(run),
        },
    )


TAB_VIEWS: dict[str, Callable[[HttpRequest, Access, Run], Tab | HttpResponse]] = {
    "timeline": _timeline,
    "conversation": _conversation,
    "waterfall": _waterfall,
    "state": _state,
    "steps": _steps,
    "subruns": _subruns,
    "evidence": _evidence,
    "costs": _costs,
}


def _cancel_context(member: Access, run: Run, *, reason: str = "", error: str = "") -> dict[str, Any]:
    """The Cancel action of the run's header: an operator's, on a run that has not ended."""
    ws = run.workspace
    return {
        "cancel": {
            "allowed": not run.finished and member.allows("operator"),
            "url": reverse("run-cancel", args=[ws.tenant.slug, ws.slug, run.run_id]),
            "reason": reason,
            "error": error,
            "max": cancellation.MAX_REASON,
        }
    }


def _respond(
    request: HttpRequest,
    member: Access,
    run: Run,
    name: str,
    tab: Tab,
    *,
    feedback: FeedbackForm | None = None,
    cancel: dict[str, Any] | None = None,
) -> HttpResponse:
    context = {
        **tab.context,
        "run": run,
        "workspace": run.workspace,
        "tab": name,
        "tab_template": tab.template,
        "tabs": _tabs(run),
    }
    if wants_fragment(request):
        return render(request, "console/run/tab_partial.html", context, status=tab.status)
    context.update(_header_full_context(member, run, cancel=cancel, feedback=feedback))
    context.update(panel_context(member, run))
    context["workspaces"] = switcher(request)
    return render(request, "console/run.html", context, status=tab.status)


def _neighbourhood(run: Run) -> selectors.Neighbourhood:
    """Whether the run has sub-runs, requests naming it and ratings, in one query asked once per
    request (kept on the request's own run): most runs have none, and the header and the evidence
    tab then list none of them without asking for the lists."""
    near = run.__dict__.get("_neighbourhood")
    if near is None:
        near = run.__dict__["_neighbourhood"] = selectors.neighbourhood(run)
    return near


def _header_full_context(
    member: Access, run: Run, *, cancel: dict[str, Any] | None = None, feedback: FeedbackForm | None = None
) -> dict[str, Any]:
    """The header's context. The member's role is the one resolved for the request (`member`), asked
    once per page rather than once per action offered."""
    near = _neighbourhood(run)
    return {
        **_header_context(run, near),
        "can_reexecute": member.allows("operator"),
        **(cancel or _cancel_context(member, run)),
        **_feedback_context(run, feedback, rated=near.ratings),
    }


# --- views -----------------------------------------------------------------------------------


@login_required
@require_safe
def header(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """The run's header alone: what the live page swaps in when the run moves (static/js/live.js)."""
    member, run = _run_or_404(request, tenant, workspace, run_id)
    context = {"run": run, "workspace": run.workspace, **_header_full_context(member, run)}
    return render(request, "console/run/header.html", context)


@login_required
@require_safe
def run_page(request: HttpRequest, tenant: str, workspace: str, run_id: str, tab: str = "timeline") -> HttpResponse:
    if tab not in TAB_VIEWS:
        raise Http404("no such tab")
    member, run = _run_or_404(request, tenant, workspace, run_id)
    try:
        content = TAB_VIEWS[tab](request, member, run)
    except BadParameter as exc:
        return _bad_request(request, str(exc))
    if isinstance(content, HttpResponse):
        return content
    return _respond(request, member, run, tab, content)


@login_required
@require_safe
def waterfall_rows(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """A sub-run's bars, drawn in place inside its parent's waterfall, on the parent's axis."""
    _, run = _run_or_404(request, tenant, workspace, run_id)
    start, end = _moment(request.GET.get("from")), _moment(request.GET.get("to"))
    if start is None or end is None or end < start:
        return _bad_request(request, "from and to must be ISO 8601 times, from before to")
    try:
        depth = _int_param(request, "depth", 1, minimum=0, maximum=50)
    except BadParameter as exc:
        return _bad_request(request, str(exc))
    view = (
        waterfall(run, runlog.snapshot(run), runlog.children_of(run), Axis(start, end), size=MAX_PAGE_SIZE)
        if run.last_sequence
        else {"rows": []}
    )
    for row in view["rows"]:
        row.depth += depth
    return HttpResponse(render_bars(view["rows"], Axis(start, end)))


@login_required
@require_safe
def waterfall_detail(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """A waterfall bar's detail panel, opened in place: `?kind=step|model|tool&id=` (a step's path,
    a model call's first sequence, a tool call's id); one the run has not: 404."""
    _, run = _run_or_404(request, tenant, workspace, run_id)
    kind, key = request.GET.get("kind", ""), request.GET.get("id", "")
    if kind not in DETAIL_KINDS or not key:
        return _bad_request(request, "kind must be step, model or tool, and id given")
    detail = bar_detail(runlog.snapshot(run), kind, key) if run.last_sequence else None
    if detail is None:
        raise Http404("no such step or call")
    return render(request, "console/run/waterfall_detail.html", {"d": detail})


@login_required
@require_safe
def timeline_caption(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """The newest page's caption alone: what the live page swaps in when the run moves, so that a
    run that ends while its page is open stops reading "as they arrive"."""
    _, run = _run_or_404(request, tenant, workspace, run_id)
    caption_url = reverse("run-timeline-caption", args=[tenant, workspace, run.run_id])
    return render(request, "console/run/timeline_caption.html", {"run": run, "caption_url": caption_url})


@login_required
@require_safe
def timeline_rows(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """Just the rows after `after` (the live view's catch-up); the last sequence in a header."""
    _, run = _run_or_404(request, tenant, workspace, run_id)
    try:
        after = _int_param(request, "after", 0, minimum=0)
        limit = _int_param(request, "limit", PAGE_SIZE, minimum=1, maximum=MAX_PAGE_SIZE)
    except BadParameter as exc:
        return _bad_request(request, str(exc))
    envelopes = selectors.events(run, after=after, limit=limit)
    rows = [event_row(e, run.workspace) for e in envelopes]
    annotate(rows, envelopes, run)  # as the page draws them (gaps between the rows it sends)
    response = HttpResponse("".join(render_event_row(r) for r in rows))
    response["X-Last-Sequence"] = str(rows[-1]["sequence"] if rows else after)
    response["X-Run-Status"] = run.status
    return response


def _feedback_form(request: HttpRequest) -> FeedbackForm:
    form = FeedbackForm(
        rating=request.POST.get("rating", "").strip(),
        category=request.POST.get("category", "").strip(),
        comment=request.POST.get("comment", ""),
    )
    if form.rating not in {"1", "2", "3", "4", "5"}:
        form.error = "Choose a rating from 1 to 5."
    elif len(form.category) > MAX_CATEGORY:
        form.error = f"The category is at most {MAX_CATEGORY} characters."
    elif len(form.comment) > MAX_COMMENT:
        form.error = f"The comment is at most {MAX_COMMENT} characters."
    return form


@login_required
@require_POST
def feedback(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """Any member may rate a run (viewer and up, as the API allows)."""
    member, run = _run_or_404(request, tenant, workspace, run_id)
    form = _feedback_form(request)
    status = 400 if form.error else 201
    if not form.error:
        record_feedback(
            run=run, rating=int(form.rating), category=form.category, comment=form.comment, author=request.user
        )
        form = FeedbackForm()
    if wants_fragment(request):
        context = {"run": run, **_feedback_context(run, form)}
        return render(request, "console/run/feedback_response.html", context, status=status)
    if status == 201:
        return redirect(reverse("run", args=[tenant, workspace, run_id]) + "#feedback", permanent=False)
    return _feedback_page_error(request, member, run, form)


def _feedback_page_error(request: HttpRequest, member: Access, run: Run, form: FeedbackForm) -> HttpResponse:
    tab = _timeline_page(run, None, PAGE_SIZE)
    tab.status = 400
    return _respond(request, member, run, "timeline", tab, feedback=form)


def _reconcile_form(request: HttpRequest) -> tuple[ReconcileForm, Any]:
    form = ReconcileForm(
        outcome=request.POST.get("outcome", "").strip(),
        value=request.POST.get("value", ""),
        note=request.POST.get("note", "").strip(),
    )
    value: Any = None
    if form.outcome not in ("succeeded", "failed"):
        form.error = "Choose succeeded or failed."
    elif form.value.strip():
        what = "result" if form.outcome == "succeeded" else "error"
        try:
            value = limits.loads(form.value)
        except ValueError as exc:  # TooDeep too: refused before parsing
            form.error = f"The {what} must be JSON: {exc}"
        else:
            if limits.has_nul(value):
                form.error = f"The {what} may not contain the NUL character (\\u0000)."
    return form, value


@login_required
@require_POST
def reconcile(request: HttpRequest, tenant: str, workspace: str, run_id: str, call_id: str) -> HttpResponse:
    """An operator settles an in-doubt tool call through the gateway's reconcile service."""
    member, run = _run_or_404(request, tenant, workspace, run_id)
    if not member.allows("operator"):
        raise PermissionDenied("reconciling a tool call needs the operator role")
    form, value = _reconcile_form(request)
    status = 400
    if not form.error:
        try:
            gateway.reconcile_tool_call(
                workspace=run.workspace,
                run_id=run.run_id,
                call_id=call_id,
                outcome=form.outcome,
                value=value,
                note=form.note,
                by=request.user.get_username(),
            )
        except LedgerError as exc:
            if isinstance(exc, NotFound):
                raise Http404("not found") from None
            if exc.status >= 500:  # an integrity failure is not the operator's input: never hide it
                raise
            form.error, status = exc.message, exc.status
        else:
            if not wants_fragment(request):
                return redirect(_tab_url(run, "evidence"))
            ws = run.workspace
            run.refresh_from_db()
            run.workspace = ws
            return _respond(request, member, run, "evidence", _evidence(request, member, run))
    tab = _evidence(request, member, run, forms={call_id: form})
    tab.status = status
    return _respond(request, member, run, "evidence", tab)


@login_required
@require_POST
def cancel(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """An operator cancels the run (ledger/replay/cancellation.py), saying why. htmx: the run page is
    loaded again (HX-Redirect); a refusal answers 400/409 with the form and the message."""
    member, run = _run_or_404(request, tenant, workspace, run_id)
    if not member.allows("operator"):
        raise PermissionDenied("cancelling a run needs the operator role")
    reason = request.POST.get("reason", "").strip()
    error, status = "", 400
    try:
        cancellation.cancel_run(workspace=run.workspace, run_id=run.run_id, reason=reason, by=request.user)
    except NotFound:
        raise Http404("not found") from None
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        error, status = exc.message, exc.status
    else:
        url = reverse("run", args=[tenant, workspace, run_id])
        if wants_fragment(request):
            done = HttpResponse(status=204)
            done["HX-Redirect"] = url
            return done
        return redirect(url)
    context = _cancel_context(member, run, reason=reason, error=error)
    if wants_fragment(request):
        return render(request, "console/run/cancel.html", {**context, "run": run}, status=status)
    tab = _timeline_page(run, None, PAGE_SIZE)
    tab.status = status
    return _respond(request, member, run, "timeline", tab, cancel=context)


RUN = "w/<slug:tenant>/<slug:workspace>/runs/<str:run_id>/"

urlpatterns = [
    path(RUN, run_page, name="run"),
    path(RUN + "header/", header, name="run-header"),
    path(RUN + "timeline/rows/", timeline_rows, name="run-timeline-rows"),
    path(RUN + "timeline/caption/", timeline_caption, name="run-timeline-caption"),
    path(RUN + "waterfall/rows/", waterfall_rows, name="run-waterfall-rows"),
    path(RUN + "waterfall/detail/", waterfall_detail, name="run-waterfall-detail"),
    path(RUN + "feedback/", feedback, name="run-feedback"),
    path(RUN + "tool-calls/<str:call_id>/reconcile/", reconcile, name="run-reconcile"),
    path(RUN + "cancel/", cancel, name="run-cancel"),
    path(RUN + "<slug:tab>/", run_page, name="run-tab"),
]
