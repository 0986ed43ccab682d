"""Reads of re-execution requests, always scoped to workspaces the caller may see."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Count, Q, QuerySet

from .. import audit, clock
from ..errors import NotFound
from ..models import ReexecutionRequest, Workspace

Status = ReexecutionRequest.Status


def requests(workspace: Workspace) -> QuerySet[ReexecutionRequest]:
    # With their workspace and tenant, which every request's API shape and links name.
    return ReexecutionRequest.objects.filter(workspace=workspace).select_related("workspace__tenant")


def decided(workspace: Workspace, *, before: tuple[datetime, int] | None, limit: int) -> list[ReexecutionRequest]:
    """Up to `limit` of the workspace's requests no longer waiting for a decision, the newest change
    first, older than `before` (a request's last change and row id) when given."""
    qs = requests(workspace).exclude(status=Status.PENDING_APPROVAL)
    if before is not None:
        qs = qs.filter(Q(updated_at__lt=before[0]) | Q(updated_at=before[0], pk__lt=before[1]))
    return list(qs.order_by("-updated_at", "-pk")[:limit])


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
    return requests(workspace).filter(_made(run_id)).order_by("pk").first()


def _made(run_id: str) -> Q:
    return Q(new_run_id=run_id) & ~Q(mode=ReexecutionRequest.Mode.RESUME)


def _around(workspace: Workspace, run_id: str) -> QuerySet[ReexecutionRequest]:
    """The requests of `of_run` and `made_run` together, oldest first."""
    return requests(workspace).filter(Q(original_run_id=run_id) | _made(run_id)).order_by("created_at", "pk")


def _made_among(rows: list[ReexecutionRequest], run_id: str) -> ReexecutionRequest | None:
    """`made_run` of rows that hold every request it could find."""
    made = [rx for rx in rows if rx.new_run_id == run_id and rx.mode != ReexecutionRequest.Mode.RESUME]
    return min(made, key=lambda rx: rx.pk, default=None)


def all_around_run(workspace: Workspace, run_id: str) -> tuple[list[ReexecutionRequest], ReexecutionRequest | None]:
    """`list(of_run(...))` and `made_run(...)` in one query."""
    rows = list(_around(workspace, run_id))
    return [rx for rx in rows if rx.original_run_id == run_id], _made_among(rows, run_id)


@dataclass(frozen=True)
class AroundRun:
    """What the run page's header shows of the requests around a run: the first `limit` requests
    to re-execute it (`of_run`), the request that made it (`made_run`) and the oldest of them
    waiting for an approver (the run's attention)."""

    listed: list[ReexecutionRequest]
    made: ReexecutionRequest | None
    pending: ReexecutionRequest | None


NONE_AROUND = AroundRun([], None, None)  # what around_run answers for a run no request names


def around_run(workspace: Workspace, run_id: str, *, limit: int) -> AroundRun:
    """`of_run(...)[:limit]`, `made_run` and the oldest pending request of `run_id` in one query
    when the run has at most `limit + 1` requests around it (the common case: they are all read);
    a run with more asks `of_run`, `made_run` and the pending one apart for what those rows leave open."""
    read = limit + 2
    rows = list(_around(workspace, run_id)[:read])
    asked = [rx for rx in rows if rx.original_run_id == run_id]
    pending = next((rx for rx in asked if rx.status == Status.PENDING_APPROVAL), None)
    if len(rows) < read:  # every request around the run
        return AroundRun(asked[:limit], _made_among(rows, run_id), pending)
    # The first rows in creation order: what they hold is the start of each answer, but not all of it.
    listed = asked[:limit] if len(asked) >= limit else list(of_run(workspace, run_id)[:limit])
    if pending is None:
        pending = of_run(workspace, run_id).filter(status=Status.PENDING_APPROVAL).first()
    return AroundRun(listed, made_run(workspace, run_id), pending)


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
        "decidedAt": clock.iso(request.decided_at),
        "expiresAt": clock.iso(request.expires_at),
        "newRunId": request.new_run_id or None,
        "executor": request.executor or None,
        "batchId": request.batch_id or None,
        "attempts": request.attempts,
        "error": request.error,
        "createdAt": clock.iso(request.created_at),
        "startedAt": clock.iso(request.started_at),
        "finishedAt": clock.iso(request.finished_at),
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
