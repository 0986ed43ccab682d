"""Who may see what: one answer for every transport (API, SSE, pages, WebSocket, CLI).

`resolve(principal, workspace=…, run_id=…, scope=…, role=…)` turns a principal — a session user,
an API key, or `OPERATOR` (the trusted command line) — plus a workspace path `TENANT/WORKSPACE`
and/or a run id into an `Access` (workspace, run, role, key, membership), or raises the error the
contract names (docs/api.md, docs/design.md §2):

- an object outside what the principal may see is `NotFound` (404), never 403: another tenant's
  run and a run never written answer alike, whatever the operation's scope or role (the object
  is looked up first: `lookup_workspaces` then `within` for objects found by their own id);
- a member who names no workspace gets the one the run id picks, or their only workspace; when
  two match, `WorkspaceRequired` (400 `workspace_required`);
- an API key acts in its own workspace, and naming any other is `NotFound`; without the scope
  the operation needs, `InsufficientScope` (403); a member below the role that stands in for that
  scope, or for the role the operation names, `RoleRequired` (403). Operations that name a role
  are for humans in a session: a key is refused them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from django.contrib.auth.models import AnonymousUser, User

from ..errors import LedgerError, NotFound
from ..models import ApiKey, Membership, Role, Run, Tenant, Workspace
from ..reads import selectors


class InsufficientScope(LedgerError):
    code = "insufficient_scope"
    status = 403


class RoleRequired(LedgerError):
    code = "forbidden"
    status = 403


class WorkspaceRequired(LedgerError):
    code = "workspace_required"


class _Operator:
    """The command line: whoever can run `manage.py` already holds the database."""

    def __repr__(self) -> str:
        return "OPERATOR"


OPERATOR: Final = _Operator()

Member = User | AnonymousUser  # a session's user, maybe not signed in
Principal = Member | ApiKey | _Operator

# A session member acts with a role; these are the least roles that stand in for key scopes.
SCOPE_ROLES = {"read": Role.VIEWER, "ingest": Role.OPERATOR, "execute": Role.OPERATOR}


@dataclass(frozen=True)
class Access:
    workspace: Workspace
    run: Run | None = None
    role: str | None = None  # the member's role; None for an API key or the command line
    api_key: ApiKey | None = None
    membership: Membership | None = None

    @property
    def user(self) -> Any:
        return self.membership.user if self.membership else None

    def allows(self, role: str) -> bool:
        """Whether a member of at least `role` acts here (keys never hold roles)."""
        return self.membership is not None and self.membership.allows(role)


def split_workspace_path(path: str) -> tuple[str, str] | None:
    """`TENANT/WORKSPACE` -> (tenant, workspace), or None when it is not of that form."""
    tenant, sep, workspace = path.partition("/")
    return (tenant, workspace) if sep and tenant and workspace and "/" not in workspace else None


def workspace_by_path(path: str) -> Workspace:
    """The command line's workspace `TENANT/WORKSPACE` (any tenant: the operator sees all)."""
    parts = split_workspace_path(path)
    if parts is None:
        raise LedgerError(f"workspace must be given as TENANT/WORKSPACE, got {path!r}")
    ws = selectors.workspace_named(*parts)
    if ws is None:
        raise NotFound(f"workspace {path} not found")
    return ws


def _visible_workspace(principal: Member | _Operator, path: str) -> Workspace:
    if isinstance(principal, _Operator):
        return workspace_by_path(path)
    parts = split_workspace_path(path)
    ws = selectors.workspaces_for(principal).filter(tenant__slug=parts[0], slug=parts[1]).first() if parts else None
    if ws is None:
        raise NotFound(f"workspace {path} not found")
    return ws


def _deciding_workspace(principal: Member | _Operator, run_id: str | None) -> Workspace:
    """No workspace named: the one holding the run, or the member's only one."""
    candidates = selectors.all_workspaces() if isinstance(principal, _Operator) else selectors.workspaces_for(principal)
    if run_id is not None:
        candidates = candidates.filter(runs__run_id=run_id)
    found = list(candidates[:2])
    if not found:
        raise NotFound(f"run {run_id} not found" if run_id else "no workspace found", runId=run_id)
    if len(found) > 1:
        what = f"run id {run_id} exists in" if run_id else "you are a member of"
        raise WorkspaceRequired(
            f"{what} several workspaces; name one as TENANT/WORKSPACE "
            "(?workspace= in the API, --workspace on the command line)"
        )
    return found[0]


def resolve(
    principal: Principal,
    *,
    workspace: str | None = None,
    run_id: str | None = None,
    scope: str = "read",
    role: str | None = None,
) -> Access:
    """The workspace (and run, when `run_id` is given) the principal acts on, and as whom."""
    if isinstance(principal, ApiKey):
        # The run first: another workspace's is 404 whatever the key may do, as for a member.
        found = _with_run(Access(workspace=_key_workspace(principal, workspace), api_key=principal), run_id)
        if not principal.has_scope(scope):
            raise InsufficientScope(f"this API key lacks the '{scope}' scope", scope=scope)
        if role is not None:
            article = "an" if role[0] in "aeiou" else "a"
            raise RoleRequired(f"this operation needs {article} {role} in a console session; API keys cannot do it")
        return found
    if not isinstance(principal, _Operator) and not principal.is_authenticated:
        raise NotFound("not found")
    if workspace and not isinstance(principal, _Operator):
        parts = split_workspace_path(workspace)
        named = selectors.member_workspace(principal, *parts) if parts else None
        if named is None:
            raise NotFound(f"workspace {workspace} not found")
        return _with_run(_as_member(principal, named[0], scope=scope, role=role, membership=named[1]), run_id)
    ws = _visible_workspace(principal, workspace) if workspace else _deciding_workspace(principal, run_id)
    if isinstance(principal, _Operator):
        return _with_run(Access(workspace=ws), run_id)
    return _with_run(_as_member(principal, ws, scope=scope, role=role), run_id)


def member_in(
    principal: Member, found: tuple[Workspace, Membership] | None, *, run_id: str | None = None, role: str | None = None
) -> Access:
    """`resolve(principal, workspace=…, run_id=…, role=…)` for a member, given the named workspace
    and their membership of its tenant as the caller read them (`selectors.member_workspaces`, which
    the console's pages read once for their workspace switcher too); None: no such workspace of
    theirs. The same NotFound and RoleRequired as `resolve`."""
    if found is None or not principal.is_authenticated:
        raise NotFound("not found")
    ws, membership = found
    if membership.user_id != principal.pk or membership.tenant_id != ws.tenant_id:
        raise NotFound("not found")
    return _with_run(_as_member(principal, ws, scope="read", role=role, membership=membership), run_id)


def _key_workspace(key: ApiKey, workspace: str | None) -> Workspace:
    """A key's own workspace; naming any other is NotFound, as one a member cannot see is."""
    if workspace is not None and split_workspace_path(workspace) != (key.workspace.tenant.slug, key.workspace.slug):
        raise NotFound(f"workspace {workspace} not found")
    return key.workspace


def _as_member(
    principal: Member, ws: Workspace, *, scope: str, role: str | None, membership: Membership | None = None
) -> Access:
    """The member's access to a workspace of a tenant they belong to; NotFound when they do not.
    `membership`: theirs of the workspace's tenant, when the caller read it with the workspace."""
    if membership is None:
        membership = selectors.membership(principal, ws.tenant_id) if principal.is_authenticated else None
    if membership is None:
        raise NotFound("not found")
    needed = role or SCOPE_ROLES[scope]
    if not membership.allows(needed):
        raise RoleRequired(f"this operation needs the {needed} role", role=needed)
    return Access(workspace=ws, role=str(membership.role), membership=membership)


def _with_run(access: Access, run_id: str | None) -> Access:
    if run_id is None:
        return access
    run = selectors.get_run(access.workspace, run_id)
    run.workspace = access.workspace  # already loaded with its tenant
    return Access(
        workspace=access.workspace, run=run, role=access.role, api_key=access.api_key, membership=access.membership
    )


def visible_workspaces(principal: Principal, *, workspace: str | None = None, scope: str = "read") -> list[Workspace]:
    """Where a lookup by content (an artifact's hash) may look: the named workspace, a key's own,
    or every workspace of the member's tenants."""
    if workspace or isinstance(principal, ApiKey):
        return [resolve(principal, workspace=workspace, scope=scope).workspace]
    if isinstance(principal, _Operator):
        return list(selectors.all_workspaces())
    return list(selectors.workspaces_for(principal))


def lookup_workspaces(principal: Principal, *, workspace: str | None = None) -> list[Workspace]:
    """Where an object named by its id (a re-execution request, a share link) is looked up before
    the caller's scope or role is asked, which `within` then does: so another tenant's object is
    404 whoever asks, and only a caller who may see it hears 403. The named workspace (404 when
    the caller cannot see it), a key's own, or every workspace of the member's tenants."""
    if isinstance(principal, ApiKey):
        return [_key_workspace(principal, workspace)]
    if isinstance(principal, _Operator):
        return [workspace_by_path(workspace)] if workspace else list(selectors.all_workspaces())
    if not principal.is_authenticated:
        raise NotFound("not found")
    if workspace:
        return [_visible_workspace(principal, workspace)]
    return list(selectors.workspaces_for(principal))


def within(principal: Principal, workspace: Workspace, *, scope: str = "read", role: str | None = None) -> Access:
    """`resolve` for a workspace already found by something the principal may see (an object
    looked up across `visible_workspaces`): the same scope, role and tenant checks."""
    if isinstance(principal, _Operator):
        return Access(workspace=workspace)
    if isinstance(principal, ApiKey):
        if principal.workspace.pk != workspace.pk:
            raise NotFound("not found")
        return resolve(principal, scope=scope, role=role)
    return _as_member(principal, workspace, scope=scope, role=role)


def tenant_admin(principal: Principal, *, tenant: str | None = None, what: str = "usage across a tenant") -> Tenant:
    """The tenant an admin member asks about across all its workspaces (`tenant` picks one when
    they belong to several): `what` names the question in refusals. Keys are refused: they see
    their own workspace only."""
    if isinstance(principal, ApiKey | _Operator):
        raise RoleRequired(f"{what} needs an admin in a console session; API keys see their own workspace only")
    found = selectors.memberships(principal, tenant_slug=tenant)[:2]
    if not found:
        raise NotFound("tenant not found", tenant=tenant or None)
    if len(found) > 1:
        raise WorkspaceRequired("pass ?tenant=TENANT: you are a member of more than one tenant")
    if not found[0].allows(Role.ADMIN):
        raise RoleRequired(f"{what} needs the admin role", role="admin")
    return found[0].tenant
