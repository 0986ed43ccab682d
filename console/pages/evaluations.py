"""The Evaluations pages of a workspace (docs/evaluations.md): datasets, evaluation policies and
evaluations with their reports.

- `evaluations/`: the evaluations (a fragment the page polls while one is unfinished, so an
  evaluation started from the command line appears with its verdict), the datasets, the
  policies, and the approver's form for a new policy;
- `evaluations/<id>/`: one evaluation: verdict, aggregates, the distribution of scores, and per
  run the outcome, scores before/after, deltas and a link to its divergence;
- `datasets/<name>/`: a dataset's version and its runs; on the latest version an operator edits a
  member's expected output (`datasets/<name>/expected/`) and removes the ticked runs
  (`datasets/<name>/remove/`), each the next frozen version; `datasets/add/`: the runs list's
  selection added to a dataset (its submit button in the runs list's selection form).
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger import clock, limits
from ledger.errors import LedgerError, NotFound
from ledger.evaluation import budget, datasets, evaluations, policies
from ledger.evaluation.errors import EvaluationForbidden
from ledger.models import Evaluation, EvaluationPolicy, Workspace

from .. import cursors
from ..format import money
from .errors import error_page
from .filters import BROKEN, page_cursor
from .guard import has_role, switcher, workspace_or_404
from .reexecution import member
from .runs import refused_dataset

UNFINISHED = (Evaluation.Status.PENDING_APPROVAL, Evaluation.Status.RUNNING)
BINS = 10


EVALUATIONS_PAGE = 50
CURSOR_KIND = "evaluations"  # the kind of the list's sealed `?cursor=` (scope: the workspace)


def _rows(ws: Workspace, found_list: list[Evaluation]) -> list[dict[str, Any]]:
    rows = []
    for found in found_list:
        aggregates = (found.report or {}).get("aggregates") or {}
        rows.append(
            {
                "e": found,
                "url": reverse("evaluation", args=[ws.tenant.slug, ws.slug, found.public_id]),
                "pass_rate": aggregates.get("passRate"),
                "changed": aggregates.get("changed"),
                "spend": aggregates.get("spendUsd"),
                "unpriced_calls": aggregates.get("unpricedCalls"),  # counted with the spend, in the report
                "models": f"{found.change.get('kind')}: {evaluations.describe_change(found.change)}",
            }
        )
    return rows


def _list_context(request: HttpRequest, ws: Workspace) -> dict[str, Any]:
    """The newest EVALUATIONS_PAGE evaluations, or those older than the sealed `?cursor=` (the last
    row of the page before): a broken cursor is the page with no rows, an alert and the first
    page's link, a 400 (docs/operations.md § Page links)."""
    raw, after, broken = request.GET.get("cursor", ""), None, False
    if raw:
        try:
            after = limits.keyset_position(cursors.unseal(raw, kind=CURSOR_KIND, scope=ws))
        except (ValueError, TypeError, OverflowError):
            broken = True
    found = [] if broken else evaluations.evaluations(ws, limit=EVALUATIONS_PAGE + 1, after=after)
    shown = found[:EVALUATIONS_PAGE]
    rows = _rows(ws, shown)
    here = reverse("evaluations", args=[ws.tenant.slug, ws.slug])
    page = "?" + urlencode({"cursor": raw}) if after is not None else ""
    older = ""
    if len(found) > EVALUATIONS_PAGE:
        last = shown[-1]
        older = here + "?" + urlencode({"cursor": page_cursor(last.created_at, last.pk, kind=CURSOR_KIND, scope=ws)})
    return {
        "workspace": ws,
        "rows": rows,
        "live": any(r["e"].status in UNFINISHED for r in rows),
        "fragment_url": reverse("evaluations-rows", args=[ws.tenant.slug, ws.slug]) + page,
        "older_url": older,
        "newest_url": here if after is not None or broken else "",
        "broken_page": BROKEN if broken else "",
    }


# The policy form as it first shows; a refused one comes back as it was typed.
POLICY_FORM = {
    "dataset": "",
    "change_kinds": ["model"],
    "scorers": "exact, json_fields, regex, model_graded",
    "ceiling_per_evaluation": "1.00",
    "ceiling_per_day": "10.00",
    "ttl_hours": "168",
    "note": "",
}
# The service's field names, as the form's labels say them (a refusal's message is read on the page).
POLICY_FIELDS = {
    "changeKinds": ("change_kinds", "the kinds of change"),
    "scorers": ("scorers", "the scorers"),
    "ceilingPerEvaluationUsd": ("ceiling_per_evaluation", "the ceiling per evaluation"),
    "ceilingPerDayUsd": ("ceiling_per_day", "the ceiling per day"),
    "ttlHours": ("ttl_hours", "the expiry in hours"),
    "note": ("note", "the note"),
}


def _policy_state(policy: EvaluationPolicy) -> str:
    """Why a policy covers nothing, in the list: revoked, expired, or its stored terms no longer
    hash to the digest it was approved with (changed behind the service's back)."""
    if policies.is_active(policy, clock.now()):
        return "active"
    if policy.revoked_at is not None:
        return "revoked"
    return "expired" if policy.expires_at <= clock.now() else "altered"


def _list_page(
    request: HttpRequest, ws: Workspace, *, policy_form: dict[str, Any] | None = None, status: int = 200
) -> HttpResponse:
    context = _list_context(request, ws)
    context.update(
        {
            "datasets": [
                {**datasets.dataset_json(d), "url": reverse("dataset", args=[ws.tenant.slug, ws.slug, d.name])}
                for d in datasets.datasets(ws)
            ],
            "policies": [{**policies.policy_json(p), "state": _policy_state(p)} for p in policies.policies(ws)],
            "can_approve": has_role(request.user, ws, "approver"),
            "change_kinds": policies.CHANGE_KINDS,
            "policy_form": policy_form or POLICY_FORM,
            "workspaces": switcher(request),
            "here": "evaluations",
        }
    )
    return render(request, "console/evaluations/list.html", context, status=400 if context["broken_page"] else status)


@login_required
@require_safe
def evaluation_list(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws = workspace_or_404(request, tenant, workspace)
    return _list_page(request, ws)


@login_required
@require_safe
def evaluation_rows(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """The evaluations table alone: what the list page polls while one is unfinished."""
    ws = workspace_or_404(request, tenant, workspace)
    context = _list_context(request, ws)
    return render(request, "console/evaluations/rows.html", context, status=400 if context["broken_page"] else 200)


def _bins(values: list[float]) -> list[dict[str, Any]]:
    counts = [0] * BINS
    for value in values:
        counts[min(BINS - 1, int(value * BINS))] += 1
    top = max(counts) or 1
    return [
        {
            "low": i / BINS,
            "high": (i + 1) / BINS,
            "count": c,
            "x": i * 30,
            "height": round(80 * c / top),
            "y": 90 - round(80 * c / top),
        }
        for i, c in enumerate(counts)
    ]


def _detail_context(request: HttpRequest, ws: Workspace, found: Evaluation) -> dict[str, Any]:
    report = found.report or {}
    runs = []
    for row in report.get("runs", []):
        runs.append(
            {
                # A run that did not run has no tokens nor duration: dashes, not a failed page.
                "tokens": {"before": None, "after": None},
                "durationMs": {"before": None, "after": None},
                **row,
                "run_url": reverse("run", args=[ws.tenant.slug, ws.slug, row["runId"]]),
                "divergence_url": reverse("reexecution-divergence", args=[ws.tenant.slug, ws.slug, row["requestId"]])
                if row.get("newRunId") and row["outcome"] != "not_run"
                else None,
                "cost_before": money(Decimal(row["costUsd"]["before"]))
                if row.get("costUsd", {}).get("before") is not None
                else "n/a",
                "cost_after": money(Decimal(row["costUsd"]["after"]))
                if row.get("costUsd", {}).get("after") is not None
                else "n/a",
            }
        )
    aggregates = report.get("aggregates") or {}
    # Beside the spend, counted when it was; a report written before the count was kept in it: now.
    unpriced = aggregates.get("unpricedCalls")
    if unpriced is None and aggregates:
        unpriced = budget.unpriced_calls(found)
    after = [s["after"]["value"] for r in report.get("runs", []) for s in r.get("scores", {}).values()]
    before = [s["before"]["value"] for r in report.get("runs", []) for s in r.get("scores", {}).values() if s["before"]]
    return {
        "workspace": ws,
        "e": found,
        "change": evaluations.describe_change(found.change),
        "report": report,
        "aggregates": aggregates,
        "unpriced_calls": unpriced,
        "runs": runs,
        "bins_after": _bins(after),
        "bins_before": _bins(before),
        "live": found.status in UNFINISHED,
        "fragment_url": reverse("evaluation-live", args=[ws.tenant.slug, ws.slug, found.public_id]),
        "batch_url": reverse("batch", args=[ws.tenant.slug, ws.slug, found.batch_id]),
        "approvals_url": reverse("approvals", args=[ws.tenant.slug, ws.slug]),
        "junit_url": f"/api/v1/evaluations/{found.public_id}/junit?workspace={ws.tenant.slug}/{ws.slug}",
        "dataset_url": reverse("dataset", args=[ws.tenant.slug, ws.slug, found.dataset_version.dataset.name]),
    }


def _evaluation_or_404(
    request: HttpRequest, tenant: str, workspace: str, evaluation_id: str
) -> tuple[Workspace, Evaluation]:
    ws = workspace_or_404(request, tenant, workspace)
    try:
        return ws, evaluations.get_evaluation(ws, evaluation_id)
    except NotFound:
        raise Http404("not found") from None


@login_required
@require_safe
def evaluation_detail(request: HttpRequest, tenant: str, workspace: str, evaluation_id: str) -> HttpResponse:
    ws, found = _evaluation_or_404(request, tenant, workspace, evaluation_id)
    context = _detail_context(request, ws, found)
    context.update({"workspaces": switcher(request), "here": "evaluations"})
    return render(request, "console/evaluations/detail.html", context)


@login_required
@require_safe
def evaluation_live(request: HttpRequest, tenant: str, workspace: str, evaluation_id: str) -> HttpResponse:
    ws, found = _evaluation_or_404(request, tenant, workspace, evaluation_id)
    return render(request, "console/evaluations/report.html", _detail_context(request, ws, found))


def _dataset_page(
    request: HttpRequest,
    ws: Workspace,
    name: str,
    *,
    number: int | None = None,
    status: int = 200,
    error: str = "",
    typed: dict[str, Any] | None = None,
    held: int = 0,
) -> HttpResponse:
    """The dataset's version (the latest unless `number`); with an error, the form that was
    refused keeps what was typed in it (`typed`: {run, expected} or {removed: [...]}); `held`, the
    number of runs an add named that the dataset already held."""
    try:
        found = datasets.get_dataset(ws, name)
        version = datasets.get_version(found, number)
    except NotFound:
        raise Http404("not found") from None
    latest = datasets.latest(found)
    editable = has_role(request.user, ws, "operator") and latest is not None and latest.pk == version.pk
    typed = typed or {}
    members = []
    for m in version.members:
        own = typed.get("run") == m["runId"]
        members.append(
            {
                **m,
                "url": reverse("run", args=[ws.tenant.slug, ws.slug, m["runId"]]),
                "expected_preview": json.dumps(m.get("expected"), ensure_ascii=False),
                "expected_json": typed["expected"]
                if own
                else json.dumps(m.get("expected"), indent=2, ensure_ascii=False),
                "editing": own,
                "removing": m["runId"] in typed.get("removed", ()),
            }
        )
    return render(
        request,
        "console/evaluations/dataset.html",
        {
            "workspace": ws,
            "version": version,
            "members": members,
            "versions": list(range(found.versions.count(), 0, -1)),
            "editable": editable,
            "error": error,
            "held": held,
            "workspaces": switcher(request),
            "here": "evaluations",
        },
        status=status,
    )


@login_required
@require_safe
def dataset_detail(request: HttpRequest, tenant: str, workspace: str, name: str) -> HttpResponse:
    ws = workspace_or_404(request, tenant, workspace)
    raw = request.GET.get("version", "")
    if raw and not (raw.isascii() and raw.isdigit()):
        message = f"version must be a version number of the dataset, got {raw[:40]!r}"
        return error_page(request, 400, message, back_url=request.path, back_label="The dataset's latest version")
    held = request.GET.get("held", "")
    # ?held=N: the runs list's "add" named only runs the dataset already held (no version was made)
    held_count = int(held) if held.isascii() and held.isdigit() and not raw else 0
    return _dataset_page(request, ws, name, number=int(raw) if raw else None, held=held_count)


def _dataset_change(request: HttpRequest, ws: Workspace, name: str) -> None:
    """Refuse before the form is read: another tenant's dataset is 404, a viewer 403."""
    try:
        datasets.get_dataset(ws, name)
    except NotFound:
        raise Http404("not found") from None
    if not has_role(request.user, ws, "operator"):
        raise PermissionDenied("changing a dataset needs the operator role")


@login_required
@require_POST
def dataset_expected(request: HttpRequest, tenant: str, workspace: str, name: str) -> HttpResponse:
    """A member's expected output, typed as JSON: the dataset's next version (audited)."""
    ws = workspace_or_404(request, tenant, workspace)
    _dataset_change(request, ws, name)
    run_id, text = request.POST.get("run", ""), request.POST.get("expected", "")
    typed = {"run": run_id, "expected": text}
    try:
        expected = json.loads(text)
    except ValueError as exc:
        return _dataset_page(
            request, ws, name, status=400, error=f"The expected output of {run_id} is not JSON: {exc}", typed=typed
        )
    try:
        datasets.set_expected(workspace=ws, name=name, run_id=run_id, expected=expected, by=member(request))
    except EvaluationForbidden as exc:
        raise PermissionDenied(exc.message) from None
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        return _dataset_page(request, ws, name, status=400, error=exc.message, typed=typed)
    return redirect("dataset", tenant=tenant, workspace=workspace, name=name)


@login_required
@require_POST
def dataset_remove(request: HttpRequest, tenant: str, workspace: str, name: str) -> HttpResponse:
    """The ticked runs removed from the dataset: its next version (audited)."""
    ws = workspace_or_404(request, tenant, workspace)
    _dataset_change(request, ws, name)
    run_ids = list(dict.fromkeys(r for r in request.POST.getlist("run") if r))
    if not run_ids:
        return _dataset_page(request, ws, name, status=400, error="Tick the runs to remove.")
    try:
        datasets.remove_runs(workspace=ws, name=name, run_ids=run_ids, by=member(request))
    except EvaluationForbidden as exc:
        raise PermissionDenied(exc.message) from None
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        return _dataset_page(request, ws, name, status=400, error=exc.message, typed={"removed": run_ids})
    return redirect("dataset", tenant=tenant, workspace=workspace, name=name)


@login_required
@require_POST
def dataset_add(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """The runs list's selection added to the named dataset (made on first use)."""
    ws = workspace_or_404(request, tenant, workspace)
    if not has_role(request.user, ws, "operator"):
        raise PermissionDenied("changing a dataset needs the operator role")
    run_ids = list(dict.fromkeys(r for r in request.POST.getlist("run") if r))
    name = request.POST.get("dataset", "").strip()
    if not run_ids:
        return refused_dataset(
            request, ws, error="tick the runs to add (the boxes in the list below)", name=name, run_ids=run_ids
        )
    try:
        added = datasets.add_runs(workspace=ws, name=name, run_ids=run_ids, by=member(request))
    except EvaluationForbidden as exc:
        raise PermissionDenied(exc.message) from None
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        return refused_dataset(request, ws, error=exc.message, name=name, run_ids=run_ids)
    page = reverse("dataset", args=[tenant, workspace, name])
    return redirect(page if added.made else f"{page}?held={len(run_ids)}")


@login_required
@require_POST
def policy_approve(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws = workspace_or_404(request, tenant, workspace)
    if not has_role(request.user, ws, "approver"):
        raise PermissionDenied("approving an evaluation policy needs the approver role")
    typed: dict[str, Any] = {name: request.POST.get(name, "") for name in POLICY_FORM if name != "change_kinds"}
    typed["change_kinds"] = request.POST.getlist("change_kinds")

    def refused(message: str, field: str) -> HttpResponse:
        # The Evaluations page again with the form open as it was typed, the reason beside it.
        return _list_page(request, ws, policy_form={**typed, "error": message, "invalid": field}, status=400)

    try:
        ttl = float(typed["ttl_hours"])
    except ValueError:
        return refused("give the policy's expiry in hours (a number, e.g. 168)", "ttl_hours")
    try:
        policies.approve_policy(
            workspace=ws,
            dataset=typed["dataset"],
            change_kinds=typed["change_kinds"],
            scorers=[s.strip() for s in typed["scorers"].split(",") if s.strip()],
            ceiling_per_evaluation_usd=typed["ceiling_per_evaluation"],
            ceiling_per_day_usd=typed["ceiling_per_day"],
            ttl_hours=ttl,
            note=typed["note"],
            by=member(request),
        )
    except EvaluationForbidden as exc:
        raise PermissionDenied(exc.message) from None
    except NotFound as exc:
        return refused(exc.message, "dataset")
    except LedgerError as exc:
        if exc.status >= 500:
            raise
        field = POLICY_FIELDS.get(str(exc.details.get("field", "")), ("", ""))[0]
        message = exc.message
        for name, (_, words) in POLICY_FIELDS.items():
            message = message.replace(name, words)
        return refused(message, field)
    return redirect("evaluations", tenant=tenant, workspace=workspace)


@login_required
@require_POST
def policy_revoke(request: HttpRequest, tenant: str, workspace: str, policy_id: str) -> HttpResponse:
    ws = workspace_or_404(request, tenant, workspace)
    if not has_role(request.user, ws, "approver"):
        raise PermissionDenied("revoking an evaluation policy needs the approver role")
    try:
        policies.revoke_policy(workspace=ws, public_id=policy_id, by=member(request), note=request.POST.get("note", ""))
    except NotFound:
        raise Http404("not found") from None
    return redirect("evaluations", tenant=tenant, workspace=workspace)


WS = "w/<slug:tenant>/<slug:workspace>/"

urlpatterns = [
    path(WS + "evaluations/", evaluation_list, name="evaluations"),
    path(WS + "evaluations/rows/", evaluation_rows, name="evaluations-rows"),
    path(WS + "evaluations/policies/", policy_approve, name="evaluation-policy-approve"),
    path(WS + "evaluations/policies/<str:policy_id>/revoke/", policy_revoke, name="evaluation-policy-revoke"),
    path(WS + "evaluations/<str:evaluation_id>/", evaluation_detail, name="evaluation"),
    path(WS + "evaluations/<str:evaluation_id>/live/", evaluation_live, name="evaluation-live"),
    path(WS + "datasets/add/", dataset_add, name="dataset-add"),
    path(WS + "datasets/<str:name>/", dataset_detail, name="dataset"),
    path(WS + "datasets/<str:name>/expected/", dataset_expected, name="dataset-expected"),
    path(WS + "datasets/<str:name>/remove/", dataset_remove, name="dataset-remove"),
]
