"""Who may do what to datasets, policies and evaluations (docs/evaluations.md "Who may")."""

from __future__ import annotations

from django.contrib.auth.models import User

from .. import audit
from ..errors import NotFound
from ..models import ApiKey, Membership, Role, Workspace
from .errors import EvaluationForbidden

Principal = User | ApiKey


def require_member(user: User, workspace: Workspace, role: str) -> Membership:
    membership = (
        Membership.objects.filter(user=user, tenant_id=workspace.tenant_id).first() if user.is_authenticated else None
    )
    if membership is None:
        raise NotFound("not found")  # another tenant: its existence is not revealed
    if not membership.allows(role):
        raise EvaluationForbidden(f"this operation needs the {role} role", role=role)
    return membership


def actor(by: Principal | str, workspace: Workspace, *, scope: str = "execute") -> audit.Actor:
    """The caller as an audit actor, refusing outsiders (404), keys without `scope` and members
    below operator (403). A str is the command line (the operator of the deployment)."""
    if isinstance(by, str):
        return audit.Actor(name=by)
    if isinstance(by, ApiKey):
        if by.workspace_id != workspace.pk:
            raise NotFound("not found")
        if not by.has_scope(scope):
            raise EvaluationForbidden(f"this needs an API key with the {scope!r} scope", scope=scope)
        return audit.Actor(name=audit.key_actor(by))
    require_member(by, workspace, Role.OPERATOR)
    return audit.Actor(name=by.get_username(), user_id=by.pk)
