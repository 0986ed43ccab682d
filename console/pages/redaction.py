"""A workspace's redaction policy: the built-in rules and the workspace's extras, for every member
to read (so a "[REDACTED]" in the evidence can be explained); the extras editable by the tenant's
admins, checked and audited (ledger/tenancy/redaction_settings.py, docs/security.md).

Another tenant's workspace is a 404 (docs/design.md §2); a member below admin who posts gets 403.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import path, reverse
from django.views.decorators.http import require_http_methods

from ledger.errors import LedgerError
from ledger.log.redaction import (
    MAX_EXTRA_KEYS,
    MAX_EXTRA_PATTERNS,
    MAX_KEY_NAME_LENGTH,
    MAX_PATTERN_LENGTH,
    InvalidRule,
)
from ledger.models import Role, Workspace
from ledger.tenancy.redaction_settings import policy_of, set_extra_rules

from .guard import member_access, switcher


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


class ExtraRulesForm(forms.Form):
    keys = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        max_length=MAX_EXTRA_KEYS * (MAX_KEY_NAME_LENGTH + 2),
        label="Extra key names",
        help_text="One a line. Compared whole, lower-cased, without - and _.",
    )
    patterns = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 6, "spellcheck": "false"}),
        max_length=MAX_EXTRA_PATTERNS * (MAX_PATTERN_LENGTH + 2),
        label="Extra value patterns",
        help_text="One RE2 regular expression a line (no lookaround or backreference); each match inside a string becomes [REDACTED].",
    )
    reason = forms.CharField(required=False, label="Why (kept in the audit log)")

    def clean_keys(self) -> list[str]:
        return _lines(self.cleaned_data["keys"])

    def clean_patterns(self) -> list[str]:
        return _lines(self.cleaned_data["patterns"])


def _initial(workspace: Workspace) -> dict[str, str]:
    return {
        "keys": "\n".join(str(k) for k in workspace.redact_keys or []),
        "patterns": "\n".join(str(p) for p in workspace.redact_value_patterns or []),
    }


@login_required
@require_http_methods(["GET", "HEAD", "POST"])
def redaction_settings(request: HttpRequest, tenant: str, workspace: str) -> HttpResponse:
    access = member_access(request, tenant, workspace)
    ws = access.workspace
    is_admin = access.allows(Role.ADMIN)
    status = 200
    if request.method == "POST":
        if not is_admin:
            raise PermissionDenied("the redaction rules are changed by the tenant's admins")
        form = ExtraRulesForm(request.POST)
        if form.is_valid():
            try:
                set_extra_rules(
                    workspace=ws,
                    keys=form.cleaned_data["keys"],
                    patterns=form.cleaned_data["patterns"],
                    by=request.user,
                    reason=form.cleaned_data["reason"].strip(),
                )
            except InvalidRule as exc:
                form.add_error(None, str(exc))
            except LedgerError as exc:  # the reason, refused by the domain's limit
                form.add_error(exc.details.get("field") or None, exc.message)
            else:
                return redirect(reverse("workspace-redaction", args=[tenant, workspace]) + "?saved=1")
        status = 400
    else:
        form = ExtraRulesForm(initial=_initial(ws))
    context: dict[str, Any] = {
        "workspace": ws,
        "workspaces": switcher(request),
        "policy": policy_of(ws),
        "form": form if is_admin else None,
        "saved": request.GET.get("saved") == "1" and status == 200,
        "page_url": reverse("workspace-redaction", args=[tenant, workspace]),
    }
    return render(request, "console/redaction.html", context, status=status)


urlpatterns = [
    path("w/<slug:tenant>/<slug:workspace>/settings/redaction/", redaction_settings, name="workspace-redaction"),
]
