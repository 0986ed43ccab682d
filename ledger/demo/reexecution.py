"""The demo's re-executions (part of `ledger demo`): one of each state a newcomer should see, made
through the real request services and executed by the built-in worker's own task body.

On `acme/support`'s run_demo_triage:
- a fork waiting for approval, requested by carol;
- a fork from `normalize` with another order id, approved by bob and executed: its output changed,
  and its divergence report shows where;
- a simulation (no approval) that reproduced the original exactly;
- a rerun bob denied.

Idempotent: each is recognised by its reason. The waiting fork is asked again when the previous
one has expired (approvals expire after RUNLEDGER_APPROVAL_TTL_HOURS), so there is always one.
"""

from __future__ import annotations

from django.contrib.auth.models import User

from ..models import ReexecutionRequest, Workspace
from ..reads import reexecutions
from ..reexecution import executor, services

RUN = "run_demo_triage"
WAITING = "Does the draft hold up with the new knowledge-base prompt? Please approve a fork from draft."
CHANGED = "What would the customer have been told had order D-4 (delivered) been the one asked about?"
SIMULATED = "Check that the record replays this run exactly before we change the triage prompt."
DENIED = "Run the whole triage again against the live order system."
Status = ReexecutionRequest.Status


def lay_out(workspace: Workspace) -> None:
    carol, bob = User.objects.get(username="carol"), User.objects.get(username="bob")
    asked = reexecutions.of_run(workspace, RUN)

    def missing(reason: str) -> bool:
        return not asked.filter(reason=reason).exists()

    if missing(SIMULATED):
        made = services.request_reexecution(
            workspace=workspace, run_id=RUN, mode="simulate", reason=SIMULATED, by=carol
        )
        executor.run_request(request_pk=made.pk)
    if missing(CHANGED):
        made = services.request_reexecution(
            workspace=workspace,
            run_id=RUN,
            mode="fork",
            from_step="normalize",
            reason=CHANGED,
            by=carol,
            input={"ticket": "Where is my parcel?", "orderId": "D-4"},
        )
        services.approve(
            workspace=workspace, reexecution_id=made.public_id, by=bob, note="Read-only lookups only; go ahead."
        )
        executor.run_request(request_pk=made.pk)
    if missing(DENIED):
        made = services.request_reexecution(workspace=workspace, run_id=RUN, mode="rerun", reason=DENIED, by=carol)
        services.deny(
            workspace=workspace,
            reexecution_id=made.public_id,
            by=bob,
            note="A rerun calls the order system live; use evaluate against the record instead.",
        )
    if not asked.filter(reason=WAITING, status=Status.PENDING_APPROVAL).exists():
        services.request_reexecution(
            workspace=workspace, run_id=RUN, mode="fork", from_step="draft", reason=WAITING, by=carol
        )
