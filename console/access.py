"""Who may see what in the console: the member's workspace from the URL, and their role.

Every page and consumer resolves its workspace here, so another tenant's object is a 404 in one
place (DESIGN.md §2), not in each view.
"""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser, User
from django.http import Http404

from ledger import selectors
from ledger.errors import NotFound
from ledger.models import ROLE_RANK, Role, Workspace
from ledger.tenancy import membership_for

def workspace_or_404(user: User | AnonymousUser, tenant: str, workspace: str) -> Workspace:
    try:
        return selectors.workspace_for(user, tenant, workspace)
    except NotFound:
        raise Http404("not found") from None


def role_of(user: User | AnonymousUser, workspace: Workspace) -> str | None:
    membership = membership_for(user, workspace.tenant)
    return str(membership.role) if membership is not None else None


def has_role(user: User | AnonymousUser, workspace: Workspace, at_least: str) -> bool:
    role = role_of(user, workspace)
    return role is not None and ROLE_RANK[Role(role)] >= ROLE_RANK[Role(at_least)]
