"""The durable queue's task: an approved request, executed by the built-in worker.

The database backend (django-tasks-db) stores the task in the same transaction as the approval,
so an approval never commits without its task; other backends (the immediate one in tests)
enqueue after commit instead, so the execution never runs inside the approving transaction.
A duplicate task is harmless: `execution.start` hands a request to one live worker only.
"""

from __future__ import annotations

from django.db import transaction
from django_tasks import task
from django_tasks_db import DatabaseBackend

from .executor import resume_approved, run_request

QUEUE = "reexecutions"


@task(queue_name=QUEUE)
def execute_request(request_pk: int) -> str:
    return run_request(request_pk=request_pk)


def enqueue(request_pk: int) -> None:
    if isinstance(execute_request.get_backend(), DatabaseBackend):
        execute_request.enqueue(request_pk)
    else:
        transaction.on_commit(lambda: execute_request.enqueue(request_pk))


@task(queue_name=QUEUE)
def resume_after_approval(workspace_pk: int, run_id: str, decision: str) -> str:
    """A run one of whose tool calls an approver decided (toolapprovals.py), resumed by the worker.
    `decision` (`<runId>#<sequence>`) names the decision the task is for."""
    return resume_approved(workspace_pk=workspace_pk, run_id=run_id)


def enqueue_resume(workspace_pk: int, run_id: str, decision: str) -> None:
    if isinstance(resume_after_approval.get_backend(), DatabaseBackend):
        resume_after_approval.enqueue(workspace_pk, run_id, decision)
    else:
        transaction.on_commit(lambda: resume_after_approval.enqueue(workspace_pk, run_id, decision))
