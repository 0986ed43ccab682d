"""The runs list of a workspace: filters and sort in the URL, keyset pages, sub-runs nested under
their parent with the tree's cost; one row template for page and htmx fragment (which
static/js/live.js fetches again when console/live/runs.py says a run moved). The sorting and the
tree totals are ledger/reads/runlist.py's."""

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
from ledger.reads import attention, runlist, selectors

from .. import cursors
from ..rows import RunRow, nested_rows, run_rows
from .filters import NOT_THESE_FILTERS, DateRangePageForm, clean_address, list_query, page_query
from .guard import member_access, switcher

PAGE_SIZE = 50
CURSOR_KIND = "page:runs"
FILTERS = ("q", "status", "attention", "workflow", "from", "to", "has_failures", "cost_above", "rating", "model")
VIEW = ("sort", "order", "subruns")  # how the list is shown: kept in the URL with the filters
NESTED_ROWS = 200  # sub-runs shown nested on one page, in all (a tree's own page lists the rest)
NESTED_PER_RUN = 10  # and under one run
SORT_LABELS = {"started": "Started", "duration": "Duration", "cost": "Cost", "tokens": "Tokens"}


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
    workflow = forms.CharField(
        required=False,
        max_length=200,
        widget=forms.TextInput(attrs={"placeholder": "name, e.g. triage", "type": "search"}),
        help_text="Part of the workflow's name or version id.",
    )
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

    sort = forms.ChoiceField(
        required=False,
        label="Sort by",
        choices=[("", "Started")] + [(k, v) for k, v in SORT_LABELS.items() if k != "started"],
    )
    order = forms.ChoiceField(
        required=False, label="Order", choices=[("", "highest / newest first"), ("asc", "lowest / oldest first")]
    )
    subruns = forms.ChoiceField(
        required=False,
        label="Sub-runs",
        choices=[("", "nested under their parent"), ("flat", "as rows of their own")],
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_fields(
            ["q", "status", "attention", "workflow", "from", "to", "model", "cost_above", "rating", "has_failures"]
            + list(VIEW)
        )

    def clean_cursor(self) -> str:  # type: ignore[override]
        return self.cleaned_data["cursor"]  # read in clean(): what it holds depends on the sort

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        raw = data.get("cursor") or ""
        sort = self.view_sort
        data["position"] = None
        if raw:
            try:
                data["position"] = runlist.load_position(sort, self.opened_cursor(raw))
            except (ValueError, TypeError, OverflowError, ArithmeticError):
                self.add_error("cursor", NOT_THESE_FILTERS)
        return data

    @property
    def view_sort(self) -> runlist.Sort:
        d = getattr(self, "cleaned_data", {})
        return runlist.Sort(
            key=d.get("sort") or "started", descending=d.get("order") != "asc", nested=d.get("subruns") != "flat"
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
            "workflow_name": d["workflow"].strip() or None,
            "q": d["q"].strip() or None,
            "start": d["from"],
            "end": d["to"],
            "has_failures": d["has_failures"],
            "cost_above": d["cost_above"],
            "min_rating": d["rating"],
            "model": d["model"],
        }


def _cursor(sort: runlist.Sort, run: Run, ws: Workspace, query: str) -> str:
    """The `?cursor=` after this row, sealed with the list's filters and order (`query`, page_query):
    runlist checks every part of what one holds when it comes back."""
    return cursors.seal(runlist.dump_position(sort, run), kind=CURSOR_KIND, scope=ws, query=query)


def _query(request: HttpRequest, **changes: str) -> str:
    """This list's URL with these changes, its parameters in one order (filters, view, page), so
    the same view is always the same link."""
    return list_query(request.GET, FILTERS + VIEW, **changes)


def _own_spelling(request: HttpRequest) -> dict[str, str] | None:
    """`sort`/`order` as the console writes them, when the URL spells them as the API does
    (docs/api.md): `sort=-cost` or `sort=cost&order=desc` is the console's `sort=cost`, `sort=started`
    or `-started` its default (no sort), `order=desc` its default order. None when the URL is in
    the console's spelling already, or names no sort the console has (the form says why). A bare
    key keeps the console's meaning, highest first, where the API's is ascending."""
    raw, order = request.GET.get("sort", ""), request.GET.get("order", "")
    key = raw.removeprefix("-") or "started"
    if key not in SORT_LABELS or order not in ("", "asc", "desc") or (raw.startswith("-") and order == "asc"):
        return None
    own = {"sort": "" if key == "started" else key, "order": order if order == "asc" else ""}
    if own == {"sort": raw, "order": order}:
        return None
    return {**own, "cursor": request.GET.get("cursor", "")}


def _sort_columns(request: HttpRequest, sort: runlist.Sort) -> list[dict[str, str]]:
    """Per sortable column, in the table's order: the link that sorts by it (clicked again: the
    other way round) and the aria-sort state of its header."""
    columns = []
    for key in ("started", "duration", "tokens", "cost"):
        current = key == sort.key
        descending = not sort.descending if current else True
        columns.append(
            {
                "key": key,
                "label": SORT_LABELS[key],
                "url": _query(
                    request, sort="" if key == "started" else key, order="" if descending else "asc", cursor=""
                ),
                "aria": ("descending" if sort.descending else "ascending") if current else "none",
                "arrow": ("↓" if sort.descending else "↑") if current else "",
            }
        )
    return columns


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
    own = _own_spelling(request)
    if own is not None:
        # A link written for the API (`sort=-cost`, `order=desc`) opens the same view, at the
        # address the console gives it.
        return redirect(request.path + _query(request, **own))
    return clean_address(request, FILTERS + VIEW) or _list(request, ws)


def refused_batch(
    request: HttpRequest, ws: Workspace, *, errors: dict[str, str], models: str, reason: str, run_ids: list[str]
) -> HttpResponse:
    """The batch evaluation form refused (console/pages/approvals.py): the newest runs again with
    the form open, what was typed and ticked kept, and each reason beside its field (400)."""
    batch = {"open": True, "errors": errors, "models": models, "reason": reason, "picked": set(run_ids)}
    return _list(request, ws, batch=batch, status=400)


def refused_dataset(request: HttpRequest, ws: Workspace, *, error: str, name: str, run_ids: list[str]) -> HttpResponse:
    """Adding the selection to a dataset refused (console/pages/evaluations.py): the newest runs
    again with the dataset form open, its name and the ticked runs kept, and why (400)."""
    batch = {"picked": set(run_ids), "dataset": {"open": True, "error": error, "name": name}}
    return _list(request, ws, batch=batch, status=400)


def _list(
    request: HttpRequest, ws: Workspace, *, batch: dict[str, Any] | None = None, status: int = 200
) -> HttpResponse:
    htmx = bool(getattr(request, "htmx", False))
    query = page_query(request.GET, FILTERS + VIEW)
    form = RunFilterForm(request.GET, cursor_kind=CURSOR_KIND, cursor_scope=ws, cursor_query=query)
    context: dict[str, Any] = {
        "workspace": ws,
        "form": form,
        "section": "runs",
        "batch": batch or {},
        "first_url": _query(request, cursor=""),
    }
    valid = form.is_valid()
    sort = form.view_sort
    context.update({"sort": sort, "sort_columns": _sort_columns(request, sort), "sort_label": SORT_LABELS[sort.key]})
    if not valid:
        template = "console/runs/invalid.html" if htmx else "console/runs.html"
        context["workspaces"] = switcher(request)
        return render(request, template, context, status=400)
    qs = selectors.search_runs(ws, **form.selector_filters())
    position = form.cleaned_data["position"]
    page, more = runlist.page(qs, sort, limit=PAGE_SIZE, position=position)
    rows: list[RunRow] = (
        nested_rows(ws, page, limit=NESTED_ROWS, per_run=NESTED_PER_RUN) if sort.nested else run_rows(ws, page)
    )
    context.update(
        {
            "rows": rows,
            "next_url": _query(request, cursor=_cursor(sort, page[-1], ws, query)) if more and page else None,
            "first_page": position is None,
            # The first page follows the log (static/js/live.js fetches it again, with the same
            # filters and sort); an older page stays as it is.
            "live": position is None and batch is None,
        }
    )
    if htmx:
        return render(request, "console/runs/rows.html", context, status=status)
    context["workspaces"] = switcher(request)
    return render(request, "console/runs.html", context, status=status)


urlpatterns = [
    path("", home, name="runs"),
    path("w/<slug:tenant>/<slug:workspace>/", runs_list, name="workspace-runs"),
]
