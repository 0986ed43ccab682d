"""Re-execution requests: ask, approve, deny and expire (docs/design.md §5); executing them (claim,
start, finish) is ledger/reexecution/execution.py.

Every service is one transaction that changes the request, writes its audit entry and announces
the change after commit. Refusals that must leave a change behind (a request found expired at
approval is written down as expired, audited, and *then* refused) are returned by the service
body and raised after the commit, as the tool gateway does.

Rules (docs/api.md "Re-execution"):
- operators (session) or keys with `execute` request; `simulate` starts `approved`, every other
  mode waits for an approver or admin who is not the requester (`self_approval_forbidden`);
- approval is a human in a session: keys never approve or deny;
- the approval binds to the request's digest: `digest({mode, fromStep, input?, modelOverrides,
  promptOverrides?, workflow?, lastSequence, planDigest})`, where `input` is absent when no
  override was given (null is an override), `promptOverrides` and `workflow` ({name, versionId},
  an evaluation's changes) are absent unless given, and `planDigest` is the digest of the run's
  replay plan. A run whose last sequence
  or plan moved since is `plan_changed` at approval;
- a pending request expires after RUNLEDGER_APPROVAL_TTL_HOURS (`approval_expired`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction

from .. import audit, clock
from ..canonical import NotCanonicalizable, canonical_bytes, digest
from ..errors import InvalidRunId, LedgerError, NotFound, RunFinished
from ..limits import MAX_TEXT, written
from ..log.prepare import RUN_ID_RE
from ..models import ApiKey, Event, Membership, ReexecutionRequest, Role, Run, Workspace
from ..reads import selectors
from ..redaction import of_workspace
from ..replay.stored_plan import replay_plan_for
from ..runtime.errors import UnknownWorkflow
from ..runtime.providers import known_providers
from ..runtime.reexecute import check_prompt_overrides, registered_workflow
from ..runtime.registry import get_workflow
from ..transactions import atomic_then_refuse
from .errors import (
    ApprovalExpired,
    Forbidden,
    InvalidReexecution,
    NotPending,
    PlanChanged,
    SelfApprovalForbidden,
)
from .execution import announce_change, expire, lock_request

Mode = ReexecutionRequest.Mode
Status = ReexecutionRequest.Status
Executor = ReexecutionRequest.Executor
Action = audit.Action


MAX_BATCH_RUNS = 200
MAX_REASON = MAX_TEXT
# Modes that make a new run; `resume` continues the original.
NEW_RUN_MODES = (Mode.SIMULATE, Mode.EVALUATE, Mode.FORK, Mode.RERUN)
OVERRIDABLE_MODELS = (Mode.EVALUATE, Mode.FORK, Mode.RERUN)


class _NotGiven:
    def __repr__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Any = _NotGiven()

Principal = User | ApiKey


# --- helpers ---------------------------------------------------------------------------------


def _membership(user: User, workspace: Workspace) -> Membership | None:
    if not user.is_authenticated:
        return None
    return Membership.objects.filter(user=user, tenant_id=workspace.tenant_id).first()


def _require_member(user: User, workspace: Workspace, role: str) -> Membership:
    membership = _membership(user, workspace)
    if membership is None:
        raise NotFound("not found")  # another tenant: its existence is not revealed
    if not membership.allows(role):
        raise Forbidden(f"this operation needs the {role} role", role=role)
    return membership


def _requester(by: Principal, workspace: Workspace) -> tuple[str, User | None, ApiKey | None]:
    if isinstance(by, ApiKey):
        if by.workspace_id != workspace.pk:
            raise NotFound("not found")
        if not by.has_scope("execute"):
            raise Forbidden("requesting a re-execution needs an API key with the 'execute' scope", scope="execute")
        return audit.key_actor(by), None, by
    _require_member(by, workspace, Role.OPERATOR)
    return by.get_username(), by, None


def _run_shape(run: Run) -> tuple[int, str]:
    """(last sequence, digest of the replay plan): what an approval binds the run to."""
    return run.last_sequence, digest(replay_plan_for(run))


def request_digest(
    *,
    mode: str,
    from_step: str | None,
    input: Any,
    model_overrides: Mapping[str, Any],
    last_sequence: int,
    plan_digest: str,
    prompt_overrides: Mapping[str, Any] | None = None,
    workflow: str = "",
    workflow_version: str = "",
) -> str:
    body: dict[str, Any] = {
        "mode": mode,
        "fromStep": from_step,
        "modelOverrides": dict(model_overrides),
        "lastSequence": last_sequence,
        "planDigest": plan_digest,
    }
    if input is not NOT_GIVEN:
        body["input"] = input
    if prompt_overrides:  # only when given: the digests of requests made before stay as they were
        body["promptOverrides"] = dict(prompt_overrides)
    if workflow:
        body["workflow"] = {"name": workflow, "versionId": workflow_version}
    return digest(body)


def _digest_of(request: ReexecutionRequest, last_sequence: int, plan_digest: str) -> str:
    return request_digest(
        mode=request.mode,
        from_step=request.from_step,
        input=request.input if request.has_input else NOT_GIVEN,
        model_overrides=request.model_overrides,
        last_sequence=last_sequence,
        plan_digest=plan_digest,
        prompt_overrides=request.prompt_overrides,
        workflow=request.workflow,
        workflow_version=request.workflow_version,
    )


def check_model_overrides(value: Any) -> dict[str, dict[str, str]]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise InvalidReexecution("modelOverrides must be an object: slot -> {provider, model}", field="modelOverrides")
    out: dict[str, dict[str, str]] = {}
    for slot, target in value.items():
        if (
            not isinstance(slot, str)
            or not slot
            or not isinstance(target, Mapping)
            or set(target) != {"provider", "model"}
            or not all(isinstance(target[k], str) and target[k] for k in ("provider", "model"))
        ):
            raise InvalidReexecution(
                f"modelOverrides[{slot!r}] must be {{provider, model}}, both non-empty strings", field="modelOverrides"
            )
        out[slot] = {"provider": target["provider"], "model": target["model"]}
    return out


def check_models_here(
    workspace: Workspace, run_id: str, overrides: Mapping[str, Mapping[str, str]], workflow: str = ""
) -> None:
    """Refuse, when asked, a model override the built-in executor could never honour: a slot the
    registered workflow does not have, a provider this deployment does not know. Else approval would
    queue a request that can only fail. A workflow not registered here is an external executor's,
    whose slots and providers are its own: nothing is checked."""
    if not overrides:
        return
    name = workflow or workflow_of_run(workspace, run_id)
    if not isinstance(name, str):
        return
    try:
        target = get_workflow(name)
    except UnknownWorkflow:
        return
    for slot, to in overrides.items():
        if slot not in target.models:
            raise InvalidReexecution(
                f"workflow {name} has no model slot {slot!r} (slots: {', '.join(sorted(target.models)) or 'none'})",
                field=f"modelOverrides.{slot}",
            )
        if to["provider"] not in known_providers():
            raise InvalidReexecution(
                f"no model provider named {to['provider']!r} is registered here (known: {', '.join(known_providers())})",
                field=f"modelOverrides.{slot}.provider",
            )


def _check_request(
    run: Run, *, mode: str, from_step: str | None, input: Any, model_overrides: dict[str, dict[str, str]], reason: str
) -> None:
    if mode not in Mode.values:
        raise InvalidReexecution(f"mode must be one of {', '.join(Mode.values)}", field="mode")
    written(reason, field="reason", label="reason", error=InvalidReexecution)
    if mode == Mode.FORK:
        if not from_step:
            raise InvalidReexecution("a fork names the step it starts from (fromStep)", field="fromStep")
        if not run.steps.filter(step_path=from_step).exists():
            raise InvalidReexecution(f"run {run.run_id} has no step {from_step!r}", field="fromStep")
    elif from_step is not None:
        raise InvalidReexecution("fromStep is only for mode fork", field="fromStep")
    if input is not NOT_GIVEN:
        if mode not in (Mode.FORK, Mode.EVALUATE):
            raise InvalidReexecution("an input override is for modes fork and evaluate", field="input")
        try:
            canonical_bytes(input)
        except NotCanonicalizable as exc:
            raise InvalidReexecution(f"input has no canonical JSON form: {exc}", field="input") from None
    if model_overrides and mode not in OVERRIDABLE_MODELS:
        raise InvalidReexecution("modelOverrides are for modes evaluate, fork and rerun", field="modelOverrides")
    if run.event_count == 0:
        raise InvalidReexecution(f"run {run.run_id} has no events", field="runId")
    if mode == Mode.RESUME and run.finished:
        raise RunFinished(f"run {run.run_id} is {run.status}; there is nothing to resume", runId=run.run_id)


def _new_public_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _ttl() -> timedelta:
    return timedelta(hours=float(settings.RUNLEDGER_APPROVAL_TTL_HOURS))


def workflow_of_run(workspace: Workspace, run_id: str) -> str | None:
    """The workflow the run was started with, as the runtime's RunStarted names it (None for a
    run an external harness recorded)."""
    first = (
        Event.objects.filter(run__workspace=workspace, run__run_id=run_id, sequence=1)
        .values_list("payload", flat=True)
        .first()
    )
    name = json.loads(first).get("workflow") if first else None
    return name if isinstance(name, str) else None


def _executor_for(workspace: Workspace, run_id: str, workflow: str = "") -> str:
    """Built in when this deployment registers the workflow the new run executes (the
    original's, as its RunStarted names it, or a workflow change's); anything else waits for an
    external executor's claim."""
    name = workflow or workflow_of_run(workspace, run_id)
    if not isinstance(name, str):
        return Executor.EXTERNAL
    try:
        get_workflow(name)
    except UnknownWorkflow:
        return Executor.EXTERNAL
    return Executor.BUILTIN


def _mark_approved(request: ReexecutionRequest, now: datetime) -> None:
    """Reserve the new run's id and pick the executor; queue it for the built-in worker."""
    request.status = Status.APPROVED
    request.new_run_id = request.original_run_id if request.mode == Mode.RESUME else f"run_{request.public_id}"
    request.executor = _executor_for(request.workspace, request.original_run_id, request.workflow)
    request.updated_at = now


def _enqueue_after_save(request: ReexecutionRequest) -> None:
    if request.executor == Executor.BUILTIN:
        from .tasks import enqueue

        enqueue(request.pk)


# --- request -----------------------------------------------------------------------------------


def _create(
    *,
    workspace: Workspace,
    run: Run,
    mode: str,
    reason: str,
    by: Principal,
    from_step: str | None,
    input: Any,
    model_overrides: dict[str, dict[str, str]],
    batch_id: str,
    now: datetime,
    prompt_overrides: dict[str, dict[str, str]] | None = None,
    workflow: str = "",
    workflow_version: str = "",
) -> ReexecutionRequest:
    name, user, key = _requester(by, workspace)
    if input is not NOT_GIVEN:  # stored and digested as the new run's RunStarted will store it
        input = of_workspace(workspace)(input)
    last_sequence, plan_digest = _run_shape(run)
    request = ReexecutionRequest(
        public_id=_new_public_id("rx"),
        workspace=workspace,
        original_run_id=run.run_id,
        mode=mode,
        from_step=from_step,
        has_input=input is not NOT_GIVEN,
        input=None if input is NOT_GIVEN else input,
        model_overrides=model_overrides,
        prompt_overrides=prompt_overrides or {},
        workflow=workflow,
        workflow_version=workflow_version,
        reason=written(reason, field="reason", label="reason", error=InvalidReexecution, workspace=workspace),
        requested_by=name,
        requested_by_user=user,
        requested_by_key=key,
        last_sequence=last_sequence,
        plan_digest=plan_digest,
        digest=request_digest(
            mode=mode,
            from_step=from_step,
            input=input,
            model_overrides=model_overrides,
            last_sequence=last_sequence,
            plan_digest=plan_digest,
            prompt_overrides=prompt_overrides,
            workflow=workflow,
            workflow_version=workflow_version,
        ),
        status=Status.PENDING_APPROVAL,
        expires_at=now + _ttl(),
        batch_id=batch_id,
        created_at=now,
        updated_at=now,
    )
    if mode == Mode.SIMULATE:
        # No side effects, no spend: operators start it without approval (docs/design.md §5).
        _mark_approved(request, now)
        request.decided_at = now
    request.save()
    actor = audit.Actor(name=name, user_id=user.pk if user is not None else None)
    audit.record(
        actor=actor,
        tenant=workspace.tenant,
        workspace=workspace,
        action=Action.REEXECUTION_REQUESTED,
        target=request.public_id,
        reason=request.reason,
        details={
            "runId": run.run_id,
            "mode": mode,
            "digest": request.digest,
            **({"batchId": batch_id} if batch_id else {}),
            **({"newRunId": request.new_run_id} if request.new_run_id else {}),
        },
    )
    _enqueue_after_save(request)
    announce_change(request)
    return request


@transaction.atomic
def request_reexecution(
    *,
    workspace: Workspace,
    run_id: str,
    mode: str,
    reason: str,
    by: Principal,
    from_step: str | None = None,
    input: Any = NOT_GIVEN,
    model_overrides: Mapping[str, Any] | None = None,
) -> ReexecutionRequest:
    """Ask for a re-execution of `run_id`. Pass `input` only to override it (None is an override)."""
    run = selectors.get_run(workspace, run_id)
    run.workspace = workspace
    overrides = check_model_overrides(model_overrides)
    _check_request(run, mode=mode, from_step=from_step, input=input, model_overrides=overrides, reason=reason)
    check_models_here(workspace, run_id, overrides)
    return _create(
        workspace=workspace,
        run=run,
        mode=mode,
        reason=reason,
        by=by,
        from_step=from_step,
        input=input,
        model_overrides=overrides,
        batch_id="",
        now=clock.now(),
    )


@transaction.atomic
def request_batch(
    *,
    workspace: Workspace,
    run_ids: Sequence[str],
    reason: str,
    by: Principal,
    mode: str = Mode.EVALUATE,
    model_overrides: Mapping[str, Any] | None = None,
    prompt_overrides: Mapping[str, Any] | None = None,
    workflow: str = "",
    workflow_version: str = "",
    inputs: Mapping[str, Any] | None = None,
) -> tuple[str, list[ReexecutionRequest]]:
    """One `evaluate` request per run, sharing a batch id: one approval decides them all.

    An evaluation's changes (docs/evaluations.md "Changes"): `prompt_overrides` (step id ->
    {system?, prompt?}, checked against the workflow each run executes when it is registered
    here), `workflow` (a registered workflow's name, pinned to `workflow_version` or to the
    version registered now) and `inputs` (run id -> the input that run gets instead of its own)."""
    if mode != Mode.EVALUATE:
        raise InvalidReexecution("a batch is for mode evaluate", field="mode")
    ids = list(run_ids)
    if not ids or len(ids) > MAX_BATCH_RUNS or not all(isinstance(r, str) for r in ids):
        raise InvalidReexecution(f"runIds must list 1 to {MAX_BATCH_RUNS} run ids", field="runIds")
    if len(set(ids)) != len(ids):
        raise InvalidReexecution("runIds lists a run twice", field="runIds")
    for index, run_id in enumerate(ids):
        if not RUN_ID_RE.fullmatch(run_id):  # names no run: the client's mistake, not a missing run
            raise InvalidRunId(f"run id must match {RUN_ID_RE.pattern}", runId=run_id, field=f"runIds.{index}")
    overrides = check_model_overrides(model_overrides)
    runs = {r.run_id: r for r in selectors.runs(workspace).filter(run_id__in=ids)}
    missing = [r for r in ids if r not in runs]
    if missing:
        raise NotFound(f"run {missing[0]} not found", runId=missing[0])
    inputs = dict(inputs or {})
    strangers = sorted(set(inputs) - set(ids))
    if strangers:
        raise InvalidReexecution(f"inputs names run {strangers[0]}, which is not in the batch", field="inputs")
    if workflow:
        workflow_version = registered_workflow(workflow, workflow_version or None).version_id
    prompts: dict[str, dict[str, str]] = {}
    if prompt_overrides is not None:
        if (
            not isinstance(prompt_overrides, Mapping)
            or not prompt_overrides
            or not all(isinstance(v, Mapping) for v in prompt_overrides.values())
        ):
            raise InvalidReexecution(
                "promptOverrides is an object: step id -> {system?, prompt?}", field="promptOverrides"
            )
        prompts = {str(k): dict(v) for k, v in prompt_overrides.items()}
    batch_id, now = _new_public_id("rxb"), clock.now()
    made = []
    for run_id in ids:
        run = runs[run_id]
        run.workspace = workspace
        run_input = inputs.get(run_id, NOT_GIVEN)
        _check_request(run, mode=mode, from_step=None, input=run_input, model_overrides=overrides, reason=reason)
        check_models_here(workspace, run_id, overrides, workflow)
        if prompts:
            name = workflow or workflow_of_run(workspace, run_id)
            try:
                target = registered_workflow(name) if name else None
            except UnknownWorkflow:
                target = None  # executed by an external harness, which gets the overrides as they are
            prompts = check_prompt_overrides(target, prompts) if target is not None else prompts
        made.append(
            _create(
                workspace=workspace,
                run=run,
                mode=mode,
                reason=reason,
                by=by,
                from_step=None,
                input=run_input,
                model_overrides=overrides,
                batch_id=batch_id,
                now=now,
                prompt_overrides=prompts,
                workflow=workflow,
                workflow_version=workflow_version,
            )
        )
    return batch_id, made


# --- decide ------------------------------------------------------------------------------------


def _decidable(workspace: Workspace, public_id: str, by: User) -> list[ReexecutionRequest]:
    """The request (and, for a batch, its siblings), locked; refuses keys, outsiders and roles below approver."""
    if isinstance(by, ApiKey):
        raise Forbidden("approval is always a human in a console session; API keys cannot approve or deny")
    _require_member(by, workspace, Role.APPROVER)
    request = lock_request(workspace, public_id)
    if not request.batch_id:
        return [request]
    return list(
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(workspace=workspace, batch_id=request.batch_id)
        .order_by("pk")
    )


def _refuse_undecidable(
    requests: list[ReexecutionRequest], by: User, now: datetime, *, approving: bool
) -> LedgerError | None:
    first = requests[0]
    if any(r.status == Status.EXPIRED for r in requests):
        return ApprovalExpired(
            f"re-execution {first.public_id} expired at {clock.iso(first.expires_at)}",
            reexecutionId=first.public_id,
            expiresAt=clock.iso(first.expires_at),
        )
    decided = [r for r in requests if r.status != Status.PENDING_APPROVAL]
    if decided:
        return NotPending(
            f"re-execution {decided[0].public_id} is {decided[0].status}, not pending approval",
            reexecutionId=decided[0].public_id,
            status=decided[0].status,
        )
    # Four eyes both ways (docs/design.md §2: approvers decide other people's requests, never their
    # own): a request is not withdrawn by denying it oneself; another approver denies it, or it expires.
    if any(
        r.requested_by_user_id == by.pk
        or (r.requested_by_key is not None and audit.key_owner_id(r.requested_by_key) == by.pk)
        for r in requests
    ):
        return SelfApprovalForbidden(
            f"a re-execution is {'approved' if approving else 'denied'} by another member, never by its requester "
            "(nor by the owner of the key that requested it)",
            reexecutionId=first.public_id,
        )
    if approving and any(audit.requested_by_unowned_key(r) for r in requests):
        membership = _membership(by, first.workspace)
        if membership is None or not membership.allows(Role.ADMIN):
            return Forbidden(
                "this re-execution was requested with an API key that belongs to nobody: only an admin may approve it",
                role="admin",
                reexecutionId=first.public_id,
            )
    if any(r.expires_at <= now for r in requests):
        for r in requests:
            expire(r, now, by)
        return ApprovalExpired(
            f"re-execution {first.public_id} expired at {clock.iso(first.expires_at)}",
            reexecutionId=first.public_id,
            expiresAt=clock.iso(first.expires_at),
        )
    return None


@atomic_then_refuse
def approve(
    *, workspace: Workspace, reexecution_id: str, by: User, note: str
) -> list[ReexecutionRequest] | LedgerError:
    """Approve a pending request (for a batch: all of it, one decision). Returns what was approved."""
    requests = _decidable(workspace, reexecution_id, by)
    now = clock.now()
    refusal = _refuse_undecidable(requests, by, now, approving=True)
    if refusal is not None:
        return refusal
    note = written(note, field="note", label="note", error=InvalidReexecution, workspace=workspace)
    runs = {r.run_id: r for r in selectors.runs(workspace).filter(run_id__in=[q.original_run_id for q in requests])}
    changed = []
    for request in requests:
        run = runs.get(request.original_run_id)
        if run is None:
            changed.append(request.original_run_id)
            continue
        run.workspace = workspace
        last_sequence, plan_digest = _run_shape(run)
        if (last_sequence, plan_digest) != (request.last_sequence, request.plan_digest) or _digest_of(
            request, last_sequence, plan_digest
        ) != request.digest:
            changed.append(request.original_run_id)
    if changed:
        return PlanChanged(
            f"run {changed[0]} changed since the request was made; ask again to approve what it is now",
            reexecutionId=reexecution_id,
            runIds=changed,
        )
    for request in requests:
        _mark_approved(request, now)
        request.approver, request.approver_name = by, by.get_username()
        request.note, request.decided_at = note.strip(), now
        request.save()
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=Action.REEXECUTION_APPROVED,
            target=request.public_id,
            reason=request.note,
            details={
                "runId": request.original_run_id,
                "digest": request.digest,
                "newRunId": request.new_run_id,
                "executor": request.executor,
                **({"batchId": request.batch_id} if request.batch_id else {}),
            },
        )
        _enqueue_after_save(request)
        announce_change(request)
    return requests


@atomic_then_refuse
def deny(*, workspace: Workspace, reexecution_id: str, by: User, note: str) -> list[ReexecutionRequest] | LedgerError:
    """Deny a pending request (for a batch: all of it) with a note."""
    requests = _decidable(workspace, reexecution_id, by)
    now = clock.now()
    refusal = _refuse_undecidable(requests, by, now, approving=False)
    if refusal is not None:
        return refusal
    note = written(note, field="note", label="note", error=InvalidReexecution, workspace=workspace)
    for request in requests:
        request.status, request.updated_at = Status.DENIED, now
        request.approver, request.approver_name = by, by.get_username()
        request.note, request.decided_at = note.strip(), now
        request.save()
        audit.record(
            actor=by,
            tenant=workspace.tenant,
            workspace=workspace,
            action=Action.REEXECUTION_DENIED,
            target=request.public_id,
            reason=request.note,
            details={"runId": request.original_run_id, **({"batchId": request.batch_id} if request.batch_id else {})},
        )
        announce_change(request)
    return requests


def approve_by_policy(
    *, workspace: Workspace, batch_id: str, policy_id: str, policy_digest: str
) -> list[ReexecutionRequest]:
    """Approve a pending batch under an evaluation policy an approver approved beforehand
    (ledger/evaluation/policies.py decides that it covers the batch): the approver is the policy,
    `policy:<id>`, in the request and its audit entry. Runs in the caller's transaction."""
    now = clock.now()
    requests = list(
        ReexecutionRequest.objects.select_for_update(of=("self",))
        .select_related("workspace__tenant")
        .filter(workspace=workspace, batch_id=batch_id, status=Status.PENDING_APPROVAL)
        .order_by("pk")
    )
    name = f"policy:{policy_id}"
    for request in requests:
        _mark_approved(request, now)
        request.approver_name, request.decided_at = name, now
        request.note = f"inside evaluation policy {policy_id}"
        request.save()
        audit.record(
            actor=audit.Actor(name=name),
            tenant=workspace.tenant,
            workspace=workspace,
            action=Action.REEXECUTION_APPROVED,
            target=request.public_id,
            reason=request.note,
            details={
                "runId": request.original_run_id,
                "digest": request.digest,
                "newRunId": request.new_run_id,
                "executor": request.executor,
                "batchId": batch_id,
                "policyId": policy_id,
                "policyDigest": policy_digest,
            },
        )
        _enqueue_after_save(request)
        announce_change(request)
    return requests
