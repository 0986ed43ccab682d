"""Console pages. Short view functions; reads go through ledger.selectors, scoped to the member."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from ledger import selectors
from ledger.errors import NotFound


def _workspace(request: HttpRequest, tenant: str | None, workspace: str | None):
    try:
        if tenant and workspace:
            return selectors.workspace_for(request.user, tenant, workspace)
    except NotFound:
        raise Http404("not found") from None
    return selectors.workspaces_for(request.user).first()


@login_required
def runs_list(request: HttpRequest, tenant: str | None = None, workspace: str | None = None) -> HttpResponse:
    ws = _workspace(request, tenant, workspace)
    if ws is None:
        return render(request, "console/no_workspace.html", status=200)
    if tenant is None:
        return redirect("workspace-runs", tenant=ws.tenant.slug, workspace=ws.slug)
    runs = selectors.runs(ws).order_by("-created_at")[:100]
    return render(request, "console/runs.html", {
        "workspace": ws,
        "workspaces": selectors.workspaces_for(request.user),
        "runs": runs,
    })


@login_required
def run_detail(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    ws = _workspace(request, tenant, workspace)
    try:
        run = selectors.get_run(ws, run_id)
    except NotFound:
        raise Http404("not found") from None
    return render(request, "console/run.html", {
        "workspace": ws,
        "workspaces": selectors.workspaces_for(request.user),
        "run": run,
        "events": selectors.events(run, limit=500),
    })
