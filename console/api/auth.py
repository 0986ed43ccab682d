"""Who is calling: an API key (Bearer, one workspace, scopes) or a console session (member role)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import BaseAuthentication, SessionAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from ledger import selectors
from ledger.errors import LedgerError, NotFound
from ledger.models import ApiKey, Membership, Role, Workspace
from ledger.tenancy import authenticate_key, membership_for


class ApiKeyAuthentication(BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        header = request.META.get("HTTP_AUTHORIZATION", "")
        if not header:
            return None
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationFailed("Authorization must be 'Bearer <api key>'")
        api_key = authenticate_key(key.strip())
        if api_key is None:
            raise AuthenticationFailed("unknown or revoked API key")
        return AnonymousUser(), api_key

    def authenticate_header(self, request: Request) -> str:
        return self.keyword


class CsrfSessionAuthentication(SessionAuthentication):
    """The console's session, with CSRF enforced on unsafe methods (DRF's own behaviour)."""


class InsufficientScope(LedgerError):
    code = "insufficient_scope"
    status = 403


class RoleRequired(LedgerError):
    code = "forbidden"
    status = 403


class WorkspaceRequired(LedgerError):
    code = "workspace_required"


# A session member acts with a role; these are the least roles that stand in for key scopes.
SCOPE_ROLES = {"read": Role.VIEWER, "ingest": Role.OPERATOR, "execute": Role.OPERATOR}


@dataclass(frozen=True)
class Caller:
    workspace: Workspace
    api_key: ApiKey | None = None
    membership: Membership | None = None

    @property
    def user(self) -> Any:
        return self.membership.user if self.membership else None

    def allows_role(self, role: str) -> bool:
        return self.membership is not None and self.membership.allows(role)


def _session_workspace(request: Request, run_id: str | None) -> Workspace:
    """A member names the workspace with ?workspace=TENANT/SLUG; without it, the run decides,
    or the member's only workspace does."""
    user = request.user
    path = request.query_params.get("workspace")
    if path:
        tenant, _, slug = path.partition("/")
        return selectors.workspace_for(user, tenant, slug)
    candidates = selectors.workspaces_for(user)
    if run_id is not None:
        candidates = candidates.filter(runs__run_id=run_id)
    found = list(candidates[:2])
    if not found:
        raise NotFound(f"run {run_id} not found" if run_id else "no workspace found", runId=run_id)
    if len(found) > 1:
        raise WorkspaceRequired("pass ?workspace=TENANT/WORKSPACE: more than one of your workspaces matches")
    return found[0]


def caller_for(request: Request, scope: str, *, run_id: str | None = None, role: str | None = None) -> Caller:
    """The caller and the workspace it acts in; refuses a key without `scope` or a member below
    the role that stands in for it (403). Authentication itself is checked by DRF (401)."""
    if isinstance(request.auth, ApiKey):
        if not request.auth.has_scope(scope):
            raise InsufficientScope(f"this API key lacks the '{scope}' scope", scope=scope)
        if role is not None:
            raise RoleRequired(f"this operation needs a {role} in a console session; API keys cannot do it")
        return Caller(workspace=request.auth.workspace, api_key=request.auth)
    workspace = _session_workspace(request, run_id)
    membership = membership_for(request.user, workspace.tenant)
    if membership is None:  # pragma: no cover - workspaces_for only yields member tenants
        raise NotFound("not found")
    needed = role or SCOPE_ROLES[scope]
    if not membership.allows(needed):
        raise RoleRequired(f"this operation needs the {needed} role", role=needed)
    return Caller(workspace=workspace, membership=membership)
