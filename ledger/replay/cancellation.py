"""Cancelling a run (docs/api.md "Run control"): `RunFailed {error: {name: "Cancelled", message: reason}}`.

The cancel is written to the log at once, in one transaction with the run's head locked, whether
or not an executor holds the run: the tool calls still claimed are settled (a write call whose
request left becomes in doubt, every other call is abandoned, failed with `Cancelled`), then
`RunFailed` ends the run. An executor that holds the run learns of it from the log, at its next
write (its next boundary): the append path refuses every write after `RunFailed` (`run_finished`,
or `lease_lost` for the completion of a call settled here), and the executor stops there and
reports the cancelled outcome (ledger/runtime/executor.py). One write path, the log the authority:
no flag on the side, no signal between processes. The unfinished sub-runs of the run are
cancelled with it (with the same reason), deepest first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.db import transaction

from .. import audit, clock
from ..errors import LedgerError, NotFound, RunFinished
from ..limits import MAX_TEXT, written
from ..log import holding
from ..models import Run, RunStatus, ToolCall, Workspace
from . import gateway

CANCELLED = "Cancelled"
UNCLAIMED = ("waiting_approval", "approved")  # tool call states before the gateway (ledger/replay/toolapproval.py)
MAX_REASON = MAX_TEXT


class InvalidCancel(LedgerError):
    code = "invalid_request"


@dataclass(frozen=True)
class Cancelled:
    run_id: str
    held: bool  # an executor held the run's lease: it stops at its next write
    abandoned: list[str] = field(default_factory=list)  # call ids failed with Cancelled
    in_doubt: list[str] = field(default_factory=list)  # write calls whose request had left
    sub_runs: list[str] = field(default_factory=list)  # unfinished sub-runs cancelled with it
    last_sequence: int = 0


def cancelled_error(reason: str) -> dict[str, Any]:
    return {"name": CANCELLED, "message": reason}


def is_cancelled(error: Any) -> bool:
    return isinstance(error, dict) and error.get("name") == CANCELLED


@transaction.atomic
def cancel_run(*, workspace: Workspace, run_id: str, reason: str, by: Any) -> Cancelled:
    """End `run_id` as cancelled; audited (`run.cancelled`). `by`: a user, an API key or a name.
    Refuses an empty reason (invalid_request), a finished run (run_finished), an unknown run (404)."""
    reason = written(reason, field="reason", label="reason", error=InvalidCancel, workspace=workspace)
    head = Run.objects.filter(workspace=workspace, run_id=run_id).values_list("status", flat=True).first()
    if head is None:
        raise NotFound(f"run {run_id} not found", runId=run_id)
    if head in RunStatus.finished():
        raise RunFinished(
            f"run {run_id} already ended ({head}); only a running run can be cancelled", runId=run_id, status=head
        )
    actor = audit.Actor.of(by)
    sub_runs = [
        r
        for child in _unfinished_children(workspace, run_id)
        for r in _cancel_tree(workspace, child, reason, actor.name)
    ]
    done = _cancel_one(workspace, run_id, reason, actor.name)
    if done is None:  # it ended between the look and the lock
        raise RunFinished(f"run {run_id} already ended; only a running run can be cancelled", runId=run_id)
    audit.record(
        actor=actor,
        tenant=workspace.tenant,
        workspace=workspace,
        action=audit.Action.RUN_CANCELLED,
        target=run_id,
        reason=reason,
        details={
            "runId": run_id,
            "held": done.held,
            "abandoned": done.abandoned,
            "inDoubt": done.in_doubt,
            "subRuns": sub_runs,
        },
    )
    return Cancelled(
        run_id=run_id,
        held=done.held,
        abandoned=done.abandoned,
        in_doubt=done.in_doubt,
        sub_runs=sub_runs,
        last_sequence=done.last_sequence,
    )


def _unfinished_children(workspace: Workspace, run_id: str) -> list[str]:
    return list(
        Run.objects.filter(workspace=workspace, parent_run_id=run_id)
        .exclude(status__in=RunStatus.finished())
        .order_by("pk")
        .values_list("run_id", flat=True)
    )


def _cancel_tree(workspace: Workspace, run_id: str, reason: str, by: str) -> list[str]:
    """Cancel `run_id` and its unfinished descendants, deepest first; the ids cancelled."""
    below = [r for child in _unfinished_children(workspace, run_id) for r in _cancel_tree(workspace, child, reason, by)]
    return below + ([run_id] if _cancel_one(workspace, run_id, reason, by) is not None else [])


def _cancel_one(workspace: Workspace, run_id: str, reason: str, by: str) -> Cancelled | None:
    head = holding(workspace=workspace, run_id=run_id)
    run = head.run
    if run.status in RunStatus.finished():
        return None
    now = clock.now()
    held = head.leased(now)
    events: list[dict[str, Any]] = []
    abandoned, in_doubt = gateway.abandon_for_cancel(run, now, events.append, reason)
    # Calls stopped before the gateway (waiting for an approver, or approved and not yet run)
    # never left: they end with the run, as abandoned.
    for call_id, step_path in (
        ToolCall.objects.filter(run=run, status__in=UNCLAIMED).values_list("call_id", "step_path").order_by("position")
    ):
        payload: dict[str, Any] = {"callId": call_id, "error": cancelled_error(reason), "durationMs": 0}
        if step_path:
            payload["stepPath"] = step_path
        events.append({"type": "harness.tool_call.failed", "payload": payload})
        abandoned.append(call_id)
    events.append({"type": "RunFailed", "payload": {"error": cancelled_error(reason), "cancelledBy": by}})
    # Written under the holder's own fencing token: the cancel is not a takeover, the holder's
    # lease stays, and its next write meets the ended run.
    last = head.append(events, fencing_token=head.holder_token(now)).last_sequence
    return Cancelled(run_id=run_id, held=held, abandoned=abandoned, in_doubt=in_doubt, last_sequence=last)
