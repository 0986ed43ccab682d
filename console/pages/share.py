"""Share links in the console: the public, read-only page a link opens (`/s/<token>/`), its
evidence.json, and the share panel of the run page (list, create, revoke; the workspace's policy),
for operators and up: a viewer is offered neither the panel nor a link to it, and the panel's own
address (`…/share-links/`) is the 403 page for them, saying why.

The public page needs no login and offers nothing to do: no forms, no live updates, no link into
the console (every link stays under `/s/<token>/`). It reuses the run page's partials — timeline,
conversation, steps, sub-run tree, costs — with `shared` set, which leaves out their controls and
points their links under the share link. Every response under `/s/` is `noindex`, `no-referrer`
(the token is in the URL: it must not leak to another site) and `no-store`.

Every request for a page or the JSON counts as one open of the link (ledger/tenancy/sharing.py): the
page shows all its sections at once, so one reading is one open; the timeline's pager links are
opens too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import orjson
from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.core.serializers.json import DjangoJSONEncoder
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from ledger.errors import LedgerError, NotFound
from ledger.models import Run, ShareLink
from ledger.reads import selectors
from ledger.reads.subruns import subrun_tree
from ledger.replay import evidence
from ledger.replay.runlog import snapshot
from ledger.replay.stored_plan import plan_index, replay_plan_at, sessions_of_steps
from ledger.tenancy import sharing
from ledger.tenancy.access import Access

from ..format import coverage, tokens
from ..rows import event_row
from ..streams import StreamSlots
from ..timeline import annotate
from .conversation import conversation_page
from .guard import member_access

TIMELINE_PAGE = 200
STEPS_SHOWN = 200
DEFAULT_EXPIRY_HOURS = 72

# evidence.json requests in flight per link token (the link and its sub-runs together), in this
# process: a bundle of a large run is heavy, and a link shared widely must not stall the others.
EVIDENCE_SLOTS = StreamSlots()


def max_evidence_in_flight() -> int:
    return int(getattr(settings, "LEDGER_SHARE_EVIDENCE_MAX_IN_FLIGHT_PER_LINK", 2))


def _private(response: HttpResponse) -> HttpResponse:
    """What every response under /s/ carries, refusals included."""
    response["X-Robots-Tag"] = "noindex, nofollow"
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    return response


def _refusal(request: HttpRequest, status: int, title: str, message: str, **extra: Any) -> HttpResponse:
    context = {"title": title, "message": message, "new_link_hint": True, **extra}
    return _private(render(request, "share/refused.html", context, status=status))


SAFE_METHODS = ("GET", "HEAD")
View = Callable[..., HttpResponse]


def _read_only(*, as_json: bool) -> Callable[[View], View]:
    """`require_safe` with the share pages' own 405: the shared layout (never the console's, which
    a visitor without an account has nothing to do with) leading back to the page, or for
    evidence.json the JSON error body its other refusals have; `Allow` and the private headers on
    both. Answered before the token is looked at: it tells nothing of the link."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        def read_only(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            if request.method in SAFE_METHODS:
                return view(request, *args, **kwargs)
            method = (request.method or "")[:20]
            if as_json:
                refused: HttpResponse = JsonResponse(
                    {
                        "error": {
                            "code": "method_not_allowed",
                            "message": f"{method} is not allowed here: the evidence is read with GET",
                            "details": {"allowed": list(SAFE_METHODS)},
                        }
                    },
                    status=405,
                )
                refused = _private(refused)
            else:
                refused = _refusal(
                    request,
                    405,
                    "Method not allowed",
                    f"A shared run is read only: this address does not take a {method} request.",
                    new_link_hint=False,
                    back_url=request.path,
                )
            refused["Allow"] = ", ".join(SAFE_METHODS)
            return refused

        return read_only

    return decorate


GONE_TITLES = {
    "expired": "Link expired",
    "revoked": "Link revoked",
    "used_up": "Link used up",
    "run_deleted": "Run deleted",
}


NO_LINK = "There is no share link at this address."


def _json_refusal(error: LedgerError) -> HttpResponse:
    """A refusal of evidence.json: the JSON error envelope its 429 has too, not the HTML page."""
    return _private(JsonResponse(error.error_body(), status=error.status))


def _open(request: HttpRequest, token: str, run_id: str | None, what: str) -> sharing.Opened | HttpResponse:
    as_json = what == "evidence.json"
    try:
        return sharing.open_link(token, what=what, sub_run_id=run_id)
    except NotFound:
        if as_json:
            return _json_refusal(NotFound(NO_LINK))
        return _refusal(request, 404, "Not found", NO_LINK)
    except sharing.ShareLinkGone as gone:
        if as_json:
            return _json_refusal(gone)
        return _refusal(request, 410, GONE_TITLES.get(gone.reason, "Link gone"), gone.message)


def _after(request: HttpRequest) -> int | None | str:
    """`?after=N` of the timeline: None when absent, the error message when not a whole number ≥ 0."""
    raw = request.GET.get("after", "")
    if raw == "":
        return None
    if not raw.isascii() or not raw.isdigit() or len(raw) > 12:
        return f"after must be a whole number, got {raw[:40]!r}"
    return int(raw)


def _strip_artifact_links(views: list[Any]) -> None:
    """The verified downloads are the console's (a member's session): a shared view names the
    artifacts without linking them."""
    for session in views:
        for tool in session.loose_tools:
            tool.artifacts = [{**a, "url": None} for a in tool.artifacts]
            tool.stored = [{**a, "url": None} for a in tool.stored]
        for turn in session.turns:
            turn.artifacts = [{**a, "url": None} for a in turn.artifacts]
            turn.stored = [{**a, "url": None} for a in turn.stored]
            for tool in turn.tools:
                tool.artifacts = [{**a, "url": None} for a in tool.artifacts]
                tool.stored = [{**a, "url": None} for a in tool.stored]


def _timeline(run: Run, page_path: str, after: int | None, hide_inputs: bool, *, at_root: bool) -> dict[str, Any]:
    last = run.last_sequence
    after = 0 if after is None else min(after, last)
    envelopes = [
        sharing.shared_envelope(e, hide_inputs=hide_inputs, at_root=at_root)
        for e in selectors.events(run, after=after, limit=TIMELINE_PAGE)
    ]
    rows = [event_row(e, run.workspace) for e in envelopes]
    annotate(rows, envelopes, run)
    for row in rows:
        row["artifacts"] = [{**a, "url": None} for a in row["artifacts"]]
    shown_last = rows[-1]["sequence"] if rows else after
    return {
        "rows": rows,
        "after": after,
        "limit": TIMELINE_PAGE,
        "newest": False,
        "searching": False,
        "search": {},
        "last_on_page": shown_last,
        "older_url": f"{page_path}?after={max(0, after - TIMELINE_PAGE)}#timeline" if after > 0 else None,
        "newer_url": f"{page_path}?after={shown_last}#timeline" if shown_last < last else None,
        "newest_url": None,
    }


def _pager(shown: int, total: int) -> dict[str, Any]:
    """The run page's pager with no links: a shared page shows the first window only."""
    return {
        "start": 0,
        "first_shown": 1,
        "last_shown": shown,
        "total": total,
        "paged": total > shown,
        "previous_url": None,
        "next_url": None,
        "first_url": None,
    }


def _steps(run: Run) -> dict[str, Any]:
    steps, total = selectors.steps_page(run, start=0, size=STEPS_SHOWN)
    plan = replay_plan_at(run, snapshot(run).state) if run.last_sequence else None
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
        }
        for s in steps
    ]
    missing = plan["replayReady"]["missing"] if plan else []
    return {
        "steps": rows,
        "plan": plan,
        # The plan's sessions of the steps shown, and of no step (the page shows the first window).
        "plan_sessions": sessions_of_steps(plan, (s.step_path for s in steps), stepless=True) if plan else [],
        "step_pager": _pager(len(steps), total),
        "missing": missing[:50],
        "missing_more": max(0, len(missing) - 50),
        "models": [
            {**m, "coverage": coverage(m["priced"], m["calls"] - m["priced"])} for m in selectors.costs_by_model(run)
        ],
        "total_tokens": tokens(run),
    }


@_read_only(as_json=False)
def shared_run(request: HttpRequest, token: str, run_id: str | None = None) -> HttpResponse:
    after = _after(request)
    if isinstance(after, str):
        try:
            sharing.find_link(token)
        except NotFound:
            return _refusal(request, 404, "Not found", NO_LINK)
        return _refusal(request, 400, "Bad request", after)
    opened = _open(request, token, run_id, "page")
    if isinstance(opened, HttpResponse):
        return opened
    link, run = opened.link, opened.run
    hide = link.workspace.share_hides_inputs
    base = sharing.share_path(token)
    page_path = sharing.shared_run_path(token, opened.root.run_id, run.run_id)
    shown_sessions, total_sessions = (
        conversation_page(run.workspace, sharing.shared_folded(run, hide_inputs=hide)) if run.last_sequence else ([], 0)
    )
    _strip_artifact_links(shown_sessions)
    context: dict[str, Any] = {
        "shared": True,
        "run": run,
        "workspace": run.workspace,
        "link": link,
        "hide_inputs": hide,
        "share_base": base,
        "share_root": opened.root.run_id,
        "page_path": page_path,
        "is_root": run.pk == opened.root.pk,
        "parent_path": (
            sharing.shared_run_path(token, opened.root.run_id, run.parent_run_id) if run.pk != opened.root.pk else None
        ),
        "evidence_path": f"{page_path}evidence.json",
        "conversation_sessions": shown_sessions,
        "session_pager": _pager(len(shown_sessions), total_sessions),
        **_timeline(run, page_path, after, hide, at_root=run.pk == opened.root.pk),
        **_steps(run),
    }
    if link.include_sub_runs:
        tree = subrun_tree(run)
        context.update({"tree": tree, "descendants": tree.size - 1})
    return _private(render(request, "share/run.html", context))


# The token is the credential and nothing here changes state, so there is no session to protect:
# without the exemption Django's CSRF check answered a POST with its HTML 403 page, not the 405.
@csrf_exempt
@_read_only(as_json=True)
def shared_evidence(request: HttpRequest, token: str, run_id: str | None = None) -> HttpResponse:
    # The slot is taken before the link is opened: a refused request does not use up an open. An
    # unknown token holds no slots, so it is still the 404 below.
    limit = max_evidence_in_flight()
    slot = EVIDENCE_SLOTS.take(f"share:{token}", limit)
    if slot is None:
        refused = JsonResponse(
            {
                "error": {
                    "code": "rate_limited",
                    "message": f"at most {limit} evidence requests of one share link run at once; "
                    "wait for one to finish",
                    "details": {"retryAfter": 1, "limit": limit},
                }
            },
            status=429,
        )
        refused["Retry-After"] = "1"
        return _private(refused)
    try:
        return _shared_evidence(request, token, run_id)
    finally:
        slot.release()


def _shared_evidence(request: HttpRequest, token: str, run_id: str | None) -> HttpResponse:
    opened = _open(request, token, run_id, "evidence.json")
    if isinstance(opened, HttpResponse):
        return opened
    bundle = evidence.evidence_bundle(opened.run)
    shared = sharing.shared_bundle(
        bundle,
        token=token,
        root_run_id=opened.root.run_id,
        hide_inputs=opened.link.workspace.share_hides_inputs,
        include_sub_runs=opened.link.include_sub_runs,
    )
    return _private(_json(shared))


def _json(body: dict[str, Any]) -> HttpResponse:
    """The bundle as JSON, by orjson (the standard encoder took half a second for a run of 100,000
    events), with Django's encoder for what orjson does not write alike (datetimes, decimals);
    what orjson refuses (an integer beyond 64 bits) goes to Django's JsonResponse, as before."""
    try:
        content = orjson.dumps(body, default=DjangoJSONEncoder().default, option=orjson.OPT_PASSTHROUGH_DATETIME)
    except orjson.JSONEncodeError:
        return JsonResponse(body, json_dumps_params={"ensure_ascii": False})
    return HttpResponse(content, content_type="application/json")


def shared_nothing(request: HttpRequest, token: str, rest: str) -> HttpResponse:
    """Any other path under a link: the same private 404 as an unknown token (Django's own 404
    page would carry none of the headers)."""
    return _refusal(request, 404, "Not found", NO_LINK)


# --- the share panel of the run page (operators and up; a viewer sees neither it nor a way to it) ---------------------------------------


def panel_context(member: Access, run: Run, **extra: Any) -> dict[str, Any]:
    """The panel's context, or nothing for a member below operator (they see no panel)."""
    ws = run.workspace
    if not member.allows("operator"):
        return {}
    args = [ws.tenant.slug, ws.slug, run.run_id]
    links = [
        {**sharing.as_dict(link), "revoke_url": reverse("run-share-link-revoke", args=[*args, link.public_id])}
        for link in sharing.links_of_run(ws, run.run_id)[:100]
    ]
    return {
        "share_panel": True,
        "share_links": links,
        "share_create_url": reverse("run-share-links", args=args),
        "share_policy_url": reverse("run-share-policy", args=args),
        "share_can_admin": member.allows("admin"),
        "share_hides_inputs": ws.share_hides_inputs,
        "share_form": {"expires": str(DEFAULT_EXPIRY_HOURS), "include_sub_runs": False, "max_opens": ""},
        **extra,
    }


def _wants_partial(request: HttpRequest) -> bool:
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx)


def _operator_run(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> tuple[Access, Run]:
    member = member_access(request, tenant, workspace, run_id=run_id)
    if not member.allows("operator"):
        # A viewer is offered no panel and no link to it (docs/security.md § Roles): the address,
        # pasted, says why rather than showing an empty panel.
        raise PermissionDenied(
            "Share links are for operators, approvers and admins: a viewer reads the run, and one of them can share it"
        )
    assert member.run is not None
    return member, member.run


def _whole(raw: str, name: str, low: int, high: int) -> tuple[int | None, str]:
    raw = raw.strip()
    if not raw.isascii() or not raw.isdigit() or not low <= int(raw[:12]) <= high:
        return None, f"{name} must be a whole number from {low:,} to {high:,}."
    return int(raw), ""


def _panel(request: HttpRequest, member: Access, run: Run, status: int = 200, **extra: Any) -> HttpResponse:
    context = {"run": run, "workspace": run.workspace, **panel_context(member, run, **extra)}
    if _wants_partial(request):
        return render(request, "console/run/share_panel.html", context, status=status)
    return render(request, "console/share_panel_page.html", context, status=status)


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def share_links(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """The run's share links: GET, the panel as a page of its own (the address the form's answer
    has without JavaScript, so reloading or coming back to it shows the links); POST, a new link."""
    member, run = _operator_run(request, tenant, workspace, run_id)
    if request.method != "POST":
        return _panel(request, member, run)
    return _create_share_link(request, member, run)


def _create_share_link(request: HttpRequest, member: Access, run: Run) -> HttpResponse:
    expires = request.POST.get("expires_in_hours", "").strip()
    include_sub_runs = request.POST.get("include_sub_runs") == "on"
    raw_max = request.POST.get("max_opens", "").strip()
    hours, error = _whole(expires, "Expiry (hours)", 1, sharing.MAX_EXPIRY_HOURS)
    max_opens = None
    if not error and raw_max:
        max_opens, error = _whole(raw_max, "Max opens", 1, sharing.MAX_OPENS)
    if error or hours is None:
        form = {"expires": expires, "include_sub_runs": include_sub_runs, "max_opens": raw_max}
        return _panel(request, member, run, 400, share_form=form, share_error=error)
    _, token = sharing.create_link(
        workspace=run.workspace,
        run=run,
        by=member.user,
        expires_in_hours=hours,
        include_sub_runs=include_sub_runs,
        max_opens=max_opens,
    )
    return _panel(request, member, run, 201, share_new_url=request.build_absolute_uri(sharing.share_path(token)))


@login_required
@require_POST
def revoke_share_link(request: HttpRequest, tenant: str, workspace: str, run_id: str, link_id: str) -> HttpResponse:
    member, run = _operator_run(request, tenant, workspace, run_id)
    try:
        link: ShareLink = sharing.get_link([run.workspace], link_id)
    except NotFound:
        raise Http404("not found") from None
    if link.run_id != run.run_id:
        raise Http404("not found")
    sharing.revoke_link(link, by=member.user)
    if not _wants_partial(request):
        return redirect(reverse("run", args=[tenant, workspace, run_id]) + "#share-panel")
    return _panel(request, member, run)


@login_required
@require_POST
def share_policy(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    """The workspace's policy for every shared view (an admin's); posted from a run's panel."""
    member = member_access(request, tenant, workspace, run_id=run_id)
    if not member.allows("admin"):
        raise PermissionDenied("the share policy is an admin's setting")
    assert member.run is not None
    sharing.set_share_policy(
        workspace=member.workspace, hides_inputs=request.POST.get("hides_inputs") == "on", by=member.user
    )
    if not _wants_partial(request):
        return redirect(reverse("run", args=[tenant, workspace, run_id]) + "#share-panel")
    return _panel(request, member, member.run)


RUN = "w/<slug:tenant>/<slug:workspace>/runs/<str:run_id>/"

urlpatterns = [
    path("s/<str:token>/", shared_run, name="share"),
    path("s/<str:token>/evidence.json", shared_evidence, name="share-evidence"),
    path("s/<str:token>/runs/<str:run_id>/", shared_run, name="share-run"),
    path("s/<str:token>/runs/<str:run_id>/evidence.json", shared_evidence, name="share-run-evidence"),
    path("s/<str:token>/<path:rest>", shared_nothing),
    path(RUN + "share-links/", share_links, name="run-share-links"),
    path(RUN + "share-links/<str:link_id>/revoke/", revoke_share_link, name="run-share-link-revoke"),
    path(RUN + "share-policy/", share_policy, name="run-share-policy"),
]
