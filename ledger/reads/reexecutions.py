"""Reads of re-execution requests, always scoped to workspaces the caller may see."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Count, QuerySet

from .. import audit
from ..errors import NotFound
from ..models import ReexecutionRequest, Workspace

Status = ReexecutionRequest.Status


def requests(workspace: Workspace) -> QuerySet[ReexecutionRequest]:
    # With their workspace and tenant, which every request's API shape and links name.
    return ReexecutionRequest.objects.filter(workspace=workspace).select_related("workspace__tenant")


def page(workspace: Workspace, *, after_pk: int, limit: int, status: str | None = None) -> list[ReexecutionRequest]:
    """Up to `limit` of the workspace's requests after the row `after_pk`, oldest first."""
    qs = requests(workspace).filter(pk__gt=after_pk)
    if status:
        qs = qs.filter(status=status)
    return list(qs.order_by("pk")[:limit])


def get(workspaces: Iterable[Workspace], public_id: str) -> ReexecutionRequest:
    """The request with this id in one of `workspaces`; NotFound otherwise (another tenant's too)."""
    found = (
        ReexecutionRequest.objects.select_related("workspace__tenant")
        .filter(workspace__in=list(workspaces), public_id=public_id)
        .first()
    )
    if found is None:
        raise NotFound(f"re-execution {public_id} not found", reexecutionId=public_id)
    return found


def of_run(workspace: Workspace, run_id: str) -> QuerySet[ReexecutionRequest]:
    """Requests to re-execute `run_id`, oldest first."""
    return requests(workspace).filter(original_run_id=run_id).order_by("created_at", "pk")


def made_run(workspace: Workspace, run_id: str) -> ReexecutionRequest | None:
    """The request whose execution wrote `run_id` (resume requests continue their original)."""
    return (
        requests(workspace)
        .filter(new_run_id=run_id)
        .exclude(mode=ReexecutionRequest.Mode.RESUME)
        .order_by("pk")
        .first()
    )


def pending_approval(workspace: Workspace) -> QuerySet[ReexecutionRequest]:
    """What the workspace's approvers have to decide, oldest first."""
    return requests(workspace).filter(status=Status.PENDING_APPROVAL).order_by("created_at", "pk")


def of_batch(workspace: Workspace, batch_id: str) -> list[ReexecutionRequest]:
    found = list(requests(workspace).filter(batch_id=batch_id).order_by("pk")) if batch_id else []
    if not found:
        raise NotFound(f"batch {batch_id} not found", batchId=batch_id)
    return found


def counts(workspace: Workspace) -> dict[str, int]:
    """Requests per status (every status present, 0 when none): the navigation's badge."""
    rows = requests(workspace).values("status").annotate(n=Count("pk"))
    out = {status: 0 for status in Status.values}
    out.update({row["status"]: row["n"] for row in rows})
    return out


def _iso(value: Any) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value is not None else None


def as_dict(request: ReexecutionRequest) -> dict[str, Any]:
    """The request as the API shows it (camelCase); the plan is added by the caller that wants it."""
    ws = request.workspace
    out: dict[str, Any] = {
        "id": request.public_id,
        "workspace": f"{ws.tenant.slug}/{ws.slug}",
        "runId": request.original_run_id,
        "mode": request.mode,
        "fromStep": request.from_step,
        "modelOverrides": request.model_overrides,
        "reason": request.reason,
        "requestedBy": request.requested_by,
        "unownedKey": audit.requested_by_unowned_key(request),
        "status": request.status,
        "digest": request.digest,
        "lastSequence": request.last_sequence,
        "planDigest": request.plan_digest,
        "approver": request.approver_name or None,
        "note": request.note or None,
        "decidedAt": _iso(request.decided_at),
        "expiresAt": _iso(request.expires_at),
        "newRunId": request.new_run_id or None,
        "executor": request.executor or None,
        "batchId": request.batch_id or None,
        "attempts": request.attempts,
        "error": request.error,
        "createdAt": _iso(request.created_at),
        "startedAt": _iso(request.started_at),
        "finishedAt": _iso(request.finished_at),
    }
    if request.has_input:
        out["input"] = request.input
    # An evaluation's changes beyond a model mapping, present only when the request makes them: an
    # external executor claiming the request must apply them (docs/evaluations.md "Changes").
    if request.prompt_overrides:
        out["promptOverrides"] = request.prompt_overrides
    if request.workflow:
        out["workflow"] = {"name": request.workflow, "versionId": request.workflow_version}
    return out
