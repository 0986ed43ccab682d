"""Executing approved re-execution requests: the built-in worker's start, heartbeat and finish,
an external executor's claim and lease, and the settling of a request when its new run ends
(a hook on the log, registered in ledger/reexecution/apps.py). Asking and deciding are
ledger/reexecution/services.py; this module knows nothing of them, so the worker and the queue's
task (ledger/reexecution/tasks.py) can import it without a cycle.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Q

from .. import audit, clock
from ..errors import NotFound
from ..log import announce
from ..log.rules import lease_live
from ..models import ApiKey, ReexecutionRequest, Run, Workspace
from .errors import Forbidden, LeaseLost

Status = ReexecutionRequest.Status
Executor = ReexecutionRequest.Executor
Action = audit.Action
EXPIRY = audit.Actor(name="system:expiry")


def reexecution_group_for(workspace_pk: int) -> str:
    """The channel-layer group told (after commit) when a request of the workspace changes."""
    return f"ledger.reexecutions.{workspace_pk}"


# Called (in the transaction of the change) for every change of a request: what a package above
# this one (ledger/evaluation) hangs on a batch's progress; registered in its app config.
_CHANGE_LISTENERS: list[Callable[[ReexecutionRequest], None]] = []


def on_change(listener: Callable[[ReexecutionRequest], None]) -> None:
    if listener not in _CHANGE_LISTENERS:
        _CHANGE_LISTENERS.append(listener)


def announce_change(request: ReexecutionRequest) -> None:
    for listener in _CHANGE_LISTENERS:
        listener(request)
    announce.send_after_commit(
        reexecution_group_for(request.workspace_id),
        {
            "type": "ledger.reexecution_changed",
            "reexecutionId": request.public_id,
            "status": request.status,
            "runId": request.original_run_id,
            "newRunId": request.new_run_id or None,
        },
    )


def lease_ttl() -> timedelta:
    return timedelta(seconds=float(settings.RUNLEDGER_REEXEC_LEASE_SECONDS))


def lock_request(workspace: Workspace, public_id: str) -> ReexecutionRequest:
    request = (
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(workspace=workspace, public_id=public_id)
        .first()
    )
    if request is None:
        raise NotFound(f"re-execution {public_id} not found", reexecutionId=public_id)
    return request


def _locked(request_pk: int) -> ReexecutionRequest | None:
    return (
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(pk=request_pk)
        .first()
    )


def _held(request_pk: int, lease_token: str) -> ReexecutionRequest | None:
    """The request, locked, while the worker with `lease_token` still runs it; else None."""
    request = _locked(request_pk)
    if request is None or request.status != Status.RUNNING or request.lease_token != lease_token:
        return None
    return request


def _lease_is_live(request: ReexecutionRequest, now: datetime) -> bool:
    return lease_live(request.lease_expires_at, now)


def _take_lease(request: ReexecutionRequest, owner: str, now: datetime) -> None:
    request.status = Status.RUNNING
    request.lease_owner, request.lease_token = owner, secrets.token_hex(16)
    request.lease_expires_at = now + lease_ttl()
    request.attempts += 1
    request.started_at = request.started_at or now
    request.updated_at = now
    request.save()


@transaction.atomic
def start(
    *,
    request_pk: int,
    owner: str,
    owner_is_dead: Callable[[str], bool] = lambda owner: False,
) -> ReexecutionRequest | None:
    """The built-in worker takes an approved request (or a running one whose worker is gone);
    None when there is nothing to do: decided otherwise, finished, or held by a live worker."""
    request = _locked(request_pk)
    if request is None or request.executor != Executor.BUILTIN:
        return None
    now = clock.now()
    if request.status == Status.RUNNING:
        if _lease_is_live(request, now) and not owner_is_dead(request.lease_owner):
            return None
    elif request.status != Status.APPROVED:
        return None
    resumed_from = request.lease_owner if request.status == Status.RUNNING else None
    _take_lease(request, owner, now)
    audit.record(
        actor=audit.Actor(name=f"worker:{owner}"),
        tenant=request.workspace.tenant,
        workspace=request.workspace,
        action=Action.REEXECUTION_STARTED,
        target=request.public_id,
        details={
            "runId": request.original_run_id,
            "newRunId": request.new_run_id,
            "attempt": request.attempts,
            **({"takenOverFrom": resumed_from} if resumed_from else {}),
        },
    )
    announce_change(request)
    return request


@transaction.atomic
def claim_next(*, api_key: ApiKey, owner: str = "") -> ReexecutionRequest | None:
    """An external executor (key with `execute`) takes the oldest approved request of its
    workspace that this deployment does not execute itself, or one whose previous claimant's
    lease ran out (it continues the same new run). None when there is none."""
    if not api_key.has_scope("execute"):
        raise Forbidden("claiming needs an API key with the 'execute' scope", scope="execute")
    now = clock.now()
    request = (
        ReexecutionRequest.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("workspace__tenant")
        .filter(workspace_id=api_key.workspace_id, executor=Executor.EXTERNAL)
        .filter(Q(status=Status.APPROVED) | Q(status=Status.RUNNING, lease_expires_at__lte=now))
        .order_by("decided_at", "pk")
        .first()
    )
    if request is None:
        return None
    previous = request.lease_owner if request.status == Status.RUNNING else None
    _take_lease(request, audit.key_actor(api_key), now)
    audit.record(
        actor=api_key,
        tenant=request.workspace.tenant,
        workspace=request.workspace,
        action=Action.REEXECUTION_CLAIMED,
        target=request.public_id,
        details={
            "runId": request.original_run_id,
            "newRunId": request.new_run_id,
            "attempt": request.attempts,
            "leaseExpiresAt": request.lease_expires_at.isoformat(),  # type: ignore[union-attr]  # a taken lease always has its expiry
            **({"owner": owner} if owner else {}),
            **({"takenOverFrom": previous} if previous else {}),
        },
    )
    announce_change(request)
    return request


@transaction.atomic
def renew_lease(*, workspace: Workspace, reexecution_id: str, lease_token: str) -> ReexecutionRequest:
    """Extend the executor's lease by its TTL from now; `lease_lost` once another took it over
    or the request finished."""
    request = lock_request(workspace, reexecution_id)
    if (
        request.status != Status.RUNNING
        or not lease_token
        or not secrets.compare_digest(request.lease_token, lease_token)
    ):
        raise LeaseLost(
            f"re-execution {reexecution_id} is not held with this lease token",
            reexecutionId=reexecution_id,
            status=request.status,
        )
    now = clock.now()
    request.lease_expires_at, request.updated_at = now + lease_ttl(), now
    request.save(update_fields=["lease_expires_at", "updated_at"])
    return request


def _finish(request: ReexecutionRequest, *, succeeded: bool, error: Any, actor: audit.Actor, now: datetime) -> None:
    request.status = Status.SUCCEEDED if succeeded else Status.FAILED
    request.error = None if succeeded else error
    request.finished_at, request.updated_at = now, now
    request.lease_expires_at = None
    request.save()
    audit.record(
        actor=actor,
        tenant=request.workspace.tenant,
        workspace=request.workspace,
        action=Action.REEXECUTION_FINISHED,
        target=request.public_id,
        details={
            "runId": request.original_run_id,
            "newRunId": request.new_run_id,
            "status": request.status,
            **({"error": error} if not succeeded else {}),
        },
    )
    announce_change(request)


@transaction.atomic
def finish(*, request_pk: int, lease_token: str, succeeded: bool, error: Any = None) -> ReexecutionRequest | None:
    """The built-in worker's end of a request: a no-op when the new run's terminal event already
    settled it (see `settle_on_terminal`) or another worker holds it now."""
    request = _held(request_pk, lease_token)
    if request is None:
        return None
    _finish(
        request,
        succeeded=succeeded,
        error=error,
        actor=audit.Actor(name=f"worker:{request.lease_owner}"),
        now=clock.now(),
    )
    return request


@transaction.atomic
def park(*, request_pk: int, lease_token: str) -> ReexecutionRequest | None:
    """The built-in worker lets go of a request whose run stopped to wait for a tool call's
    approver: it stays `running` (its run has not ended) with no holder and no lease, which the
    sweep leaves alone; the decision's task executes it again (`waiting_request`), and the run's
    terminal event settles it as ever. None when another worker holds it now or it was settled."""
    request = _held(request_pk, lease_token)
    if request is None:
        return None
    request.lease_owner, request.lease_token, request.lease_expires_at = "", "", None
    request.updated_at = clock.now()
    request.save(update_fields=["lease_owner", "lease_token", "lease_expires_at", "updated_at"])
    announce_change(request)
    return request


def is_parked(request: ReexecutionRequest) -> bool:
    """Running with nobody holding it: its run waits for a tool call's approver (`park`)."""
    return request.status == Status.RUNNING and request.lease_expires_at is None and not request.lease_owner


def waiting_request(workspace_pk: int, run_id: str) -> ReexecutionRequest | None:
    """The built-in request parked on `run_id` (its new run, or the run a resume continues)."""
    request = (
        ReexecutionRequest.objects.filter(
            workspace_id=workspace_pk, new_run_id=run_id, status=Status.RUNNING, executor=Executor.BUILTIN
        )
        .order_by("pk")
        .first()
    )
    return request if request is not None and is_parked(request) else None


def settle_on_terminal(*, run: Run, written: Sequence[Mapping[str, Any]]) -> None:
    """Called by the append path, in its transaction, for a batch that ended `run`: a running
    request whose new run this is follows the run's outcome. This is how a request executed by
    an external harness (which reports only through appends) finishes, and it is the same for the
    built-in worker, so the request's status and its run's terminal event commit together."""
    terminal = next((e for e in reversed(written) if e["type"] in ("RunCompleted", "RunFailed")), None)
    if terminal is None:
        return
    requests = list(
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(workspace_id=run.workspace_id, new_run_id=run.run_id, status=Status.RUNNING)
    )
    now = clock.now()
    for request in requests:
        executor = request.lease_owner if request.executor == Executor.EXTERNAL else f"worker:{request.lease_owner}"
        _finish(
            request,
            succeeded=terminal["type"] == "RunCompleted",
            error=terminal["payload"].get("error"),
            actor=audit.Actor(name=executor),
            now=now,
        )


@transaction.atomic
def heartbeat(*, request_pk: int, lease_token: str) -> bool:
    """The built-in worker renews its lease while it executes; False once it was taken over."""
    now = clock.now()
    return bool(
        ReexecutionRequest.objects.filter(pk=request_pk, status=Status.RUNNING, lease_token=lease_token).update(
            lease_expires_at=now + lease_ttl(), updated_at=now
        )
    )


# --- expiry ----------------------------------------------------------------------------------


def expire(request: ReexecutionRequest, now: datetime, noticed_by: AbstractBaseUser | None = None) -> None:
    request.status, request.updated_at = Status.EXPIRED, now
    request.save(update_fields=["status", "updated_at"])
    audit.record(
        actor=EXPIRY,
        tenant=request.workspace.tenant,
        workspace=request.workspace,
        action=Action.REEXECUTION_EXPIRED,
        target=request.public_id,
        details={
            "runId": request.original_run_id,
            "expiresAt": request.expires_at.isoformat(),
            **({"noticedBy": noticed_by.get_username()} if noticed_by is not None else {}),
        },
    )
    announce_change(request)


@transaction.atomic
def expire_overdue(*, workspace: Workspace | None = None) -> list[str]:
    """Write down as expired every pending request past its expiry (the worker sweeps this)."""
    now = clock.now()
    qs = (
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(status=Status.PENDING_APPROVAL, expires_at__lte=now)
    )
    if workspace is not None:
        qs = qs.filter(workspace=workspace)
    expired = list(qs.order_by("pk"))
    for request in expired:
        expire(request, now)
    return [r.public_id for r in expired]
