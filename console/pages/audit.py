"""The audit log of a tenant, for its admins: newest first, filters in the URL, cursor pages, a CSV
link; each target a link to what it names (a run, a key, a workspace, a re-execution) and the
details as words, not JSON.

Another tenant's log is a 404 (its existence is not revealed, docs/design.md §2); a member below admin
gets 403. The CSV is the API's own (`GET /api/v1/audit?format=csv`, which takes the session), so
the page and the export can never disagree about what an entry says.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, time, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlencode

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import path, reverse
from django.views.decorators.http import require_safe

from ledger import audit
from ledger.models import AuditEntry, Role, Tenant
from ledger.reads import selectors

from ..format import field_label, money, utc
from .filters import NOT_THESE_FILTERS, DateRangePageForm, page_cursor, page_query

PAGE_SIZE = 50
API_AUDIT = "/api/v1/audit"  # docs/api.md "Audit": the public path, not a route name of ours
FILTERS = ("actor", "action", "from", "to")
CURSOR_KIND = "page:audit"


class AuditFilterForm(DateRangePageForm):
    broken = NOT_THESE_FILTERS
    actor = forms.CharField(
        required=False, max_length=160, widget=forms.TextInput(attrs={"placeholder": "bob, key:0a1b…, system:expiry"})
    )
    action = forms.ChoiceField(required=False, choices=[("", "any")] + [(a, a) for a in audit.Action.values])

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.order_fields(["actor", "action", "from", "to"])

    def selector_filters(self) -> dict[str, Any]:
        d = self.cleaned_data
        day = lambda value: datetime.combine(value, time.min, tzinfo=UTC)  # noqa: E731
        return {
            "actor": d["actor"].strip() or None,
            "action": d["action"] or None,
            "start": day(d["from"]) if d["from"] else None,
            # `to` is a whole day, inclusive (as on the runs list and in the API).
            "end": day(d["to"] + timedelta(days=1)) if d["to"] else None,
            "after": d["cursor"],
            "newest_first": True,
        }


def _cursor(entry: AuditEntry, tenant: Tenant, query: str) -> str:
    return page_cursor(entry.at, entry.pk, kind=CURSOR_KIND, scope=tenant, query=query)


# A moment as the services write one into details (`datetime.isoformat()`: an offset, or Z).
MOMENT = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


def _value(value: Any, key: str = "") -> str:
    if key.endswith("Usd") and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        try:
            return money(Decimal(str(value)))
        except InvalidOperation:
            return str(value)
    if isinstance(value, str) and MOMENT.match(value):
        return utc(value.replace("Z", "+00:00"))
    if isinstance(value, list):
        return ", ".join(_value(v) for v in value) or "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} {_value(v)}" for k, v in sorted(value.items())) or "none"
    if value is None or value == "":
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _details(details: Any) -> list[tuple[str, str]]:
    """An entry's details as (label, value) lines in the console's words and formats: `newRunId`
    reads "new run id", `scopes` "ingest, read", a moment and a `…Usd` amount as every page writes
    them, nested objects as "key value; …", the JSON only where nothing else would do (the CSV
    keeps it exact)."""
    if not details:
        return []
    if not isinstance(details, dict):
        return [("", json.dumps(details, ensure_ascii=False))]
    return [(field_label(str(key)), _value(value, str(key))) for key, value in sorted(details.items())]


RUN_ID = re.compile(r"^run_[A-Za-z0-9_.:-]{1,80}$")


def _target_url(entry: AuditEntry) -> str | None:
    """Where an entry's target is shown: the run (`run_…`, `run:run_…`, `run_…/call`), the key in
    the workspace's settings, the workspace, the re-execution's divergence page; None for targets
    without a page (a user, a share link, an export)."""
    target, ws = entry.target, entry.workspace
    if target.startswith("workspace:"):
        tenant_slug, _, slug = target.removeprefix("workspace:").partition("/")
        return reverse("workspace-runs", args=[tenant_slug, slug]) if tenant_slug and slug else None
    if ws is None:
        return None
    where = [ws.tenant.slug, ws.slug]
    if target.startswith("key:"):
        return reverse("workspace-settings", args=where) + f"#key-{target.removeprefix('key:')}"
    run_id = target.removeprefix("run:").partition("/")[0]
    if RUN_ID.match(run_id):
        return reverse("run", args=[*where, run_id])
    if target.startswith("rx_"):
        return reverse("reexecution-divergence", args=[*where, target])
    return None


def _admin_tenant(request: HttpRequest, tenant: str) -> Tenant:
    membership = next(iter(selectors.memberships(request.user, tenant_slug=tenant)), None)
    if membership is None:
        raise Http404("not found")
    if not membership.allows(Role.ADMIN):
        raise PermissionDenied("the audit log is for the tenant's admins")
    return membership.tenant


def _query(request: HttpRequest, **changes: str) -> str:
    params = {k: v for k, v in request.GET.items() if k in FILTERS and v}
    params.update({k: v for k, v in changes.items() if v})
    return urlencode(params)


@login_required
@require_safe
def audit_log(request: HttpRequest, tenant: str) -> HttpResponse:
    found = _admin_tenant(request, tenant)
    query = page_query(request.GET, FILTERS)
    form = AuditFilterForm(request.GET, cursor_kind=CURSOR_KIND, cursor_scope=found, cursor_query=query)
    workspaces = selectors.workspaces_for(request.user)
    context: dict[str, Any] = {
        "tenant": found,
        "form": form,
        "workspaces": workspaces,
        "workspace": workspaces.filter(tenant=found).first(),
        "page_url": reverse("tenant-audit", args=[tenant]),
        "first_query": _query(request),
    }
    if not form.is_valid():
        return render(request, "console/audit.html", context, status=400)
    rows = list(audit.entries(tenant=found, **form.selector_filters())[: PAGE_SIZE + 1])
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    csv_query = urlencode(
        {"format": "csv", "tenant": tenant, **{k: v for k, v in request.GET.items() if k in FILTERS and v}}
    )
    context.update(
        {
            "entries": [{"entry": e, "details": _details(e.details), "target_url": _target_url(e)} for e in rows],
            "next_query": _query(request, cursor=_cursor(rows[-1], found, query)) if more else None,
            "first_query": _query(request) if form.cleaned_data["cursor"] else None,
            "csv_url": f"{API_AUDIT}?{csv_query}",
        }
    )
    return render(request, "console/audit.html", context)


urlpatterns = [
    path("t/<slug:tenant>/audit/", audit_log, name="tenant-audit"),
]
