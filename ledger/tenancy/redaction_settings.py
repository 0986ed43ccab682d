"""A workspace's redaction rules: the policy in force (built-ins and extras) and the one service
that changes the extras, checked and audited (docs/security.md)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import audit
from ..limits import hidden_characters, written
from ..log.redaction import (
    BUILTIN_VALUE_RULES,
    SECRET_KEY_NAMES,
    SECRET_WORD_ENDINGS,
    SECRET_WORD_PAIRS,
    TOKEN_NOT_SECRET_AFTER,
    InvalidRule,
    ValueRule,
    check_rules,
    policy,
)
from ..models import Workspace


@dataclass(frozen=True)
class Policy:
    """What a workspace's appends redact, for a person to read."""

    design_names: list[str]
    word_endings: list[str]
    word_pairs: list[str]
    token_not_after: list[str]
    value_rules: tuple[ValueRule, ...]
    extra_keys: list[str]
    extra_patterns: list[str]
    invalid_patterns: list[str]  # stored before rules were checked on save; not applied


def policy_of(workspace: Workspace) -> Policy:
    keys = [str(k) for k in workspace.redact_keys or []]
    patterns = [str(p) for p in workspace.redact_value_patterns or []]
    return Policy(
        design_names=sorted(SECRET_KEY_NAMES),
        word_endings=list(SECRET_WORD_ENDINGS),
        word_pairs=[f"{a} {b}" for a, b in sorted(SECRET_WORD_PAIRS)],
        token_not_after=sorted(TOKEN_NOT_SECRET_AFTER),
        value_rules=BUILTIN_VALUE_RULES,
        extra_keys=keys,
        extra_patterns=patterns,
        invalid_patterns=policy(keys, patterns).invalid_patterns,
    )


@transaction.atomic
def set_extra_rules(*, workspace: Workspace, keys: Any, patterns: Any, by: Any, reason: str = "") -> Workspace:
    """Replace the workspace's extra key names and value patterns; InvalidRule (nothing changed)
    when one cannot be used. Audited as redaction.changed with both versions; saving the rules
    in force again changes and audits nothing. Appends from then on use the new rules; events
    already in the log are never rewritten (the log is insert-only)."""
    keys, patterns = check_rules(keys, patterns)
    for key in keys:
        hidden = hidden_characters(key)
        if hidden:
            raise InvalidRule(
                f"{key!r} cannot be a key name: it holds control or invisible formatting characters "
                f"({', '.join(hidden[:5])})"
            )
    reason = written(reason, field="reason", label="reason", required=False, workspace=workspace)
    ws = Workspace.objects.select_for_update().select_related("tenant").get(pk=workspace.pk)
    before = {"keys": list(ws.redact_keys or []), "patterns": list(ws.redact_value_patterns or [])}
    after = {"keys": keys, "patterns": patterns}
    if before == after:
        return ws
    ws.redact_keys, ws.redact_value_patterns = keys, patterns
    ws.save(update_fields=["redact_keys", "redact_value_patterns"])
    audit.record(
        actor=by,
        tenant=ws.tenant,
        workspace=ws,
        action=audit.Action.REDACTION_CHANGED,
        target=f"workspace:{ws.tenant.slug}/{ws.slug}",
        reason=reason,
        details={"before": before, "after": after},
    )
    return ws
