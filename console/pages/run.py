"""The run page."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path

from ledger import selectors
from ledger.errors import NotFound

from ..access import workspace_or_404


@login_required
def run_detail(request: HttpRequest, tenant: str, workspace: str, run_id: str) -> HttpResponse:
    ws = workspace_or_404(request.user, tenant, workspace)
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


urlpatterns = [
    path("w/<slug:tenant>/<slug:workspace>/runs/<str:run_id>/", run_detail, name="run"),
]
