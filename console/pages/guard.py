"""The pages' door to ledger.tenancy.access: a member's workspace (and run) from the URL, or Django's 404.

Another tenant's object and one that does not exist are the same 404 (docs/design.md §2); a member
below the role an action needs gets 403.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest
from django.urls import Resolver404, resolve

from ledger.errors import LedgerError, NotFound
from ledger.models import Membership, Role, Workspace
from ledger.reads import selectors
from ledger.tenancy import access


def member_access(
    request: HttpRequest, tenant: str, workspace: str, *, run_id: str | None = None, role: str | None = None
) -> access.Access:
    try:
        if request.method in ("GET", "HEAD") and request.user.is_authenticated:
            # The member's workspaces with their memberships, one query: the named one is among
            # them (or it is none of theirs: 404), and the page's switcher lists them.
            mine = _member_workspaces(request)
            named = next(((ws, m) for ws, m in mine if ws.slug == workspace and ws.tenant.slug == tenant), None)
            found = access.member_in(request.user, named, run_id=run_id, role=role)
        else:
            found = access.resolve(request.user, workspace=f"{tenant}/{workspace}", run_id=run_id, role=role)
    except NotFound:
        raise Http404("not found") from None
    except access.RoleRequired as exc:
        raise PermissionDenied(exc.message) from None
    if found.membership is not None and request.method in ("GET", "HEAD"):
        # The navigation asks the same membership again (console_nav); a page that changes
        # memberships (a POST) lets it ask afresh.
        memberships = request.__dict__.setdefault("_memberships", {})
        memberships[found.workspace.tenant_id] = found.membership
    return found


def _member_workspaces(request: HttpRequest) -> list[tuple[Workspace, Membership]]:
    mine = request.__dict__.get("_member_workspaces")
    if mine is None:
        mine = request.__dict__["_member_workspaces"] = selectors.member_workspaces(request.user)
    return mine


def switcher(request: HttpRequest) -> Iterable[Workspace]:
    """The workspaces of the page's switcher (base.html): those the page's own check read with the
    memberships (a GET), else asked here."""
    mine = request.__dict__.get("_member_workspaces")
    if mine is not None:
        return [ws for ws, _ in mine]
    return selectors.workspaces_for(request.user)


def workspace_admin(request: HttpRequest, tenant: str, workspace: str) -> tuple[Workspace, Any]:
    """The workspace and its admin, the signed-in member (403 below admin, 404 elsewhere): the
    door of the Settings pages."""
    found = member_access(request, tenant, workspace, role=Role.ADMIN)
    return found.workspace, found.user


def wants_fragment(request: HttpRequest) -> bool:
    """An htmx request for a part of the page (not a history restore, which wants the whole)."""
    htmx = getattr(request, "htmx", None)
    return htmx is not None and bool(htmx) and not htmx.history_restore_request


def workspace_or_404(request: HttpRequest, tenant: str, workspace: str) -> Workspace:
    return member_access(request, tenant, workspace).workspace


def has_role(user: Any, workspace: Workspace, role: str) -> bool:
    """Whether the member holds at least `role` in the workspace's tenant."""
    try:
        return access.within(user, workspace, role=role).allows(role)
    except LedgerError:
        return False


# The pages a member below some role gets 403 on (their views' own checks), by URL name; every
# other page of a workspace opens for any member of its tenant.
PAGE_ROLES: dict[str, str] = {
    "run-reexecute": Role.OPERATOR,
    "run-share-links": Role.OPERATOR,
    "tenant-audit": Role.ADMIN,
    "workspace-settings": Role.ADMIN,
    "workspace-members": Role.ADMIN,
    "workspace-prices": Role.ADMIN,
}
ROLE_NOTES: dict[str, str] = {
    Role.OPERATOR: "operators and up",
    Role.APPROVER: "approvers and admins",
    Role.ADMIN: "admins only",
}


@dataclass(frozen=True)
class Reach:
    """Which console pages a signed-in member may open, to offer links only where they work (a
    page that links to pages of its own choosing: the concepts page). Two queries, then none per
    link."""

    memberships: dict[str, Membership]  # by tenant slug
    workspaces: frozenset[tuple[str, str]]

    @classmethod
    def of(cls, user: Any) -> Reach:
        return cls(
            memberships={m.tenant.slug: m for m in selectors.memberships(user)},
            workspaces=frozenset((w.tenant.slug, w.slug) for w in selectors.workspaces_for(user)),
        )

    def refusal(self, path: str) -> str | None:
        """None when the page at `path` opens for the member; else why not: the role it needs
        (`Role`), or "" when it is not theirs to see at all (another tenant's: a 404)."""
        try:
            match = resolve(urlsplit(path).path)
        except Resolver404:
            return ""
        tenant, workspace = match.kwargs.get("tenant"), match.kwargs.get("workspace")
        if tenant is None:
            return None  # no tenant's page (home, the concepts)
        membership = self.memberships.get(tenant)
        if membership is None or (workspace is not None and (tenant, workspace) not in self.workspaces):
            return ""
        needed = PAGE_ROLES.get(match.url_name or "", Role.VIEWER)
        return None if membership.allows(needed) else needed
