"""The runs list of a workspace: filters in the URL, cursor pages, one row template for page,
htmx fragment (which static/js/live.js fetches again when console/live/runs.py says a run moved)."""

from __future__ import annotations

from datetime import date
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path
from django.views.decorators.http import require_safe
from django_htmx.middleware import HtmxDetails

from ledger.models import Run, RunStatus, Workspace
from ledger.reads import attention, selectors

from ..rows import run_rows
from .filters import DateRangePageForm, page_cursor
from .guard import member_access

PAGE_SIZE = 50
FILTERS = ("q", "status", "attention", "workflow", "from", "to", "has_failures", "cost_above", "rating", "model")


# --- filters -------------------------------------------------------------------------------


def _parse_model(value: str) -> tuple[str, str] | str:
    if value == selectors.ANY_MODEL:
        return value
    provider, _, model_id = value.partition("/")
    if not provider or not model_id:
        raise ValidationError("Model must be written provider/modelId, e.g. openai/gpt-4o (or * for any model).")
    return provider, model_id


class RunFilterForm(DateRangePageForm):
    q = forms.CharField(
        required=False,
        max_length=200,
        label="Search",
        widget=forms.TextInput(attrs={"placeholder": "run id, workflow or label", "type": "search"}),
    )
    status = forms.ChoiceField(required=False, choices=[("", "any")] + [(s, s) for s in RunStatus.values])
    # What the run waits for a person to do (ledger/reads/attention.py); the statuses stay the API's.
    attention = forms.ChoiceField(
        required=False,
        label="Needs",
        choices=[("", "anything"), (attention.ANY, "any attention")]
        + [(kind, attention.LABELS[kind]) for kind in attention.KINDS],
    )
    workflow = forms.CharField(required=False, max_length=200)
    has_failures = forms.BooleanField(required=False, label="Has failures")
    cost_above = forms.DecimalField(
        required=False, min_value=0, max_digits=20, decimal_places=12, label="Cost above ($)"
    )
    rating = forms.TypedChoiceField(
        required=False,
        coerce=int,
        empty_value=None,
        label="Rating at least",
        choices=[("", "any")] + [(str(n), f"{n}★") for n in range(1, 6)],
    )
    model = forms.CharField(
        required=False, max_length=401, widget=forms.TextInput(attrs={"placeholder": "provider/modelId"})
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_fields(
            ["q", "status", "attention", "workflow", "from", "to", "model", "cost_above", "rating", "has_failures"]
        )

    def clean_model(self) -> tuple[str, str] | str | None:
        value = self.cleaned_data["model"].strip()
        return _parse_model(value) if value else None

    @property
    def filtered(self) -> bool:
        return any(self.data.get(name) for name in FILTERS)

    def selector_filters(self) -> dict[str, Any]:
        d = self.cleaned_data
        return {
            "status": d["status"] or None,
            "attention": d["attention"] or None,
            "workflow": d["workflow"].strip() or None,
            "q": d["q"].strip() or None,
            "start": d["from"],
            "end": d["to"],
            "has_failures": d["has_failures"],
            "cost_above": d["cost_above"],
            "min_rating": d["rating"],
            "model": d["model"],
        }


def _cursor(run: Run) -> str:
    return page_cursor(run.created_at, run.pk)


def _query(request: HttpRequest, **changes: str) -> str:
    params = {k: v for k, v in request.GET.items() if k in FILTERS and v}
    params.update({k: v for k, v in changes.items() if v})
    return "?" + urlencode(params) if params else ""


def runs_url(workspace: Workspace, **params: str | date) -> str:
    """The runs list of a workspace with these filters (drill-downs from the usage report)."""
    query = urlencode({k: str(v) for k, v in params.items() if v})
    return f"/w/{workspace.tenant.slug}/{workspace.slug}/" + (f"?{query}" if query else "")


# --- views ---------------------------------------------------------------------------------


@login_required
@require_safe
def home(request: HttpRequest) -> HttpResponse:
    # The member lands where something happened last, not on the first workspace by name.
    ws = selectors.newest_workspace_for(request.user)
    if ws is None:
        return render(request, "console/no_workspace.html", status=200)
    return redirect("workspace-runs", tenant=ws.tenant.slug, workspace=ws.slug)


class _HtmxRequest(HttpRequest):
    htmx: HtmxDetails  # set on every request by django_htmx's middleware


@login_required
@require_safe
def runs_list(request: _HtmxRequest, tenant: str, workspace: str) -> HttpResponse:
    ws = member_access(request, tenant, workspace).workspace
    form = RunFilterForm(request.GET)
    context: dict[str, Any] = {"workspace": ws, "form": form, "section": "runs"}
    if not form.is_valid():
        template = "console/runs/invalid.html" if request.htmx else "console/runs.html"
        context["workspaces"] = selectors.workspaces_for(request.user)
        return render(request, template, context, status=400)
    qs = selectors.search_runs(ws, **form.selector_filters())
    page, more = selectors.runs_page(qs, limit=PAGE_SIZE, after=form.cleaned_data["cursor"])
    context.update(
        {
            "rows": run_rows(ws, page),
            "next_url": _query(request, cursor=_cursor(page[-1])) if more and page else None,
            "first_page": form.cleaned_data["cursor"] is None,
            "first_url": _query(request, cursor=""),
            # New runs are pushed only where they belong for sure: the unfiltered first page.
            "live": form.cleaned_data["cursor"] is None,  # an older page stays as it is
        }
    )
    if request.htmx:
        return render(request, "console/runs/rows.html", context)
    context["workspaces"] = selectors.workspaces_for(request.user)
    return render(request, "console/runs.html", context)


urlpatterns = [
    path("", home, name="runs"),
    path("w/<slug:tenant>/<slug:workspace>/", runs_list, name="workspace-runs"),
]
