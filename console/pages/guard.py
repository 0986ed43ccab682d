"""The pages' door to ledger.tenancy.access: a member's workspace (and run) from the URL, or Django's 404.

Another tenant's object and one that does not exist are the same 404 (docs/design.md §2); a member
below the role an action needs gets 403.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest

from ledger.errors import LedgerError, NotFound
from ledger.models import Workspace
from ledger.tenancy import access


def member_access(
    request: HttpRequest, tenant: str, workspace: str, *, run_id: str | None = None, role: str | None = None
) -> access.Access:
    try:
        return access.resolve(request.user, workspace=f"{tenant}/{workspace}", run_id=run_id, role=role)
    except NotFound:
        raise Http404("not found") from None
    except access.RoleRequired as exc:
        raise PermissionDenied(exc.message) from None


def workspace_or_404(request: HttpRequest, tenant: str, workspace: str) -> Workspace:
    return member_access(request, tenant, workspace).workspace


def has_role(user: Any, workspace: Workspace, role: str) -> bool:
    """Whether the member holds at least `role` in the workspace's tenant."""
    try:
        return access.within(user, workspace, role=role).allows(role)
    except LedgerError:
        return False
