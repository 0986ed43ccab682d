"""A workspace's settings, for the tenant's admins: retention, size limits and API keys
(docs/design.md §2).

- Retention: days a finished run is kept after its last event before `ledger prune` deletes it
  (empty: forever). Changing it needs a reason; the change is audited (`retention.changed`).
- Size limits: the events and bytes a run may hold and the events an API key may append per
  minute, as in force here (the operator's override, or the deployment's default), read-only: only
  the operator changes them (`ledger limits`, docs/security.md § Limits).
- API keys: made here (a name and at least one scope; the secret is shown once, on the answer to
  the form, never stored or shown again; audited `api_key.created`), listed by prefix with
  name, scopes, created, last used and revoked, never a secret; revoking one is audited
  (`api_key.revoked`). `ledger create-key` makes them on the command line too.

Another tenant's workspace is a 404; a member below admin gets 403 (as the audit log). Both forms
post with htmx and answer with their own fragment (a refused retention: 422 with the form and the
reason); without JavaScript they post and redirect, or answer 400 with the page.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_POST, require_safe

from ledger import audit, limits
from ledger.errors import LedgerError
from ledger.models import ApiKey, Workspace
from ledger.tenancy import retention
from ledger.tenancy import services as tenancy

from .errors import error_page
from .guard import switcher, wants_fragment, workspace_admin

WS = "w/<slug:tenant>/<slug:workspace>/"


def _retention_context(
    ws: Workspace, *, error: str = "", days: str | None = None, reason: str = "", saved: bool = False
) -> dict[str, Any]:
    return {
        "retention": {
            "days": days if days is not None else ("" if ws.retention_days is None else str(ws.retention_days)),
            "current": ws.retention_days,
            "reason": reason,
            "error": error,
            "saved": saved,
            "url": reverse("workspace-retention", args=[ws.tenant.slug, ws.slug]),
            "max": retention.MAX_RETENTION_DAYS,
        }
    }


def _key_row(ws: Workspace, key: ApiKey, owners: dict[int, str] | None = None) -> dict[str, Any]:
    owner = (owners if owners is not None else audit.key_owner_names([key])).get(key.pk)
    return {
        "key": key,
        "owner": owner,  # None: unowned (only an admin may approve what it requests)
        "revoke_url": reverse("workspace-key-revoke", args=[ws.tenant.slug, ws.slug, key.prefix]),
    }


def _key_rows(ws: Workspace) -> list[dict[str, Any]]:
    keys = list(tenancy.keys(workspace=ws))
    owners = audit.key_owner_names(keys)
    return [_key_row(ws, k, owners) for k in keys]


NAME_MAX = 200


def _key_form(
    ws: Workspace, *, name: str = "", scopes: list[str] | None = None, errors: dict[str, str] | None = None
) -> dict[str, Any]:
    chosen = ["read"] if scopes is None else scopes
    return {
        "url": reverse("workspace-key-create", args=[ws.tenant.slug, ws.slug]),
        "name": name,
        "scopes": [{"value": s, "checked": s in chosen} for s in ApiKey.SCOPES],
        "errors": errors or {},
        "name_max": NAME_MAX,
    }


def _page(
    request: HttpRequest,
    ws: Workspace,
    status: int = 200,
    *,
    key_form: dict[str, Any] | None = None,
    new_key: dict[str, Any] | None = None,
    **retention_state: Any,
) -> HttpResponse:
    context = {
        "workspace": ws,
        "workspaces": switcher(request),
        "keys": _key_rows(ws),
        "key_form": key_form or _key_form(ws),
        "new_key": new_key,
        "limits": limits.effective(ws),  # read-only here: only the operator sets them (`ledger limits`)
        **_retention_context(ws, **retention_state),
    }
    response = render(request, "console/settings.html", context, status=status)
    if new_key is not None:
        response["Cache-Control"] = "no-store"  # the secret is on this page, once
    return response


@login_required
@require_safe
def workspace_settings(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    return _page(request, workspace_admin(request, tenant, workspace)[0])


def _parse_days(text: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    if not (text.isascii() and text.isdigit()):
        raise retention.InvalidRetention("Retention is a whole number of days, or empty to keep runs forever.")
    return retention.validate_days(int(text))


@login_required
@require_POST
def set_retention(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    days_text = request.POST.get("days", "")[:20]
    reason = request.POST.get("reason", "").strip()
    error, saved = "", False
    try:
        saved = retention.set_retention(workspace=ws, days=_parse_days(days_text), by=admin, reason=reason)
        if not saved:
            error = "That is the retention already set; nothing changed."
    except LedgerError as exc:
        error = exc.message
    state: dict[str, Any] = {"saved": True} if saved else {"error": error, "days": days_text.strip(), "reason": reason}
    status = 200 if saved else 400
    if wants_fragment(request):
        # A refused fragment is 422, not 400: django-htmx's debug script (DEBUG on) replaces the
        # whole document with any 400 answer to htmx; static/js/settings.js swaps the 422 in place.
        return render(
            request,
            "console/settings/retention.html",
            {"workspace": ws, **_retention_context(ws, **state)},
            status=status if saved else 422,
        )
    if saved:
        return redirect(reverse("workspace-settings", args=[tenant, workspace]) + "#retention")
    return _page(request, ws, status=status, **state)


@login_required
@require_POST
def revoke_key(request: HttpRequest, tenant: str, workspace: str, prefix: str) -> HttpResponse:
    ws, admin = workspace_admin(request, tenant, workspace)
    key = tenancy.key_by_prefix(prefix, workspace=ws)
    if key is None:  # another workspace's key, or none at all: alike
        raise Http404("not found")
    try:
        tenancy.revoke_key(key, by=admin, reason=request.POST.get("reason", ""))
    except LedgerError as exc:
        return error_page(
            request,
            exc.status,
            exc.message,
            back_url=reverse("workspace-settings", args=[tenant, workspace]) + "#api-keys",
            back_label="API keys",
        )
    if wants_fragment(request):
        return render(request, "console/settings/key_row.html", {"row": _key_row(ws, key)})
    return redirect(reverse("workspace-settings", args=[tenant, workspace]) + "#api-keys")


def _sentence(message: str) -> str:
    """A domain message ("a key name cannot …") as the form's other messages read."""
    return message[:1].upper() + message[1:] + ("" if message.endswith(".") else ".")


@login_required
@require_POST
def create_key(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    """A new key: the page again with its secret shown once (not a redirect: the secret is never
    stored to be shown on a later page); refused, the form as typed with the reason by the field."""
    ws, admin = workspace_admin(request, tenant, workspace)
    name = request.POST.get("name", "")[: NAME_MAX + 1].strip()
    scopes = [s for s in request.POST.getlist("scopes") if s in ApiKey.SCOPES]
    errors = {}
    if len(name) > NAME_MAX:
        errors["name"] = f"A name has at most {NAME_MAX} characters."
    if not scopes:
        errors["scopes"] = "Tick at least one scope: what the key may do."
    if errors:
        return _page(request, ws, status=400, key_form=_key_form(ws, name=name, scopes=scopes, errors=errors))
    try:
        key, secret = tenancy.create_key(workspace=ws, scopes=scopes, name=name, by=admin)
    except LedgerError as exc:
        errors["name" if exc.details.get("field") == "name" else "scopes"] = _sentence(exc.message)
        return _page(request, ws, status=400, key_form=_key_form(ws, name=name, scopes=scopes, errors=errors))
    return _page(request, ws, status=201, new_key={"key": key, "secret": secret})


urlpatterns = [
    path(WS + "settings/", workspace_settings, name="workspace-settings"),
    path(WS + "settings/retention/", set_retention, name="workspace-retention"),
    path(WS + "settings/keys/", create_key, name="workspace-key-create"),
    path(WS + "settings/keys/<str:prefix>/revoke/", revoke_key, name="workspace-key-revoke"),
]
