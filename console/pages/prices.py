"""A workspace's prices, for its tenant's admins: the rates its runs are priced with (the price
table the deployment ships, with the workspace's overrides laid over it), a form to override one
model's rates (or price a model the table does not know), and a button to remove an override
(ledger/tenancy/price_settings.py: checked as the fold checks them, audited
`price_overrides.changed`).

A change prices the model calls recorded from then on; costs already recorded keep their prices
until they are repriced: *Reprice this workspace's recorded costs* queues the reprice of this
workspace's runs for `ledger worker` (ledger/tenancy/repricing.py: one at a time per workspace,
audited), and the page shows where the latest stands; the operator's `ledger reprice` does the
same from the command line.

Another tenant's workspace is a 404; a member below admin gets 403. Plain forms: a change
redirects to the page with what was saved; a refusal is the page again (400) with each reason
next to its field and what was typed kept.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger.errors import LedgerError
from ledger.fold.pricing import ModelRates
from ledger.models import Workspace
from ledger.tenancy import price_settings, repricing
from ledger.tenancy.price_settings import RATES, InvalidPriceOverride

from .guard import switcher, workspace_admin

WS = "w/<slug:tenant>/<slug:workspace>/"
FIELDS = ("key", *RATES, "reason")


def _plain(rate: Any) -> str:
    """A rate as typed back: `0.15`, `2.5`, `10` (a stored override is a JSON number)."""
    if rate is None:
        return ""
    try:
        value = rate if isinstance(rate, Decimal) else Decimal(repr(rate) if isinstance(rate, float) else str(rate))
        return f"{value.normalize():f}"
    except (InvalidOperation, ValueError):  # stored before overrides were checked
        return str(rate)


def _shown(rates: ModelRates | None) -> dict[str, str] | None:
    if rates is None:
        return None
    return {"input": _plain(rates.input), "cachedInput": _plain(rates.cached_input), "output": _plain(rates.output)}


def _form(ws: Workspace, values: dict[str, str] | None = None, errors: dict[str, str] | None = None) -> dict[str, Any]:
    values = values or {}
    return {
        "url": reverse("workspace-price-set", args=[ws.tenant.slug, ws.slug]),
        "values": {name: values.get(name, "") for name in FIELDS},
        "no_cache_rate": values.get("no_cache_rate") == "1",
        "errors": errors or {},
    }


def _edit_values(ws: Workspace, key: str) -> dict[str, str]:
    """The form filled with a model's override as stored (`?model=`), to change it."""
    key = key.strip().lower()
    for row in price_settings.sheet(ws).overridden:
        if row.key == key and row.override is not None:
            values = {"key": key, **{name: _plain(row.override.get(name)) for name in RATES}}
            if "cachedInput" in row.override and row.override["cachedInput"] is None:
                values["no_cache_rate"] = "1"
            return values
    return {"key": key[:200]}


def _page(
    request: HttpRequest, ws: Workspace, *, form: dict[str, Any], status: int = 200, reprice_refused: str = ""
) -> HttpResponse:
    sheet = price_settings.sheet(ws)
    args = [ws.tenant.slug, ws.slug]
    rows = [
        {
            "key": row.key,
            "shipped": _shown(row.shipped),
            "override": {name: _plain(row.override[name]) for name in RATES if name in row.override}
            if row.override is not None
            else None,
            "drops_cache_rate": row.override is not None
            and "cachedInput" in row.override
            and row.override["cachedInput"] is None,
            "rates": _shown(row.rates),
            "edit_url": reverse("workspace-prices", args=args) + "?" + urlencode({"model": row.key}) + "#price-form",
        }
        for row in sheet.rows
    ]
    saved, removed = request.GET.get("saved", "")[:200], request.GET.get("removed", "")[:200]
    reprice = repricing.latest(ws)
    context = {
        "workspace": ws,
        "workspaces": switcher(request),
        "sheet": sheet,
        "rows": rows,
        "overridden": [row for row in rows if row["override"] is not None],
        "known_models": [row.key for row in sheet.rows if row.shipped is not None],
        "form": form,
        "changed": (saved or removed) if status == 200 else "",
        "removed": bool(removed) and status == 200,
        "remove_url": reverse("workspace-price-remove", args=args),
        "reprice": reprice,
        "reprice_open": reprice is not None and reprice.status in reprice.OPEN,
        "reprice_url": reverse("workspace-reprice", args=args),
        "reprice_refused": reprice_refused,
        "reprice_asked": request.GET.get("repricing") == "1" and status == 200,
    }
    return render(request, "console/prices.html", context, status=status)


@login_required
@require_safe
def prices_page(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, _ = workspace_admin(request, tenant, workspace)
    model = request.GET.get("model", "")
    return _page(request, ws, form=_form(ws, _edit_values(ws, model) if model else None))


def _rates(post: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The rates typed (empty: not overridden) as `set_override` takes them, and what the form
    itself refuses; each number is checked by the price table, not here."""
    rates = {name: price_settings.parse_rate(post.get(name, "")) for name in RATES if post.get(name, "").strip()}
    if post.get("no_cache_rate") == "1":
        if "cachedInput" in rates:
            return rates, {"cachedInput": "Give a cache rate or tick \u201cno cache rate\u201d, not both."}
        rates["cachedInput"] = None
    return rates, {}


@login_required
@require_POST
def set_price(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    typed = {name: request.POST.get(name, "")[:2000] for name in FIELDS}
    typed["no_cache_rate"] = request.POST.get("no_cache_rate", "")
    key = typed["key"].strip()
    rates, errors = _rates(request.POST)
    if not key:
        errors["key"] = "Name the model as provider/modelId (openai/gpt-4o)."
    if not errors:
        try:
            # The reason whole: the service refuses one over its limit (typed is cut for the page).
            reason = request.POST.get("reason", "")
            price_settings.set_override(workspace=ws, key=key, rates=rates, by=admin, reason=reason)
        except InvalidPriceOverride as exc:
            errors = dict(exc.details["problems"])
        except LedgerError as exc:  # the reason, refused by the domain's limit
            errors = {exc.details.get("field") or "entry": exc.message}
    if errors:
        return _page(request, ws, form=_form(ws, typed, errors), status=400)
    query = urlencode({"saved": key.lower()})
    return redirect(reverse("workspace-prices", args=[tenant, workspace]) + f"?{query}#prices-changed")


@login_required
@require_POST
def remove_price(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    key = request.POST.get("key", "")[:200]
    try:
        price_settings.remove_override(workspace=ws, key=key, by=admin, reason=request.POST.get("reason", ""))
    except LedgerError as exc:
        return _page(request, ws, form=_form(ws, errors={"entry": exc.message}), status=exc.status)
    query = urlencode({"removed": key.strip().lower()})
    return redirect(reverse("workspace-prices", args=[tenant, workspace]) + f"?{query}#prices-changed")


@login_required
@require_POST
def reprice(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """Queue the reprice of this workspace's recorded costs; while one is queued or running, the
    page again (409) saying so."""
    ws, admin = workspace_admin(request, tenant, workspace)
    try:
        repricing.request_reprice(workspace=ws, by=admin)
    except repricing.RepriceInProgress as exc:
        return _page(request, ws, form=_form(ws), status=exc.status, reprice_refused=exc.message)
    return redirect(reverse("workspace-prices", args=[tenant, workspace]) + "?repricing=1#reprice")


urlpatterns = [
    path(WS + "settings/prices/", prices_page, name="workspace-prices"),
    path(WS + "settings/prices/set/", set_price, name="workspace-price-set"),
    path(WS + "settings/prices/remove/", remove_price, name="workspace-price-remove"),
    path(WS + "settings/prices/reprice/", reprice, name="workspace-reprice"),
]
