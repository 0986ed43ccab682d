"""The runs list of a workspace."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path

from ledger import selectors

from ..access import workspace_or_404


@login_required
def home(request: HttpRequest) -> HttpResponse:
    ws = selectors.workspaces_for(request.user).first()
    if ws is None:
        return render(request, "console/no_workspace.html", status=200)
    return redirect("workspace-runs", tenant=ws.tenant.slug, workspace=ws.slug)


@login_required
def runs_list(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws = workspace_or_404(request.user, tenant, workspace)
    runs = selectors.runs(ws).order_by("-created_at")[:100]
    return render(request, "console/runs.html", {
        "workspace": ws,
        "workspaces": selectors.workspaces_for(request.user),
        "runs": runs,
    })


urlpatterns = [
    path("", home, name="runs"),
    path("w/<slug:tenant>/<slug:workspace>/", runs_list, name="workspace-runs"),
]
