"""Evaluation policies: an approver's standing approval of evaluations (docs/evaluations.md).

A policy names one dataset, the kinds of change it covers, the scorers it allows, a spend
ceiling per evaluation and per UTC day, and an expiry. It is approved by a member with the
approver role in a console session (never a key), audited, and bound to its digest: the digest
of those terms, recomputed whenever an evaluation asks to start under it, so a policy row changed
behind the service's back covers nothing. An evaluation inside a policy starts without a
per-run approval; one outside every policy waits for an approver as any batch does.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from django.contrib.auth.models import User
from django.db import transaction

from .. import audit, clock
from ..canonical import digest
from ..errors import NotFound
from ..limits import written
from ..models import ApiKey, EvaluationPolicy, Role, Workspace
from ..reads import selectors
from .access import require_member
from .budget import usd_text
from .datasets import get_dataset
from .errors import EvaluationForbidden, InvalidEvaluation
from .scorers import known_scorers

CHANGE_KINDS = ("model", "prompt", "input", "workflow")
CEILING_PLACES = Decimal("1E-12")  # EvaluationPolicy's ceilings: DecimalField(decimal_places=12)
MAX_TTL_DAYS = 90
Action = audit.Action


def _money(value: Any, field: str) -> Decimal:
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        raise InvalidEvaluation(f"{field} is an amount in USD", field=field) from None
    if isinstance(value, bool) or not amount.is_finite() or amount <= 0 or amount > Decimal(1_000_000):
        raise InvalidEvaluation(f"{field} is an amount in USD above 0 and at most 1000000", field=field)
    # The column keeps 12 places: a finer amount would be stored rounded (even to 0), its terms
    # would no longer hash to the digest approved, and the policy would cover nothing.
    if amount != amount.quantize(CEILING_PLACES):
        raise InvalidEvaluation(f"{field} is an amount in USD with at most 12 decimal places", field=field)
    return amount


def policy_digest(policy: EvaluationPolicy) -> str:
    return digest(
        {
            "datasetId": policy.dataset_id,
            "changeKinds": sorted(policy.change_kinds),
            "scorers": sorted(policy.scorers),
            # As policies were digested when approved (10 is "1E+1" here): a stored digest's text.
            "ceilingPerEvaluationUsd": str(policy.ceiling_per_evaluation_usd.normalize()),
            "ceilingPerDayUsd": str(policy.ceiling_per_day_usd.normalize()),
            "expiresAt": policy.expires_at.isoformat(),
        }
    )


@transaction.atomic
def approve_policy(
    *,
    workspace: Workspace,
    dataset: str,
    change_kinds: Sequence[Any],
    scorers: Sequence[Any],
    ceiling_per_evaluation_usd: Any,
    ceiling_per_day_usd: Any,
    ttl_hours: Any,
    by: User | ApiKey,
    note: str = "",
) -> EvaluationPolicy:
    if isinstance(by, ApiKey):
        raise EvaluationForbidden("a policy is approved by a human in a console session; API keys cannot approve")
    require_member(by, workspace, Role.APPROVER)
    found = get_dataset(workspace, dataset)
    kinds = sorted(set(change_kinds)) if isinstance(change_kinds, list | tuple) else []
    if not kinds or any(k not in CHANGE_KINDS for k in kinds):
        raise InvalidEvaluation(f"changeKinds lists kinds of change of {list(CHANGE_KINDS)}", field="changeKinds")
    names = sorted(set(scorers)) if isinstance(scorers, list | tuple) else []
    if not names or any(n not in known_scorers() for n in names):
        raise InvalidEvaluation(f"scorers lists registered scorers (known: {known_scorers()})", field="scorers")
    per_evaluation = _money(ceiling_per_evaluation_usd, "ceilingPerEvaluationUsd")
    per_day = _money(ceiling_per_day_usd, "ceilingPerDayUsd")
    if per_evaluation > per_day:
        raise InvalidEvaluation(
            "the ceiling per evaluation is above the ceiling per day", field="ceilingPerEvaluationUsd"
        )
    if isinstance(ttl_hours, bool) or not isinstance(ttl_hours, int | float) or not 0 < ttl_hours <= MAX_TTL_DAYS * 24:
        raise InvalidEvaluation(
            f"ttlHours is a number of hours above 0 and at most {MAX_TTL_DAYS * 24}", field="ttlHours"
        )
    now = clock.now()
    policy = EvaluationPolicy(
        public_id=f"evp_{secrets.token_hex(8)}",
        workspace=workspace,
        dataset=found,
        change_kinds=kinds,
        scorers=names,
        ceiling_per_evaluation_usd=per_evaluation,
        ceiling_per_day_usd=per_day,
        expires_at=(now + timedelta(hours=float(ttl_hours))).replace(microsecond=0),
        note=written(note, field="note", label="note", required=False, error=InvalidEvaluation).strip(),
        approved_by=by,
        approved_by_name=by.get_username(),
        created_at=now,
    )
    policy.digest = policy_digest(policy)
    policy.save()
    audit.record(
        actor=by,
        tenant=workspace.tenant,
        workspace=workspace,
        action=Action.EVALUATION_POLICY_APPROVED,
        target=policy.public_id,
        reason=policy.note,
        details={
            "dataset": found.name,
            "changeKinds": kinds,
            "scorers": names,
            "ceilingPerEvaluationUsd": str(per_evaluation),
            "ceilingPerDayUsd": str(per_day),
            "expiresAt": policy.expires_at.isoformat(),
            "digest": policy.digest,
        },
    )
    return policy


def get_policy(workspace: Workspace, public_id: str) -> EvaluationPolicy:
    policy = EvaluationPolicy.objects.filter(workspace=workspace, public_id=public_id).select_related("dataset").first()
    if policy is None:
        raise NotFound(f"policy {public_id} not found", policyId=public_id)
    return policy


def policies(
    workspace: Workspace, *, limit: int | None = None, after: tuple[datetime, int] | None = None
) -> list[EvaluationPolicy]:
    """Newest first; `limit` of them from just after `after` (a page's last row: created_at, pk)."""
    qs = EvaluationPolicy.objects.filter(workspace=workspace).select_related("dataset").order_by("-created_at", "-pk")
    qs = selectors.older_than(qs, after)
    return list(qs if limit is None else qs[:limit])


@transaction.atomic
def revoke_policy(*, workspace: Workspace, public_id: str, by: User | ApiKey, note: str = "") -> EvaluationPolicy:
    if isinstance(by, ApiKey):
        raise EvaluationForbidden("a policy is revoked by a human in a console session")
    require_member(by, workspace, Role.APPROVER)
    policy = get_policy(workspace, public_id)
    if policy.revoked_at is None:
        policy.revoked_at = clock.now()
        policy.save(update_fields=["revoked_at"])
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=Action.EVALUATION_POLICY_REVOKED,
            target=policy.public_id,
            reason=note.strip(),
            details={"dataset": policy.dataset.name, "digest": policy.digest},
        )
    return policy


def is_active(policy: EvaluationPolicy, now: datetime) -> bool:
    return policy.revoked_at is None and policy.expires_at > now and policy.digest == policy_digest(policy)


def requester_id(by: User | ApiKey) -> int | None:
    """The member behind a request: the user, or the owner of the key (None for an unowned key)."""
    return by.pk if isinstance(by, User) else audit.key_owner_id(by)


def covering(
    workspace: Workspace,
    *,
    dataset_id: int,
    change_kind: str,
    scorer_names: Sequence[str],
    requested_by: int | None = None,
) -> EvaluationPolicy | None:
    """The newest active policy that covers this evaluation, or None (it waits for an approver).
    Never one its requester (`requested_by`, a user's id) approved: four eyes, like any approval."""
    now = clock.now()
    # Newest first, and of two approved in one instant the later (by pk): never the database's pick.
    newest_first = EvaluationPolicy.objects.filter(workspace=workspace, dataset_id=dataset_id).order_by(
        "-created_at", "-pk"
    )
    for policy in newest_first:
        if requested_by is not None and policy.approved_by_id == requested_by:
            continue
        if is_active(policy, now) and change_kind in policy.change_kinds and set(scorer_names) <= set(policy.scorers):
            return policy
    return None


def policy_json(policy: EvaluationPolicy) -> dict[str, Any]:
    now = clock.now()
    return {
        "id": policy.public_id,
        "dataset": policy.dataset.name,
        "changeKinds": policy.change_kinds,
        "scorers": policy.scorers,
        "ceilingPerEvaluationUsd": usd_text(policy.ceiling_per_evaluation_usd),
        "ceilingPerDayUsd": usd_text(policy.ceiling_per_day_usd),
        "expiresAt": clock.iso(policy.expires_at),
        "digest": policy.digest,
        "approvedBy": policy.approved_by_name,
        "note": policy.note,
        "createdAt": clock.iso(policy.created_at),
        "revokedAt": clock.iso(policy.revoked_at),
        "active": is_active(policy, now),
    }
