"""The audit log: one append-only row per privileged action (docs/api.md "Audit").

`record` is called inside the transaction of the action it records (the zulip way: a `do_*`
service writes, audits and announces on commit), so an action and its entry commit or roll back
together. Reads are the selectors below, always scoped to one tenant.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q, QuerySet

from . import clock
from .models import ApiKey, AuditEntry, Tenant, Workspace
from .redaction import of_workspace

Action = AuditEntry.Action


@dataclass(frozen=True)
class Actor:
    """Who did it: a member (by username), an API key (`key:<prefix>`), or the system itself."""

    name: str
    user_id: int | None = None

    @classmethod
    def of(cls, who: AbstractBaseUser | ApiKey | str) -> Actor:
        if isinstance(who, ApiKey):
            return cls(name=key_actor(who))
        if isinstance(who, str):
            return cls(name=who)
        return cls(name=who.get_username(), user_id=who.pk)


def key_actor(api_key: ApiKey) -> str:
    return f"key:{api_key.prefix}"


SYSTEM = Actor(name="system")


def key_owner_id(api_key: ApiKey) -> int | None:
    """The member a key belongs to: who created it, by its `api_key.created` entry (`ledger
    create-key --owner`); None for a key made by the command line alone (unowned)."""
    return (
        AuditEntry.objects.filter(
            action=Action.API_KEY_CREATED, target=key_actor(api_key), workspace_id=api_key.workspace_id
        )
        .values_list("actor_user_id", flat=True)
        .first()
    )


def requested_by_unowned_key(request: Any) -> bool:
    """True when a re-execution request was made with an API key that belongs to nobody (made
    without `--owner`, or deleted since): only an admin may approve it, with a warning."""
    if getattr(request, "requested_by_user_id", None) is not None:
        return False
    if not str(getattr(request, "requested_by", "")).startswith("key:"):
        return False
    key = request.requested_by_key
    return key is None or key_owner_id(key) is None


def key_owner_names(keys: list[ApiKey]) -> dict[int, str]:
    """{key pk: username of its owner} for the owned keys among `keys` (one query)."""
    by_target = {key_actor(k): k for k in keys}
    rows = AuditEntry.objects.filter(action=Action.API_KEY_CREATED, target__in=list(by_target)).values_list(
        "target", "workspace_id", "actor_user_id"
    )
    owners = {t: uid for t, ws, uid in rows if uid is not None and by_target[t].workspace_id == ws}
    names = dict(get_user_model().objects.filter(pk__in=set(owners.values())).values_list("pk", "username"))
    return {by_target[t].pk: names[uid] for t, uid in owners.items() if uid in names}


def members_added(tenant: Tenant, usernames: list[str]) -> dict[str, datetime]:
    """{username: when they were last added to the tenant} by their `member.added` entries (one
    query); a member without one (added before the audit log) is left out."""
    rows = AuditEntry.objects.filter(
        tenant=tenant, action=Action.MEMBER_ADDED, target__in=[f"user:{name}" for name in usernames]
    ).values_list("target", "at")
    added: dict[str, datetime] = {}
    for target, at in rows:
        name = target.removeprefix("user:")
        if name not in added or at > added[name]:
            added[name] = at
    return added


def record(
    *,
    actor: Actor | AbstractBaseUser | ApiKey | str,
    tenant: Tenant,
    action: str,
    target: str,
    workspace: Workspace | None = None,
    reason: str = "",
    details: dict[str, Any] | None = None,
) -> AuditEntry:
    """Write one entry; must run inside the transaction of the action it records. The reason and
    every string of the details are redacted first (the workspace's policy, else the built-ins):
    an entry can never be changed, so a secret in it could never be removed."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("audit entries are written in the transaction of the action they record")
    who = actor if isinstance(actor, Actor) else Actor.of(actor)
    redact = of_workspace(workspace)
    reason, details = redact.scrub(reason), redact(details or {})
    return AuditEntry.objects.create(
        tenant=tenant,
        workspace=workspace,
        actor=who.name,
        actor_user_id=who.user_id,
        action=Action(action).value,
        target=target,
        reason=reason,
        details=details,
        at=clock.now(),
    )


# --- selectors -------------------------------------------------------------------------------


def entries(
    *,
    tenant: Tenant,
    start: datetime | None = None,
    end: datetime | None = None,
    actor: str | None = None,
    action: str | None = None,
    after: tuple[datetime, int] | None = None,
    newest_first: bool = False,
) -> QuerySet[AuditEntry]:
    """The tenant's entries, oldest first (newest first: the console's log), filtered; `after` is
    the (at, id) keyset of a page's last."""
    qs = AuditEntry.objects.filter(tenant=tenant).select_related("tenant", "workspace__tenant")
    if start is not None:
        qs = qs.filter(at__gte=start)
    if end is not None:
        qs = qs.filter(at__lt=end)
    if actor:
        qs = qs.filter(actor=actor)
    if action:
        qs = qs.filter(action=action)
    if newest_first:
        if after is not None:
            qs = qs.filter(Q(at__lt=after[0]) | Q(at=after[0], pk__lt=after[1]))
        return qs.order_by("-at", "-pk")
    if after is not None:
        qs = qs.filter(Q(at__gt=after[0]) | Q(at=after[0], pk__gt=after[1]))
    return qs.order_by("at", "pk")


def for_target(*, tenant: Tenant, target: str) -> QuerySet[AuditEntry]:
    return AuditEntry.objects.filter(tenant=tenant, target=target).order_by("at", "pk")


def as_dict(entry: AuditEntry) -> dict[str, Any]:
    """docs/api.md's entry `{id, at, actor, action, tenant, workspace, target, reason}` plus details."""
    workspace = entry.workspace
    return {
        "id": entry.public_id,
        "at": entry.at.isoformat().replace("+00:00", "Z"),
        "actor": entry.actor,
        "action": entry.action,
        "tenant": entry.tenant.slug,
        "workspace": f"{workspace.tenant.slug}/{workspace.slug}" if workspace is not None else None,
        "target": entry.target,
        "reason": entry.reason,
        "details": entry.details,
    }
