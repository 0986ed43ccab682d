"""A run's attention: what a person must do for it to move on (ledger/reads/attention.py), and how a
failed run ended (ledger/reads/failure.py). Each state is made the way it happens — the runtime
stopping at a call that needs an approver, an executor dying with a refund request out, a harness
recording a failed attempt with its retry moment, an operator asking for a re-execution — and
read back from the projections, which `ledger verify` checks after every test (every_run_verifies)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User

from ledger.demo import workflows
from ledger.log import append
from ledger.log.envelopes import format_recorded_at
from ledger.models import Run, Workspace
from ledger.reads import attention, failure, selectors
from ledger.reexecution import services, toolapprovals
from ledger.replay import toolapproval
from ledger.replay.cancellation import cancel_run
from ledger.replay.gateway import ToolCallInDoubt, settle_expired_claims
from ledger.runtime.executor import resume_run, start_run
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("clock")]

GOODWILL = {"ticket": "Late twice.", "orderId": "B-2", "amount": 25}


def _run(workspace: Workspace, run_id: str) -> Run:
    return Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=run_id)


def _needs(workspace: Workspace, run_id: str) -> attention.Attention | None:
    return attention.of_run(_run(workspace, run_id))


def _matching(workspace: Workspace, kind: str) -> set[str]:
    return set(attention.matching(selectors.filtered_runs(workspace), workspace, kind).values_list("run_id", flat=True))


def _waiting_run(workspace: Workspace, run_id: str = "run_credit", requested_by: str = "carol") -> None:
    outcome = start_run(
        workspace=workspace, workflow="support.goodwill", input=GOODWILL, run_id=run_id, requested_by=requested_by
    )
    assert outcome.status == "waiting_approval"


def _retrying(workspace: Workspace, run_id: str, retry_at: str) -> None:
    append(
        workspace=workspace,
        run_id=run_id,
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_sync"}},
            {"type": "StepScheduled", "payload": {"stepPath": "push"}},
            {"type": "StepAttemptStarted", "payload": {"stepPath": "push", "attempt": 1}},
            {
                "type": "StepFailed",
                "payload": {
                    "stepPath": "push",
                    "attempt": 1,
                    "error": {"name": "Upstream503", "message": "maintenance", "retriable": True, "retryAt": retry_at},
                },
            },
        ],
    )


def test_a_run_stopped_at_a_call_that_needs_an_approver_waits_for_tool_approval(workspace: Workspace) -> None:
    _waiting_run(workspace)

    needs = _needs(workspace, "run_credit")
    call = toolapproval.waiting_calls(workspace)[0]
    assert needs is not None and needs.kind == "waiting_tool_approval"
    assert needs.detail == {
        "callId": call.call_id,
        "toolName": "send_goodwill_credit",
        "stepPath": "credit",
        "argsDigest": toolapproval.pending_digest(call),
    }
    assert needs.since is not None and needs.to_json()["since"].endswith("Z")
    assert _run(workspace, "run_credit").status == "running"  # the statuses of docs/api.md are kept
    assert _matching(workspace, "waiting_tool_approval") == {"run_credit"} == _matching(workspace, "any")
    assert _matching(workspace, "tool_call_in_doubt") == set()


def test_an_approved_call_leaves_no_attention_and_a_decided_run_is_resumed_by_the_worker(
    workspace: Workspace, approver: User, settings: Any, django_capture_on_commit_callbacks: Any
) -> None:
    settings.TASKS = {
        "default": {
            "BACKEND": "django_tasks.backends.immediate.ImmediateBackend",
            "QUEUES": ["default", "reexecutions"],
        }
    }
    _waiting_run(workspace)
    call = toolapproval.waiting_calls(workspace)[0]

    with django_capture_on_commit_callbacks(execute=True):
        toolapprovals.decide(
            workspace=workspace,
            run_id="run_credit",
            call_id=call.call_id,
            approve=True,
            seen_digest=toolapproval.pending_digest(call),
            note="fair",
            by=approver,
        )

    run = _run(workspace, "run_credit")
    assert (run.status, run.output) == ("completed", {"credited": "gc-B-2"})
    assert _needs(workspace, "run_credit") is None and _matching(workspace, "any") == set()


def test_a_decision_queues_the_resume_in_its_own_transaction(workspace: Workspace, approver: User) -> None:
    from django_tasks_db.models import DBTaskResult

    _waiting_run(workspace)
    call = toolapproval.waiting_calls(workspace)[0]
    assert not DBTaskResult.objects.exists()

    toolapprovals.decide(
        workspace=workspace,
        run_id="run_credit",
        call_id=call.call_id,
        approve=False,
        seen_digest=toolapproval.pending_digest(call),
        note="no credit is due",
        by=approver,
    )

    [task] = DBTaskResult.objects.all()
    decision = f"run_credit#{_run(workspace, 'run_credit').last_sequence}"
    assert task.task_path.endswith("resume_after_approval")
    assert task.args_kwargs["args"] == [workspace.pk, "run_credit", decision]
    assert resume_run(workspace=workspace, run_id="run_credit").status == "failed"  # what the task does
    ended = failure.of_run(_run(workspace, "run_credit"))
    assert ended is not None and not ended.cancelled and ended.step_path == "credit"


def test_a_call_whose_request_left_before_the_executor_died_is_in_doubt(workspace: Workspace, clock: Any) -> None:
    workflows.CRASH_ON_REFUND.add("C-3")
    with pytest.raises(workflows.DemoCrash):
        start_run(
            workspace=workspace,
            workflow="support.refund",
            run_id="run_refund",
            input={"ticket": "Lost parcel.", "orderId": "C-3", "amount": 49.9},
        )
    assert _needs(workspace, "run_refund") is None  # the lease still runs: nobody knows yet

    clock.advance(hours=1)
    settle_expired_claims(workspace=workspace, run_id="run_refund")
    with pytest.raises(ToolCallInDoubt):
        resume_run(workspace=workspace, run_id="run_refund")

    needs = _needs(workspace, "run_refund")
    assert needs is not None and needs.kind == "tool_call_in_doubt"
    assert needs.detail["toolName"] == "issue_refund" and "argsDigest" not in needs.detail
    assert needs.since is not None and needs.since < clock.now()  # when the call was made, an hour ago
    assert _matching(workspace, "tool_call_in_doubt") == {"run_refund"}


def test_a_failed_attempt_with_a_recorded_retry_moment_is_a_scheduled_retry(workspace: Workspace, clock: Any) -> None:
    retry_at = format_recorded_at(clock.now() + timedelta(minutes=30))
    _retrying(workspace, "run_sync", retry_at)

    needs = _needs(workspace, "run_sync")
    assert needs is not None and needs.kind == "retry_scheduled"
    assert needs.detail == {
        "stepPath": "push",
        "attempt": 1,
        "retryAt": retry_at,
        "error": {"name": "Upstream503", "message": "maintenance"},
    }
    assert needs.retry_at is not None and format_recorded_at(needs.retry_at) == retry_at
    assert _matching(workspace, "retry_scheduled") == {"run_sync"}

    append(
        workspace=workspace,
        run_id="run_sync",
        events=[{"type": "StepAttemptStarted", "payload": {"stepPath": "push", "attempt": 2}}],
    )
    assert _needs(workspace, "run_sync") is None  # the retry started


def test_a_re_execution_waiting_for_approval_shows_on_its_finished_original(
    workspace: Workspace, operator: User, approver: User
) -> None:
    assert start_run(workspace=workspace, workflow="support.triage", input={"ticket": "Where?"}, run_id="run_t").status
    asked = services.request_reexecution(
        workspace=workspace, run_id="run_t", mode="rerun", reason="flaky answer", by=operator
    )

    needs = _needs(workspace, "run_t")
    assert needs is not None and needs.kind == "reexecution_pending"
    assert needs.detail == {"reexecutionId": asked.public_id, "mode": "rerun", "requestedBy": operator.username}
    assert _matching(workspace, "reexecution_pending") == {"run_t"}

    services.deny(workspace=workspace, reexecution_id=asked.public_id, by=approver, note="not now")
    assert _needs(workspace, "run_t") is None and _matching(workspace, "any") == set()


def test_the_most_urgent_need_shows_and_the_filter_finds_every_need(
    workspace: Workspace, operator: User, clock: Any
) -> None:
    _retrying(workspace, "run_both", format_recorded_at(clock.now() + timedelta(hours=1)))
    services.request_reexecution(workspace=workspace, run_id="run_both", mode="rerun", reason="r", by=operator)

    needs = _needs(workspace, "run_both")
    assert needs is not None and needs.kind == "reexecution_pending"  # before retry_scheduled
    assert _matching(workspace, "retry_scheduled") == {"run_both"} == _matching(workspace, "reexecution_pending")


def test_a_cancelled_run_reads_cancelled_with_its_reason_and_waits_for_nothing(
    workspace: Workspace, operator: User
) -> None:
    _waiting_run(workspace, "run_stop")
    cancel_run(workspace=workspace, run_id="run_stop", reason="the customer withdrew", by=operator)

    run = _run(workspace, "run_stop")
    assert run.status == "failed" and failure.is_cancelled(run)
    assert failure.of_run(run) == failure.Failure(
        cancelled=True, name="Cancelled", message="the customer withdrew", step_path=None
    )
    assert _needs(workspace, "run_stop") is None and _matching(workspace, "any") == set()


def test_a_failed_run_names_its_error_and_the_step_that_failed(workspace: Workspace) -> None:
    append(
        workspace=workspace,
        run_id="run_broke",
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}},
            {"type": "StepScheduled", "payload": {"stepPath": "fetch"}},
            {"type": "StepAttemptStarted", "payload": {"stepPath": "fetch", "attempt": 1}},
            {
                "type": "StepFailed",
                "payload": {"stepPath": "fetch", "attempt": 1, "error": {"name": "Timeout", "message": "30 s"}},
            },
            {"type": "RunFailed", "payload": {"error": {"name": "Timeout", "message": "30 s"}}},
        ],
    )
    run = _run(workspace, "run_broke")
    assert failure.of_run(run) == failure.Failure(cancelled=False, name="Timeout", message="30 s", step_path="fetch")
    assert not failure.is_cancelled(run) and attention.of_run(run) is None


def test_attention_of_a_page_of_runs_is_read_in_three_queries(
    workspace: Workspace, operator: User, clock: Any, django_assert_num_queries: Any
) -> None:
    _waiting_run(workspace, "run_a")
    _waiting_run(workspace, "run_b")
    _retrying(workspace, "run_c", format_recorded_at(clock.now() + timedelta(hours=1)))
    runs = list(selectors.filtered_runs(workspace))

    with django_assert_num_queries(3):
        found = attention.for_runs(workspace, runs)

    assert {k: v.kind for k, v in found.items()} == {
        "run_a": "waiting_tool_approval",
        "run_b": "waiting_tool_approval",
        "run_c": "retry_scheduled",
    }


def test_the_approvals_badge_counts_what_the_page_lists(workspace: Workspace, operator: User) -> None:
    _waiting_run(workspace, "run_a")
    assert start_run(workspace=workspace, workflow="support.triage", input={"ticket": "?"}, run_id="run_t").status
    services.request_reexecution(workspace=workspace, run_id="run_t", mode="rerun", reason="r", by=operator)

    assert attention.waiting_for_approvers(workspace) == 2  # one request card, one tool call card


def test_the_sweep_queues_again_a_lost_resume_of_a_decided_call_once(
    workspace: Workspace, approver: User, clock: Any
) -> None:
    from django_tasks_db.models import DBTaskResult

    from ledger.reexecution import worker

    _waiting_run(workspace)
    call = toolapproval.waiting_calls(workspace)[0]
    toolapprovals.decide(
        workspace=workspace,
        run_id="run_credit",
        call_id=call.call_id,
        approve=True,
        seen_digest=toolapproval.pending_digest(call),
        note="fair",
        by=approver,
    )
    [queued] = DBTaskResult.objects.all()
    clock.advance(hours=1)
    assert worker.sweep()["resumed"] == []  # its task is there: nothing is lost

    DBTaskResult.objects.all().delete()  # lost (a queue restored without it)
    assert worker.sweep()["resumed"] == ["run_credit"]
    [again] = DBTaskResult.objects.all()
    assert again.args_kwargs == queued.args_kwargs
    assert worker.sweep()["resumed"] == []  # queued once

    assert resume_run(workspace=workspace, run_id="run_credit").status == "completed"  # what the task does
    DBTaskResult.objects.all().delete()
    assert worker.sweep()["resumed"] == []  # the run went on: nothing to resume


def test_the_sweep_leaves_a_fresh_decision_to_its_own_task(workspace: Workspace, approver: User) -> None:
    from django_tasks_db.models import DBTaskResult

    from ledger.reexecution import worker

    _waiting_run(workspace)
    call = toolapproval.waiting_calls(workspace)[0]
    toolapprovals.decide(
        workspace=workspace,
        run_id="run_credit",
        call_id=call.call_id,
        approve=False,
        seen_digest=toolapproval.pending_digest(call),
        note="no",
        by=approver,
    )
    DBTaskResult.objects.all().delete()
    assert worker.sweep()["resumed"] == []  # younger than a lease: its task may still be on its way


def test_the_index_of_unfinished_runs_leaves_out_exactly_the_finished_statuses() -> None:
    """The navigation's badge finds what waits among the runs still going through the partial
    index run_unfinished (migration 0035), whose condition must stay the query's."""
    from django.db.models import Q

    from ledger.models import Run, RunStatus

    index = next(i for i in Run._meta.indexes if i.name == "run_unfinished")
    assert index.condition == ~Q(status__in=list(RunStatus.finished()))
