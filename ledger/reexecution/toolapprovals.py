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

from ..models import Run, ToolCall, Workspace
from ..replay import toolapproval
from .tasks import enqueue_resume


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
    run = Run.objects.only("run_id", "root_run_id").get(workspace=workspace, run_id=run_id)
    enqueue_resume(workspace.pk, run.root_run_id or run.run_id)
    return call
