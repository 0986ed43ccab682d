"""Human approval before a write leaves (docs/design.md §2 roles, §5 item 3): a tool declared
`approval="required"`, or named by its workspace's policy (`Workspace.approval_tools`), does not
run until an approver who is not the run's requester approves that exact call.

The wait is a state of the tool call, not of the run: the run's status stays `running` (docs/api.md
keeps run statuses to pending | running | completed | failed) while a call of it is
`waiting_approval`. Everything is in the run's log, through the one write path:

- `harness.tool_call.approval_requested {callId, toolName, args, argsDigest, stepPath?, caller}`:
  the executor met the call, wrote the exact arguments and their digest, gave the run's lease back
  and stopped (`WaitingApproval`). Nothing left: the gateway has no claim of the call yet.
- `harness.tool_call.approved {callId, argsDigest, by, note}` or
  `harness.tool_call.rejected {callId, argsDigest, by, note, error}`: an approver decided, on the
  Approvals page (the one re-execution uses), bound to the digest they saw. A rejected call is
  failed (`ToolCallRejected`) and never runs; its step fails as a failed tool call does.

On resume (`ledger resume RUN`) the executor reaches the call again with the arguments it
computes now: approved with the same digest, the call runs (once: the gateway's idempotency key
is the call's); other arguments than the ones approved need a new approval (a new request); still
pending, the run stops again without writing anything.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.db import transaction

from .. import audit, clock
from ..errors import Conflict, LedgerError, NotFound, RunFinished
from ..limits import MAX_TEXT, written
from ..log import holding
from ..models import ApiKey, Membership, ReexecutionRequest, Role, Run, RunStatus, ToolCall, Workspace
from ..reads import attention
from . import gateway

WAITING = "waiting_approval"
REJECTED = "ToolCallRejected"
MAX_NOTE = MAX_TEXT


class ToolCallNotWaiting(Conflict):
    code = "tool_call_not_waiting"


class ApprovalStale(Conflict):
    """The arguments the approver saw are no longer the ones waiting."""

    code = "approval_stale"


class SelfApprovalForbidden(LedgerError):
    code = "self_approval_forbidden"
    status = 403


class ApproverRequired(LedgerError):
    code = "forbidden"
    status = 403


class InvalidDecision(LedgerError):
    code = "invalid_request"


def needs_approval(workspace: Workspace, tool_name: str, declared: str | None) -> bool:
    """Whether calls of the tool wait for an approver: declared so, or named by the workspace."""
    return declared == "required" or tool_name in (workspace.approval_tools or [])


args_digest = attention.args_digest


@dataclass(frozen=True)
class Verdict:
    """What the executor does with a call that needs approval."""

    proceed: bool  # approved for these arguments: claim it and run it
    request: dict[str, Any] | None = None  # the approval_requested event to write before stopping
    args_digest: str = ""


def verdict(
    *,
    workspace: Workspace,
    approval: Any,
    tool_name: str,
    args: Any,
    call_id: str,
    step_path: str,
    caller: str,
    turn: int | None,
) -> Verdict:
    """Given what the log says of the call's approval (the fold's `ToolCallState.approval`), go on,
    or stop, with a request to write when none waits for these very arguments."""
    redacted, _ = gateway.prepare_args(workspace, tool_name, args)
    wanted = args_digest(tool_name, redacted)
    if isinstance(approval, dict) and approval.get("argsDigest") == wanted:
        if approval.get("status") == "approved":
            return Verdict(proceed=True, args_digest=wanted)
        if approval.get("status") == "pending":
            return Verdict(proceed=False, args_digest=wanted)  # still waiting: nothing new to write
    payload: dict[str, Any] = {
        "callId": call_id,
        "toolName": tool_name,
        "args": redacted,
        "argsDigest": wanted,
        "stepPath": step_path,
        "caller": caller,
    }
    if turn is not None:
        payload["turn"] = turn
    if isinstance(approval, dict) and approval.get("argsDigest") not in (None, wanted):
        payload["supersedes"] = approval.get("argsDigest")  # the arguments changed since the last request
    return Verdict(
        proceed=False, args_digest=wanted, request={"type": "harness.tool_call.approval_requested", "payload": payload}
    )


# --- the approver's side ---------------------------------------------------------------------


def requester_of(run: Run) -> str | None:
    """Who asked for the run, as the server recorded it, never as a payload claims it: the
    re-execution request that made it (its requester), else who appended its RunStarted
    (`Run.started_by`: a username, or `key:<prefix>` whose owner counts as them, set by the write
    door from the caller's session or key). A sub-run, or a run a `system:` principal started
    (the runtime, the re-execution worker), is its root run's. None when unknown."""
    fallback: str | None = None
    for run_id in dict.fromkeys([run.run_id, run.root_run_id or run.run_id]):
        made = ReexecutionRequest.objects.filter(workspace=run.workspace, new_run_id=run_id).order_by("pk").first()
        if made is not None:
            return made.requested_by
        starter = (
            run.started_by
            if run_id == run.run_id
            else Run.objects.filter(workspace=run.workspace, run_id=run_id).values_list("started_by", flat=True).first()
        )
        if starter and not starter.startswith("system:"):
            return starter
        fallback = fallback or starter or None
    return fallback


def is_requester(requester: str | None, workspace: Workspace, user: Any) -> bool:
    """Whether `user` asked for the run: they are its requester, or own the API key that is
    (`key:<prefix>`, its owner read from the key's `api_key.created` entry)."""
    if requester is None or not getattr(user, "is_authenticated", False):
        return False
    if requester == user.get_username():
        return True
    if not requester.startswith("key:"):
        return False
    key = ApiKey.objects.filter(workspace=workspace, prefix=requester.removeprefix("key:")).first()
    return key is not None and audit.key_owner_id(key) == user.pk


def started_by_unowned_key(requester: str | None, workspace: Workspace) -> bool:
    """Whether the run was started with an API key that belongs to nobody (made without
    `--owner`, or gone since): no person answers for it, so only an admin may approve its calls,
    with a warning (as a re-execution requested with such a key)."""
    if requester is None or not requester.startswith("key:"):
        return False
    key = ApiKey.objects.filter(workspace=workspace, prefix=requester.removeprefix("key:")).first()
    return key is None or audit.key_owner_id(key) is None


def waiting_calls(workspace: Workspace) -> list[ToolCall]:
    """The workspace's tool calls waiting for an approver, oldest first, of runs still running."""
    calls = list(
        ToolCall.objects.select_related("run")
        .filter(run__workspace=workspace, status=WAITING)
        .exclude(run__status__in=RunStatus.finished())
        .order_by("run__created_at", "run_id", "position")
    )
    for call in calls:
        call.run.workspace = workspace
    return calls


def pending_digest(call: ToolCall) -> str:
    return args_digest(call.tool_name, call.args)


@transaction.atomic
def decide(
    *, workspace: Workspace, run_id: str, call_id: str, approve: bool, seen_digest: str, note: str, by: Any
) -> ToolCall:
    """An approver approves or rejects the waiting call `call_id` of `run_id`, bound to the
    arguments' digest they saw (`seen_digest`); audited. Refusals: not an approver (403
    forbidden), the run's requester (403 self_approval_forbidden), no such call (404), a call not
    waiting (409 tool_call_not_waiting), other arguments waiting now (409 approval_stale), the
    run ended (409 run_finished), approving below admin a call of a run an API key that belongs
    to nobody started (403 forbidden)."""
    note = written(note, field="note", label="note", error=InvalidDecision, workspace=workspace)
    membership = Membership.objects.filter(user=by, tenant=workspace.tenant).first()
    if membership is None or not membership.allows(Role.APPROVER):
        raise ApproverRequired("deciding a tool call needs the approver role", role="approver")
    head = holding(workspace=workspace, run_id=run_id)
    run = head.run
    call = ToolCall.objects.filter(run=run, call_id=call_id).first()
    if call is None:
        raise NotFound(f"tool call {call_id} not found in run {run_id}", runId=run_id, callId=call_id)
    if run.status in RunStatus.finished():
        raise RunFinished(f"run {run_id} already ended ({run.status})", runId=run_id, status=run.status)
    if call.status != WAITING:
        raise ToolCallNotWaiting(
            f"tool call {call_id} is {call.status}, not waiting for approval", callId=call_id, status=call.status
        )
    current = pending_digest(call)
    if seen_digest != current:
        raise ApprovalStale(
            "the arguments waiting for approval changed since you looked: review them again",
            callId=call_id,
            argsDigest=current,
        )
    requester = requester_of(Run.objects.select_related("workspace").get(pk=run.pk))
    name = by.get_username()
    if is_requester(requester, workspace, by):
        raise SelfApprovalForbidden(
            "you requested this run; another approver must decide its tool calls", callId=call_id
        )
    if approve and not membership.allows(Role.ADMIN) and started_by_unowned_key(requester, workspace):
        raise ApproverRequired(
            "this run was started with an API key that belongs to nobody: only an admin may approve its tool calls",
            role="admin",
            callId=call_id,
        )
    payload: dict[str, Any] = {
        "callId": call_id,
        "argsDigest": current,
        "by": name,
        "note": note,
        "toolName": call.tool_name,
    }
    if call.step_path:
        payload["stepPath"] = call.step_path
    if not approve:
        payload["error"] = {"name": REJECTED, "message": f"rejected by {name}: {note}"}
    head.append(
        [{"type": f"harness.tool_call.{'approved' if approve else 'rejected'}", "payload": payload}],
        fencing_token=head.holder_token(clock.now()),
    )
    audit.record(
        actor=by,
        tenant=workspace.tenant,
        workspace=workspace,
        action=audit.Action.TOOL_CALL_APPROVED if approve else audit.Action.TOOL_CALL_REJECTED,
        target=f"{run_id}/{call_id}",
        reason=note,
        details={"runId": run_id, "callId": call_id, "toolName": call.tool_name, "argsDigest": current},
    )
    call.refresh_from_db()
    return call
