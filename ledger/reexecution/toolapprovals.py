"""A tool call's decision that hands its run to the worker (docs/api.md "Run control").

The decision itself is ledger/replay/toolapproval.py's (the approver, the digest, the audit entry,
the event in the run's log). Deciding also puts a task on the durable queue the built-in worker
executes re-execution requests from (tasks.py): the worker resumes the run, which reaches the
call again. Approved for these arguments, the call runs and the run goes on to its end or its next
wait; rejected, the call fails its step as a failed tool call does (the step's retries and the
run's failure follow as for any failure). With the database backend the task is stored in the
decision's own transaction, so a decision never commits without it.

A call of a sub-run is resumed through the run at the top of its tree: the parent waited with
its sub-run, and resuming it resumes the sub-run where it stopped.
"""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models import Q

from .. import clock
from ..models import Event, Run, RunStatus, ToolCall, Workspace
from ..replay import toolapproval
from . import execution
from .tasks import enqueue_resume, resume_after_approval

DECISIONS = ("harness.tool_call.approved", "harness.tool_call.rejected")


@transaction.atomic
def decide(
    *, workspace: Workspace, run_id: str, call_id: str, approve: bool, seen_digest: str, note: str, by: Any
) -> ToolCall:
    """toolapproval.decide, and the run's resume queued for the worker."""
    call = toolapproval.decide(
        workspace=workspace,
        run_id=run_id,
        call_id=call_id,
        approve=approve,
        seen_digest=seen_digest,
        note=note,
        by=by,
    )
    run = Run.objects.only("run_id", "root_run_id", "last_sequence").get(workspace=workspace, run_id=run_id)
    enqueue_resume(workspace.pk, run.root_run_id or run.run_id, _decision(run))
    return call


def _decision(run: Run) -> str:
    """Which decision a resume task is for: the run the call belongs to and the decision's sequence
    (its last, right after the decision). It names the task, so a lost one can be told apart."""
    return f"{run.run_id}#{run.last_sequence}"


def recover_lost() -> list[str]:
    """Queue again the resume of every unfinished run whose last event is a tool call's decision
    older than a lease (RUNLEDGER_REEXEC_LEASE_SECONDS), when no task was ever queued for that very
    decision: the task was lost (a queue on another backend, a database restored without it). A
    resume that was taken and refused is not queued again (its refusal is in the worker's log, and
    `ledger resume` continues the run). Swept by the worker (worker.sweep). The run ids queued."""
    from django_tasks_db.models import DBTaskResult

    cutoff = clock.now() - execution.lease_ttl()
    decided = (
        ToolCall.objects.filter(Q(status="approved") | Q(status="failed", error__name=toolapproval.REJECTED))
        .exclude(run__status__in=RunStatus.finished())
        .values("run_id")
    )
    queued = []
    for run in Run.objects.filter(pk__in=decided).only("pk", "workspace_id", "run_id", "root_run_id", "last_sequence"):
        last = Event.objects.filter(run=run, sequence=run.last_sequence).values_list("type", "recorded_at").first()
        if last is None or last[0] not in DECISIONS or last[1] > cutoff:
            continue
        target, decision = run.root_run_id or run.run_id, _decision(run)
        args = [run.workspace_id, target, decision]
        if DBTaskResult.objects.filter(task_path=resume_after_approval.module_path, args_kwargs__args=args).exists():
            continue
        enqueue_resume(run.workspace_id, target, decision)
        queued.append(run.run_id)
    return queued
