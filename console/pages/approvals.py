"""The Approvals page of a workspace, and evaluate batches (docs/design.md §5: four eyes).

Pending requests show what an approver binds themself to: the mode's plan (what is reused, what
runs live, which write tools could fire), the digest, the requester and the reason. Approving and
denying go through ledger.reexecution.services, which refuses a requester approving their own
request (`self_approval_forbidden`); the page does not offer them the button either. A batch (one
evaluate request per run selected on the runs list) is decided once, on any of its requests.

Pending decisions are paged, oldest first, PENDING_SHOWN to a page (each single request's card
computes its plan): `?after=` is a sealed cursor (console/cursors.py) after the last decision
shown; the page's count and the navigation's badge count all of them.

The list is also an htmx fragment (`?fragment=list`, with the navigation's count as an
out-of-band swap): static/js/live.js fetches it again when the workspace's socket
(console/live/reexecutions.py) says a request or a waiting tool call changed. So is a batch's
body (`?fragment=body`).
"""

from __future__ import annotations

import json
from collections import OrderedDict
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger import audit, limits
from ledger.errors import LedgerError, NotFound
from ledger.evaluation import evaluations
from ledger.models import ReexecutionRequest, ToolCall, Workspace
from ledger.reads import reexecutions, selectors
from ledger.reexecution import services, toolapprovals
from ledger.reexecution.errors import Forbidden, SelfApprovalForbidden
from ledger.replay import toolapproval
from ledger.runtime.reexecute import mode_plan

from .. import cursors
from ..format import money
from .guard import has_role, switcher, workspace_or_404
from .reexecution import divergence_url, member, report_for
from .runs import refused_batch

Status = ReexecutionRequest.Status
FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.DENIED, Status.EXPIRED})  # a batch of these is static
DECIDED_SHOWN = 50  # decided requests on a page of that table, the newest change first
DECIDED_CURSOR = "approvals-decided"  # the kind of its sealed `?decided_after=` cursors (scope: the workspace)
PENDING_SHOWN = 20  # decisions (a batch is one) on a page of the pending list
PENDING_CURSOR = "approvals-pending"  # the kind of its sealed `?after=` cursors (scope: the workspace)
CALLS_SHOWN = 20  # tool calls on a page of those waiting
CALLS_CURSOR = "approvals-tool-calls"  # the kind of its sealed `?calls_after=` cursors (scope: the workspace)
BROKEN_PAGE = "This page link is broken: start again from the first page of what waits."
BROKEN_DECIDED = "This page link is broken: start again from the newest decisions."
QUEUES = (("after", PENDING_CURSOR), ("calls_after", CALLS_CURSOR), ("decided_after", DECIDED_CURSOR))
MAX_BATCH = services.MAX_BATCH_RUNS


def _plan_of(rx: ReexecutionRequest) -> tuple[dict[str, Any] | None, str]:
    try:
        return mode_plan(
            workspace=rx.workspace,
            run_id=rx.original_run_id,
            mode=rx.mode,
            from_step=rx.from_step,
            model_overrides=rx.model_overrides or None,
        ), ""
    except LedgerError as exc:  # the run is gone, or its workflow is not registered here
        return None, exc.message


def _card(rx: ReexecutionRequest, user: Any, *, can_decide: bool, with_plan: bool) -> dict[str, Any]:
    ws = rx.workspace
    plan, problem = _plan_of(rx) if with_plan else (None, "")
    own = (rx.requested_by_user_id is not None and rx.requested_by_user_id == user.pk) or (
        rx.requested_by_key is not None and audit.key_owner_id(rx.requested_by_key) == user.pk
    )
    unowned = audit.requested_by_unowned_key(rx)
    return {
        "rx": rx,
        "plan": plan,
        "plan_problem": problem,
        "own": own,
        "input_json": json.dumps(rx.input, ensure_ascii=False) if rx.has_input else "",
        "unowned_key": unowned,
        "can_approve": can_decide and not own and (not unowned or has_role(user, ws, "admin")),
        "can_deny": can_decide and not own,  # the service refuses the requester either decision
        "run_url": reverse("run", args=[ws.tenant.slug, ws.slug, rx.original_run_id]),
        "new_run_url": reverse("run", args=[ws.tenant.slug, ws.slug, rx.new_run_id])
        if rx.new_run_id and rx.status in Status.started()
        else None,
        "divergence_url": divergence_url(rx),
        "approve_url": reverse("approval-approve", args=[ws.tenant.slug, ws.slug, rx.public_id]),
        "deny_url": reverse("approval-deny", args=[ws.tenant.slug, ws.slug, rx.public_id]),
        "batch_url": reverse("batch", args=[ws.tenant.slug, ws.slug, rx.batch_id]) if rx.batch_id else None,
    }


Position = tuple[datetime, int, int]  # a queue's order: the time, a row id, a place within it


def _seal(position: Position, kind: str, ws: Workspace) -> str:
    return cursors.seal({"t": position[0].isoformat(), "id": position[1], "p": position[2]}, kind=kind, scope=ws)


def _unseal(raw: str, kind: str, ws: Workspace) -> Position:
    """The position a page link of this list of this workspace holds; ValueError for any other."""
    opened = cursors.unseal(raw, kind=kind, scope=ws)
    at, row = limits.keyset_position(opened)
    place = opened.get("p")
    if isinstance(place, bool) or not isinstance(place, int) or not 0 <= place <= limits.MAX_ROW_ID:
        raise ValueError("not a place")
    return at, row, place


def _page_of(
    keyed: list[tuple[Position, Any]], after: Position | None, size: int, kind: str, ws: Workspace
) -> tuple[list[Any], str, int]:
    """Of a queue in its order (each item with its position), the page after `after`: its items,
    the next page's cursor ("" on the last) and how many wait after it."""
    if after is not None:
        keyed = [k for k in keyed if k[0] > after]
    shown, rest = keyed[:size], keyed[size:]
    return [item for _, item in shown], _seal(shown[-1][0], kind, ws) if rest else "", len(rest)


def _pending_page(ws: Workspace, after: Position | None) -> tuple[list[list[ReexecutionRequest]], int, str, int]:
    """The pending decisions of this page: each a list of requests (a batch's, or one), oldest
    first, the first PENDING_SHOWN after the position `after` (a decision's first request's time
    and id); with how many decisions wait in all, the next page's cursor ("" on the last) and how
    many decisions wait after this page."""
    keys: OrderedDict[str, tuple[Position, list[int]]] = OrderedDict()
    for pk, batch_id, public_id, created_at in reexecutions.pending_approval(ws).values_list(
        "pk", "batch_id", "public_id", "created_at"
    ):
        keys.setdefault(batch_id or public_id, ((created_at, pk, 0), []))[1].append(pk)
    shown, cursor, more = _page_of(list(keys.values()), after, PENDING_SHOWN, PENDING_CURSOR, ws)
    rows = {
        rx.pk: rx
        for rx in reexecutions.requests(ws)
        .filter(pk__in=[pk for pks in shown for pk in pks])
        .order_by("created_at", "pk")
    }
    for rx in rows.values():
        rx.workspace = ws
    return [[rows[pk] for pk in pks if pk in rows] for pks in shown], len(keys), cursor, more


def _pending_cards(
    ws: Workspace, user: Any, can_decide: bool, decisions: list[list[ReexecutionRequest]]
) -> list[dict[str, Any]]:
    """One card per pending request, except a batch: one card for all of it (one decision)."""
    cards = []
    for members in decisions:
        if not members:  # decided between the two reads
            continue
        card = _card(members[0], user, can_decide=can_decide, with_plan=len(members) == 1)
        card["batch"] = (
            [
                {
                    "rx": m,
                    "run_url": reverse("run", args=[ws.tenant.slug, ws.slug, m.original_run_id]),
                    # An evaluation's input change gives each run its own input: shown per run.
                    "input_json": json.dumps(m.input, ensure_ascii=False) if m.has_input else "",
                }
                for m in members
            ]
            if members[0].batch_id
            else []
        )
        card["live_write_tools"] = card["plan"]["liveWriteTools"] if card["plan"] else []
        cards.append(card)
    return cards


def _calls_page(ws: Workspace, after: Position | None) -> tuple[list[ToolCall], int, str, int]:
    """The tool calls waiting for an approver on this page, oldest first (their run's start, then
    their place in it): the first CALLS_SHOWN after the position `after`; with how many wait in
    all, the next page's cursor and how many wait after this page."""
    calls = toolapproval.waiting_calls(ws)
    keyed = [((call.run.created_at, call.run.pk, call.position), call) for call in calls]
    shown, cursor, more = _page_of(keyed, after, CALLS_SHOWN, CALLS_CURSOR, ws)
    return shown, len(calls), cursor, more


def _tool_cards(ws: Workspace, user: Any, can_decide: bool, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """One card per tool call waiting for an approver (ledger/replay/toolapproval.py): the exact
    arguments and the digest the decision binds to."""
    cards = []
    for call in calls:
        requester = toolapproval.requester_of(call.run)
        own = toolapproval.is_requester(requester, ws, user)
        unowned = toolapproval.started_by_unowned_key(requester, ws)
        cards.append(
            {
                "call": call,
                "run_id": call.run.run_id,
                "requester": requester,
                "own": own,
                "digest": toolapproval.pending_digest(call),
                "args_json": json.dumps(call.args, ensure_ascii=False, indent=2, sort_keys=True),
                "run_url": reverse("run", args=[ws.tenant.slug, ws.slug, call.run.run_id]),
                "unowned_key": unowned,
                "can_approve": can_decide and not own and (not unowned or has_role(user, ws, "admin")),
                "can_reject": can_decide and not own,  # the service refuses the requester either decision
                "key": f"{call.run.run_id}/{call.call_id}",
            }
        )
    return cards


def _decided_page(ws: Workspace, after: Position | None) -> tuple[list[ReexecutionRequest], str]:
    """The decided requests of this page, the newest change first: DECIDED_SHOWN older than the
    position `after` (a request's last change and id); with the next page's cursor ("" on the
    last). A request that changes again (approved, then executed) moves up to the first page."""
    decided = reexecutions.decided(ws, before=after[:2] if after else None, limit=DECIDED_SHOWN + 1)
    for rx in decided:
        rx.workspace = ws
    if len(decided) <= DECIDED_SHOWN:
        return decided, ""
    decided = decided[:DECIDED_SHOWN]
    return decided, _seal((decided[-1].updated_at, decided[-1].pk, 0), DECIDED_CURSOR, ws)


def _after(request: HttpRequest, name: str, kind: str, ws: Workspace) -> tuple[Position | None, bool]:
    """The position of the page of a list asked (`?after=`, `?calls_after=`, `?decided_after=`),
    None for the first page; and whether the link was broken (not a cursor this workspace's list
    gave out)."""
    raw = request.GET.get(name, "")
    if not raw:
        return None, False
    try:
        return _unseal(raw, kind, ws), False
    except (ValueError, TypeError, OverflowError):
        return None, True


def _kept(request: HttpRequest, ws: Workspace) -> dict[str, str]:
    """This page's place in its three lists: its cursors that open, by parameter name."""
    return {name: request.GET[name] for name, kind in QUEUES if _after(request, name, kind, ws)[0] is not None}


def _query(kept: dict[str, str], **changes: str) -> str:
    """The query of a place in the three lists (`_kept`) with these changes: what a decision form,
    the live list and the other lists' page links keep."""
    place = {**kept, **changes}
    pairs = [(name, place[name]) for name, _ in QUEUES if place.get(name)]
    return "?" + urlencode(pairs) if pairs else ""


def _context(request: HttpRequest, ws: Workspace, *, refused: dict[str, str] | None = None) -> dict[str, Any]:
    can_decide = has_role(request.user, ws, "approver")
    after, broken = _after(request, "after", PENDING_CURSOR, ws)
    decisions, pending_total, next_after, more = _pending_page(ws, after)
    calls_after, calls_broken = _after(request, "calls_after", CALLS_CURSOR, ws)
    calls, calls_total, next_calls, more_calls = _calls_page(ws, calls_after)
    # A broken link shows no cards: read as the page linked, they would be another page's
    # (docs/operations.md § Page links).
    if broken:
        decisions, next_after, more = [], "", 0
    if calls_broken:
        calls, next_calls, more_calls = [], "", 0
    decided_after, decided_broken = _after(request, "decided_after", DECIDED_CURSOR, ws)
    decided, next_decided = ([], "") if decided_broken else _decided_page(ws, decided_after)
    here = reverse("approvals", args=[ws.tenant.slug, ws.slug])
    positions = {"after": after, "calls_after": calls_after, "decided_after": decided_after}
    kept = {name: request.GET[name] for name, at in positions.items() if at is not None}
    page = _query(kept)
    return {
        "workspace": ws,
        "can_decide": can_decide,
        "pending": _pending_cards(ws, request.user, can_decide, decisions),
        "tool_calls": _tool_cards(ws, request.user, can_decide, calls),
        "pending_total": pending_total,
        "calls_total": calls_total,
        "waiting": pending_total + calls_total,  # the navigation's count: one per decision waiting
        "page_query": page,  # kept by the decision forms, so a decision comes back to this page
        "next_url": here + _query(kept, after=next_after) if next_after else "",
        "first_url": here + _query(kept, after="") if after is not None or broken else "",
        "more_waiting": more,
        "broken_page": BROKEN_PAGE if broken else "",
        "calls_next_url": here + _query(kept, calls_after=next_calls) if next_calls else "",
        "calls_first_url": here + _query(kept, calls_after="") if calls_after is not None or calls_broken else "",
        "calls_more_waiting": more_calls,
        "calls_broken_page": BROKEN_PAGE if calls_broken else "",
        "tool_decide_url": reverse("approval-tool-call", args=[ws.tenant.slug, ws.slug]),
        "decided": [_card(rx, request.user, can_decide=False, with_plan=False) for rx in decided],
        "decided_next_url": here + _query(kept, decided_after=next_decided) if next_decided else "",
        "decided_first_url": here + _query(kept, decided_after="")
        if decided_after is not None or decided_broken
        else "",
        "decided_broken_page": BROKEN_DECIDED if decided_broken else "",
        # A refused decision: which request, why, and the note as typed (kept in its card's form).
        "refused": refused or {},
        "list_url": here + (page + "&" if page else "?") + "fragment=list",
        "socket": f"/ws/workspaces/{ws.tenant.slug}/{ws.slug}/reexecutions/",
    }


def _page(request: HttpRequest, ws: Workspace, *, status: int = 200, **extra: Any) -> HttpResponse:
    context = _context(request, ws, **extra)
    if (context["broken_page"] or context["calls_broken_page"] or context["decided_broken_page"]) and status == 200:
        status = 400  # a page link that is not ours: said, with the first page and a link to it
    if getattr(request, "htmx", False) or request.GET.get("fragment") == "list":
        return render(request, "console/approvals/list.html", {**context, "fragment": True}, status=status)
    context["workspaces"] = switcher(request)
    return render(request, "console/approvals.html", context, status=status)


@login_required
@require_safe
def approvals(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """Every member sees what is asked and decided; approvers and admins decide."""
    return _page(request, workspace_or_404(request, tenant, workspace))


def _refused(reexecution_id: str, message: str, note: str) -> dict[str, str]:
    return {"id": reexecution_id, "message": message, "note": note}


def _decide(request: HttpRequest, tenant: str, workspace: str, reexecution_id: str, *, approve: bool) -> HttpResponse:
    ws = workspace_or_404(request, tenant, workspace)
    try:
        reexecutions.get([ws], reexecution_id)
    except NotFound:
        raise Http404("not found") from None
    if not has_role(request.user, ws, "approver"):
        raise PermissionDenied("deciding a re-execution needs the approver role")
    note = request.POST.get("note", "").strip()
    decide = services.approve if approve else services.deny
    try:
        decide(workspace=ws, reexecution_id=reexecution_id, by=member(request), note=note)
    except NotFound:
        raise Http404("not found") from None
    except (SelfApprovalForbidden, Forbidden, LedgerError) as exc:
        if exc.status >= 500:
            raise
        # Refused (own request, expired, plan changed, already decided): the page again, saying why.
        return _page(request, ws, status=exc.status, refused=_refused(reexecution_id, exc.message, note))
    if getattr(request, "htmx", False):
        return _page(request, ws)
    return _back(request, ws)


def _back(request: HttpRequest, ws: Workspace) -> HttpResponse:
    """After a decision: the page it was made on (its cursors checked again)."""
    return redirect(reverse("approvals", args=[ws.tenant.slug, ws.slug]) + _query(_kept(request, ws)))


@login_required
@require_POST
def approve(request: HttpRequest, tenant: str, workspace: str, reexecution_id: str) -> HttpResponse:
    return _decide(request, tenant, workspace, reexecution_id, approve=True)


@login_required
@require_POST
def deny(request: HttpRequest, tenant: str, workspace: str, reexecution_id: str) -> HttpResponse:
    return _decide(request, tenant, workspace, reexecution_id, approve=False)


@login_required
@require_POST
def tool_call_decide(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """An approver approves or rejects a tool call waiting for approval, bound to the digest of
    the arguments the page showed them (ledger/replay/toolapproval.py); the worker then resumes
    the run (ledger/reexecution/toolapprovals.py)."""
    ws = workspace_or_404(request, tenant, workspace)
    if not has_role(request.user, ws, "approver"):
        raise PermissionDenied("deciding a tool call needs the approver role")
    run_id, call_id = request.POST.get("run", ""), request.POST.get("call", "")
    key = f"{run_id}/{call_id}"
    if not run_id or not call_id or selectors.find_run(ws, run_id) is None:
        raise Http404("not found")
    note = request.POST.get("note", "").strip()
    decision = request.POST.get("decision", "")
    if decision not in ("approve", "reject"):
        return _page(request, ws, status=400, refused=_refused(key, "Choose approve or reject.", note))
    try:
        toolapprovals.decide(
            workspace=ws,
            run_id=run_id,
            call_id=call_id,
            approve=decision == "approve",
            seen_digest=request.POST.get("digest", ""),
            note=note,
            by=member(request),
        )
    except NotFound:
        raise Http404("not found") from None
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        # Refused (the run's requester, other arguments since, already decided): the page again, saying why.
        return _page(request, ws, status=exc.status, refused=_refused(key, exc.message, note))
    if getattr(request, "htmx", False):
        return _page(request, ws)
    return _back(request, ws)


# --- evaluate batches --------------------------------------------------------------------------


def parse_mapping(text: str) -> tuple[dict[str, dict[str, str]], str]:
    """`slot=provider/model`, one a line (blank lines ignored) -> modelOverrides, or an error."""
    out: dict[str, dict[str, str]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line:
            continue
        slot, eq, target = line.partition("=")
        provider, slash, model = target.strip().partition("/")
        if not eq or not slot.strip() or not slash or not provider or not model:
            return {}, f"Line {number}: write slot=provider/model, e.g. default=scripted/gpt-4o."
        out[slot.strip()] = {"provider": provider.strip(), "model": model.strip()}
    return out, ""


@login_required
@require_POST
def batch_create(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """The runs list's selection -> one evaluate request per run, one batch, one approval."""
    ws = workspace_or_404(request, tenant, workspace)
    if not has_role(request.user, ws, "operator"):
        raise PermissionDenied("requesting an evaluation needs the operator role")
    run_ids = [r for r in request.POST.getlist("run") if r]
    reason = request.POST.get("reason", "").strip()
    models_text = request.POST.get("models", "")
    mapping, problem = parse_mapping(models_text)
    errors: dict[str, str] = {}
    if not run_ids:
        errors["run"] = "Tick the runs to evaluate (the boxes in the list below)."
    elif len(run_ids) > MAX_BATCH:
        errors["run"] = f"A batch holds at most {MAX_BATCH} runs."
    if problem or not mapping:
        errors["models"] = problem or "Give the model mapping to evaluate, e.g. default=scripted/gpt-4o."
    if not reason:
        errors["reason"] = "Say why these runs should be evaluated (the reason is required)."
    if not errors:
        try:
            batch_id, _ = services.request_batch(
                workspace=ws,
                run_ids=list(dict.fromkeys(run_ids)),
                reason=reason,
                by=member(request),
                model_overrides=mapping,
            )
        except NotFound as exc:
            errors["run"] = exc.message
        except Forbidden as exc:
            raise PermissionDenied(exc.message) from None
        except LedgerError as exc:
            if exc.status >= 500:
                raise
            errors["form"] = exc.message
        else:
            return redirect("batch", tenant=tenant, workspace=workspace, batch_id=batch_id)
    # Refused: the runs list again with the form open as typed, each reason beside its field.
    return refused_batch(request, ws, errors=errors, models=models_text, reason=reason, run_ids=run_ids)


def _outcome_kept(report: dict[str, Any]) -> bool:
    before, after = report["original"], report["new"]
    return before["status"] == after["status"] and before.get("output") == after.get("output")


def _sum(values: list[Any]) -> Decimal | None:
    known = [Decimal(str(v)) for v in values if v is not None]
    return sum(known, Decimal(0)) if known else None


@login_required
@require_safe
def batch(request: HttpRequest, tenant: str, workspace: str, batch_id: str) -> HttpResponse:
    """The batch's runs side by side: which kept their outcome, which changed, cost before/after."""
    ws = workspace_or_404(request, tenant, workspace)
    try:
        members = reexecutions.of_batch(ws, batch_id)
    except NotFound:
        raise Http404("not found") from None
    rows = []
    evaluation = None
    for rx in members:
        rx.workspace = ws
        report = report_for(rx) if rx.status in (Status.SUCCEEDED, Status.FAILED) else None
        evaluation, scores = evaluations.scores_of_request(ws, rx)
        rows.append(
            {
                **_card(rx, request.user, can_decide=False, with_plan=False),
                "scores": scores,
                "report": report,
                "kept": _outcome_kept(report) if report else None,
                "cost_before": report["original"]["costUsd"] if report else None,
                "cost_after": report["new"]["costUsd"] if report else None,
            }
        )
    compared = [r for r in rows if r["report"] is not None]
    first = members[0]
    body = request.GET.get("fragment") == "body"
    return render(
        request,
        "console/approvals/batch_body.html" if body else "console/approvals/batch.html",
        {
            "socket": f"/ws/workspaces/{ws.tenant.slug}/{ws.slug}/reexecutions/",
            "body_url": reverse("batch", args=[tenant, workspace, batch_id]) + "?fragment=body",
            "live": any(rx.status not in FINAL for rx in members),
            "workspace": ws,
            "batch_id": batch_id,
            "first": first,
            "rows": rows,
            "kept": sum(1 for r in compared if r["kept"]),
            "changed": [r for r in compared if not r["kept"]],
            "compared": len(compared),
            "total": len(rows),
            "cost_before": money(_sum([r["cost_before"] for r in compared])),
            "cost_after": money(_sum([r["cost_after"] for r in compared])),
            "approvals_url": reverse("approvals", args=[tenant, workspace]),
            "evaluation_url": reverse("evaluation", args=[tenant, workspace, evaluation.public_id])
            if evaluation
            else None,
            "workspaces": switcher(request),
        },
    )


WS = "w/<slug:tenant>/<slug:workspace>/"

urlpatterns = [
    path(WS + "approvals/", approvals, name="approvals"),
    path(WS + "approvals/tool-calls/", tool_call_decide, name="approval-tool-call"),
    path(WS + "approvals/<str:reexecution_id>/approve/", approve, name="approval-approve"),
    path(WS + "approvals/<str:reexecution_id>/deny/", deny, name="approval-deny"),
    path(WS + "batches/", batch_create, name="batch-create"),
    path(WS + "batches/<str:batch_id>/", batch, name="batch"),
]
