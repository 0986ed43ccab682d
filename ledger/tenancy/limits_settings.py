"""The operator's per-workspace overrides of the size limits (ledger/limits.py SIZE_LIMITS):
events per run, bytes of payload per run, events per minute per API key.

Set only by the operator on the command line (`ledger limits T/W --events-per-run N …`, actor
`system:cli`), never from the console or the API: a tenant's admin sees the limits in force on
the workspace's Settings page but cannot raise them, since they protect the other tenants of the
process (docs/security.md § Limits). Each change is audited (`limits.changed`, the old and
new override of every limit changed, NULL meaning the deployment's default) in the transaction
that makes it, with the workspace row locked so that two operators' changes queue.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction

from .. import audit
from ..errors import LedgerError
from ..limits import SIZE_LIMITS, SizeLimit, written
from ..models import Workspace

# The value that puts a limit back to the deployment's default.
DEFAULT = "default"


class InvalidLimit(LedgerError):
    code = "invalid_limit"


def _limit(name: str) -> SizeLimit:
    for limit in SIZE_LIMITS:
        if limit.name == name:
            return limit
    raise InvalidLimit(f"no such limit: {name}", field=name)


def parse(name: str, text: str) -> int | None:
    """An override as typed: a whole number in the limit's range, or `default` (None)."""
    limit = _limit(name)
    text = text.strip()
    if text.lower() == DEFAULT:
        return None
    cleaned = text.replace("_", "")
    if not (cleaned.isascii() and cleaned.isdigit()):
        raise InvalidLimit(f"{limit.label} is a whole number of {limit.unit}, or '{DEFAULT}'", field=name)
    value = int(cleaned)
    if not limit.low <= value <= limit.high:
        raise InvalidLimit(
            f"{limit.label} must be {limit.low} to {limit.high} {limit.unit}",
            field=name,
            low=limit.low,
            high=limit.high,
        )
    return value


@transaction.atomic
def set_limits(
    *,
    workspace: Workspace,
    overrides: Mapping[str, int | None],
    by: audit.Actor | AbstractBaseUser,
    reason: str = "",
) -> dict[str, tuple[int | None, int | None]]:
    """Set the workspace's overrides (`overrides`: limit name -> value, None for the deployment's
    default); the changes made, name -> (old, new), audited as one `limits.changed` entry. Nothing
    changed: no entry, an empty answer."""
    for name, value in overrides.items():
        limit = _limit(name)
        if value is not None and not limit.low <= value <= limit.high:
            raise InvalidLimit(f"{limit.label} must be {limit.low} to {limit.high} {limit.unit}", field=name)
    reason = written(reason, field="reason", label="reason", required=False, error=InvalidLimit, workspace=workspace)
    locked = Workspace.objects.select_for_update().select_related("tenant").get(pk=workspace.pk)
    changed = {
        name: (getattr(locked, name), value) for name, value in overrides.items() if getattr(locked, name) != value
    }
    if not changed:
        return {}
    Workspace.objects.filter(pk=locked.pk).update(**{name: new for name, (_, new) in changed.items()})
    for name, (_, new) in changed.items():
        setattr(workspace, name, new)
    audit.record(
        actor=by,
        tenant=locked.tenant,
        workspace=locked,
        action=audit.Action.LIMITS_CHANGED,
        target=f"workspace:{locked.tenant.slug}/{locked.slug}",
        reason=reason,
        details={
            "changed": {
                name: {"old": old, "new": new, "default": _limit(name).deployment_default()}
                for name, (old, new) in changed.items()
            }
        },
    )
    return changed
