"""Human approval before a write leaves: a tool declared `approval="required"` (or named by the
workspace's policy) stops its run at the call with the exact arguments; an approver who is not
the run's requester approves (the call then runs once) or rejects (the call fails cleanly, the
tool never runs), bound to the arguments' digest; other arguments need a new approval."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from ledger.log.envelopes import log_of
from ledger.models import AuditEntry, Run, ToolCall, Workspace
from ledger.replay import toolapproval
from ledger.replay.stored_plan import replay_plan_for
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.registry import CodeRun, Tool, Workflow
from ledger.runtime.registry import ToolCall as ToolStep
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies,
    run_events,
)


def _mailer(sent: list[Any], to: dict[str, str], *, approval: str | None = "required") -> Workflow:
    """prep -> send (a write tool) -> after; `to["address"]` decides the arguments at each execution."""

    def send(args: Any) -> dict[str, Any]:
        sent.append(args)
        return {"id": f"msg-{len(sent)}"}

    return Workflow(
        name="mailer",
        tools={"send_email": Tool("send_email", send, effect="write", approval=approval)},
        steps=(
            CodeRun("prep", lambda i, o: {"subject": i["subject"]}),
            ToolStep("send", "send_email", lambda i, o: {"to": to["address"], "subject": o["prep"]["subject"]}),
            CodeRun("after", lambda i, o: {"sent": o["send"]["id"]}),
        ),
    )


def _waiting(workspace: Workspace, run_id: str) -> ToolCall:
    return ToolCall.objects.get(run__workspace=workspace, run__run_id=run_id, status="waiting_approval")


def _decide(
    workspace: Workspace,
    run_id: str,
    by: User,
    *,
    approve: bool = True,
    digest: str | None = None,
    note: str = "checked the recipient",
) -> ToolCall:
    call = _waiting(workspace, run_id)
    return toolapproval.decide(
        workspace=workspace,
        run_id=run_id,
        call_id=call.call_id,
        approve=approve,
        seen_digest=digest or toolapproval.pending_digest(call),
        note=note,
        by=by,
    )


def test_a_required_approval_stops_the_run_before_the_call_and_it_runs_once_after_approval(
    workspace: Workspace, approver: User
) -> None:
    sent: list[Any] = []
    wf = _mailer(sent, {"address": "ann@example.com"})

    outcome = start_run(
        workspace=workspace, workflow=wf, input={"subject": "hi"}, run_id="run_mail", requested_by="carol"
    )

    assert outcome.status == "waiting_approval"
    assert outcome.error["toolName"] == "send_email"
    assert sent == []
    events = run_events(workspace, "run_mail")
    assert events[-1]["type"] == "harness.tool_call.approval_requested"
    assert events[-1]["payload"]["args"] == {"to": "ann@example.com", "subject": "hi"}
    run = Run.objects.get(workspace=workspace, run_id="run_mail")
    assert run.status == "running" and run.lease_expires_at is None  # the wait holds no lease
    call = _waiting(workspace, "run_mail")
    assert call.args == {"to": "ann@example.com", "subject": "hi"}
    # The replay plan shows the wait.
    plan = replay_plan_for(run, log_of(run))
    assert [w["callId"] for w in plan["waitingApproval"]] == [call.call_id]

    # Resuming before anyone decided writes nothing and runs nothing.
    again = resume_run(workspace=workspace, run_id="run_mail", workflow=wf)
    assert again.status == "waiting_approval" and sent == []
    assert len(run_events(workspace, "run_mail")) == len(events)

    _decide(workspace, "run_mail", approver)
    done = resume_run(workspace=workspace, run_id="run_mail", workflow=wf)

    assert (done.status, done.output) == ("completed", {"sent": "msg-1"})
    assert sent == [{"to": "ann@example.com", "subject": "hi"}]
    entry = AuditEntry.objects.get(action="tool_call.approved")
    assert (entry.actor, entry.target) == ("bob", f"run_mail/{call.call_id}")
    assert resume_run(workspace=workspace, run_id="run_mail", workflow=wf).status == "completed"
    assert len(sent) == 1


def test_a_rejected_call_fails_cleanly_and_never_runs(workspace: Workspace, approver: User) -> None:
    sent: list[Any] = []
    wf = _mailer(sent, {"address": "ann@example.com"})
    start_run(workspace=workspace, workflow=wf, input={"subject": "hi"}, run_id="run_reject", requested_by="carol")

    _decide(workspace, "run_reject", approver, approve=False, note="wrong recipient")
    done = resume_run(workspace=workspace, run_id="run_reject", workflow=wf)

    assert done.status == "failed"
    assert done.error["name"] == "ToolCallFailed"
    assert "rejected by bob: wrong recipient" in done.error["message"]
    assert sent == []
    call = ToolCall.objects.get(run__run_id="run_reject")
    assert (call.status, call.error["name"]) == ("failed", "ToolCallRejected")
    assert AuditEntry.objects.get(action="tool_call.rejected").reason == "wrong recipient"


def test_the_requester_cannot_approve_their_own_run_s_call(workspace: Workspace, approver: User, admin: User) -> None:
    sent: list[Any] = []
    start_run(
        workspace=workspace,
        workflow=_mailer(sent, {"address": "a@x"}),
        input={"subject": "s"},
        run_id="run_own",
        requested_by="bob",
    )

    with pytest.raises(toolapproval.SelfApprovalForbidden):
        _decide(workspace, "run_own", approver)

    assert _waiting(workspace, "run_own").status == "waiting_approval"
    assert not AuditEntry.objects.filter(action="tool_call.approved").exists()
    _decide(workspace, "run_own", admin)  # another approver (an admin) may


def test_only_approvers_decide(workspace: Workspace, operator: User, viewer: User) -> None:
    start_run(
        workspace=workspace,
        workflow=_mailer([], {"address": "a@x"}),
        input={"subject": "s"},
        run_id="run_roles",
        requested_by="carol",
    )

    for who in (operator, viewer):
        with pytest.raises(toolapproval.ApproverRequired):
            _decide(workspace, "run_roles", who)


def test_changed_arguments_need_a_new_approval(workspace: Workspace, approver: User) -> None:
    sent: list[Any] = []
    to = {"address": "ann@example.com"}
    wf = _mailer(sent, to)
    start_run(workspace=workspace, workflow=wf, input={"subject": "hi"}, run_id="run_changed", requested_by="carol")
    first = _waiting(workspace, "run_changed")
    _decide(workspace, "run_changed", approver)

    to["address"] = "mallory@example.com"  # the call now computes other arguments
    again = resume_run(workspace=workspace, run_id="run_changed", workflow=wf)

    assert again.status == "waiting_approval" and sent == []
    second = _waiting(workspace, "run_changed")
    assert second.call_id == first.call_id
    assert second.args == {"to": "mallory@example.com", "subject": "hi"}
    assert toolapproval.pending_digest(second) != toolapproval.pending_digest(first)
    # An approval of what was shown before does not bind the new arguments.
    with pytest.raises(toolapproval.ApprovalStale):
        _decide(workspace, "run_changed", approver, digest=toolapproval.pending_digest(first))
    _decide(workspace, "run_changed", approver)
    assert resume_run(workspace=workspace, run_id="run_changed", workflow=wf).status == "completed"
    assert sent == [{"to": "mallory@example.com", "subject": "hi"}]


def test_a_workspace_policy_naming_a_tool_makes_it_wait_too(workspace: Workspace, approver: User) -> None:
    sent: list[Any] = []
    workspace.approval_tools = ["send_email"]
    workspace.save(update_fields=["approval_tools"])

    outcome = start_run(
        workspace=workspace,
        workflow=_mailer(sent, {"address": "a@x"}, approval=None),
        input={"subject": "s"},
        run_id="run_policy",
    )

    assert outcome.status == "waiting_approval" and sent == []


def test_a_call_decided_or_absent_cannot_be_decided(workspace: Workspace, approver: User) -> None:
    start_run(
        workspace=workspace,
        workflow=_mailer([], {"address": "a@x"}),
        input={"subject": "s"},
        run_id="run_twice",
        requested_by="carol",
    )
    call = _waiting(workspace, "run_twice")
    _decide(workspace, "run_twice", approver)

    with pytest.raises(toolapproval.ToolCallNotWaiting):
        toolapproval.decide(
            workspace=workspace,
            run_id="run_twice",
            call_id=call.call_id,
            approve=False,
            seen_digest=toolapproval.pending_digest(call),
            note="n",
            by=approver,
        )
    with pytest.raises(toolapproval.NotFound):
        toolapproval.decide(
            workspace=workspace,
            run_id="run_twice",
            call_id="nope",
            approve=True,
            seen_digest="x",
            note="n",
            by=approver,
        )


# --- the Approvals page ---------------------------------------------------------------------------


def test_the_approvals_page_shows_the_waiting_call_and_an_approver_approves_it(
    client: Any, workspace: Workspace, approver: User, operator: User
) -> None:
    sent: list[Any] = []
    wf = _mailer(sent, {"address": "ann@example.com"})
    start_run(workspace=workspace, workflow=wf, input={"subject": "hi"}, run_id="run_page", requested_by="carol")
    call = _waiting(workspace, "run_page")
    digest = toolapproval.pending_digest(call)
    url = "/w/acme/support/approvals/tool-calls/"
    form = {"run": "run_page", "call": call.call_id, "digest": digest, "note": "fine", "decision": "approve"}

    client.force_login(operator)  # the requester, and below approver: sees it, cannot decide
    html = client.get("/w/acme/support/approvals/").content.decode()
    assert "send_email" in html and "ann@example.com" in html and 'value="approve"' not in html
    assert client.post(url, form).status_code == 403

    client.force_login(approver)
    html = client.get("/w/acme/support/approvals/").content.decode()
    assert 'value="approve"' in html and digest in html
    stale = client.post(url, {**form, "digest": "sha256:other"})
    assert stale.status_code == 409 and "changed since you looked" in stale.content.decode()
    assert client.post(url, {**form, "note": ""}).status_code == 400

    assert client.post(url, form).status_code == 302

    assert ToolCall.objects.get(run__run_id="run_page").status == "approved"
    assert resume_run(workspace=workspace, run_id="run_page", workflow=wf).status == "completed"
    assert len(sent) == 1
    assert "No tool call waits for approval." in client.get("/w/acme/support/approvals/").content.decode()


def test_the_approvals_page_says_the_worker_resumes_the_run_not_a_command(
    client: Any, workspace: Workspace, approver: User
) -> None:
    """The worker resumes a decided run by itself (README, docs/api.md): the page must not send the
    approver to the command line."""
    start_run(workspace=workspace, workflow=_mailer([], {"address": "a@example.com"}), input={"subject": "s"})
    client.force_login(approver)
    html = client.get("/w/acme/support/approvals/").content.decode()
    note = html.split('id="tool-calls-note">', 1)[1].split("</p>", 1)[0]
    assert "the worker resumes the run by itself" in note
    assert "ledger resume" not in html


def _bobs_own_waiting_call(client: Any, workspace: Workspace, approver: User) -> Any:
    """A call waiting in a run bob (the approver) started himself, with bob signed in."""
    start_run(
        workspace=workspace,
        workflow=_mailer([], {"address": "a@x"}),
        input={"subject": "s"},
        run_id="run_mine",
        requested_by="bob",
    )
    client.force_login(approver)
    return _waiting(workspace, "run_mine")


def _decide_own(client: Any, call: Any, note: str, decision: str) -> Any:
    form = {"run": "run_mine", "call": call.call_id, "digest": toolapproval.pending_digest(call), "note": note}
    return client.post("/w/acme/support/approvals/tool-calls/", {**form, "decision": decision})


def test_the_requester_gets_no_approve_button_and_is_refused(client: Any, workspace: Workspace, approver: User) -> None:
    call = _bobs_own_waiting_call(client, workspace, approver)

    html = client.get("/w/acme/support/approvals/").content.decode()
    assert "another approver decides its calls" in html and 'value="approve"' not in html
    refused = _decide_own(client, call, "me", "approve")
    assert refused.status_code == 403 and "another approver must decide" in refused.content.decode()
    assert _waiting(workspace, "run_mine").status == "waiting_approval"


def test_the_requester_gets_no_reject_button_either_and_a_rejection_is_refused(
    client: Any, workspace: Workspace, approver: User
) -> None:
    call = _bobs_own_waiting_call(client, workspace, approver)

    html = client.get("/w/acme/support/approvals/").content.decode()
    card = html.split('data-run="run_mine"', 1)[1].split("</article>", 1)[0]
    assert "another approver decides its calls" in card and 'value="reject"' not in card and "<form" not in card
    refused = _decide_own(client, call, "not mine to send", "reject")
    assert refused.status_code == 403 and "another approver must decide" in refused.content.decode()
    assert _waiting(workspace, "run_mine").status == "waiting_approval"


def test_ledger_run_says_the_worker_resumes_after_the_decision_and_exits_4(
    workspace: Workspace, operator: User
) -> None:
    """A person told to run `ledger resume` by hand would race the worker that the decision already
    queued (docs/operations.md § Cancellation, tool approval, progress)."""
    err = io.StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command(
            "ledger",
            "run",
            "support.goodwill",
            "--workspace",
            "acme/support",
            "--input",
            '{"orderId": "B-2", "amount": 5}',
            "--requested-by",
            "carol",
            stdout=io.StringIO(),
            stderr=err,
        )
    assert exited.value.code == 4
    assert "waits for an approver" in err.getvalue() and "the worker (ledger worker) resumes the run" in err.getvalue()


def test_another_tenant_cannot_see_or_decide_the_call(client: Any, workspace: Workspace, outsider: User) -> None:
    start_run(
        workspace=workspace,
        workflow=_mailer([], {"address": "a@x"}),
        input={"subject": "s"},
        run_id="run_hidden",
        requested_by="carol",
    )
    call = _waiting(workspace, "run_hidden")
    client.force_login(outsider)
    form = {
        "run": "run_hidden",
        "call": call.call_id,
        "digest": toolapproval.pending_digest(call),
        "note": "n",
        "decision": "approve",
    }

    assert client.get("/w/acme/support/approvals/").status_code == 404
    assert client.post("/w/acme/support/approvals/tool-calls/", form).status_code == 404
    assert client.post("/w/globex/main/approvals/tool-calls/", form).status_code == 404
    assert "run_hidden" not in client.get("/w/globex/main/approvals/").content.decode()
    assert _waiting(workspace, "run_hidden").status == "waiting_approval"


def test_cancelling_a_run_that_waits_for_approval_ends_the_waiting_call(workspace: Workspace) -> None:
    from ledger.replay.cancellation import cancel_run

    sent: list[Any] = []
    wf = _mailer(sent, {"address": "a@x"})
    start_run(workspace=workspace, workflow=wf, input={"subject": "s"}, run_id="run_wait_cancel", requested_by="carol")

    done = cancel_run(workspace=workspace, run_id="run_wait_cancel", reason="not needed", by="carol")

    assert done.held is False and len(done.abandoned) == 1
    call = ToolCall.objects.get(run__run_id="run_wait_cancel")
    assert (call.status, call.error) == ("failed", {"name": "Cancelled", "message": "not needed"})
    assert toolapproval.waiting_calls(workspace) == []
    assert resume_run(workspace=workspace, run_id="run_wait_cancel", workflow=wf).status == "failed"
    assert sent == []


def test_waiting_calls_are_paged_oldest_first_and_a_decision_keeps_its_page(
    client: Any, workspace: Workspace, approver: User, outsider: User
) -> None:
    """22 runs each waiting on a call: a page of 20 and a page of 2, the count and the
    navigation's badge at 22 on both; a decision on the second page comes back to it."""
    wf = _mailer([], {"address": "ann@example.com"})
    for n in range(22):
        start_run(
            workspace=workspace, workflow=wf, input={"subject": f"s{n}"}, run_id=f"run_q{n:02}", requested_by="carol"
        )
    client.force_login(approver)
    first = client.get("/w/acme/support/approvals/").content.decode()
    runs = re.findall(
        r'<article class="request pending tool-call-approval" id="tool-call-\d+" data-run="([^"]+)"', first
    )
    assert runs == [f"run_q{n:02}" for n in range(20)]
    assert re.search(r'id="tool-calls-count">22<', first) and re.search(r'id="pending-badge"[^>]*>22<', first)
    found = re.search(r'href="([^"]+)" id="calls-next" rel="next">Next page \(2 more waiting\)', first)
    assert found is not None and 'id="calls-first"' not in first
    second_url = found.group(1).replace("&amp;", "&")
    second = client.get(second_url).content.decode()
    runs = re.findall(
        r'<article class="request pending tool-call-approval" id="tool-call-\d+" data-run="([^"]+)"', second
    )
    assert runs == ["run_q20", "run_q21"] and 'id="calls-first"' in second and 'id="calls-next"' not in second

    call = _waiting(workspace, "run_q20")
    form = {"run": "run_q20", "call": call.call_id, "digest": toolapproval.pending_digest(call), "note": "ok"}
    query = second_url.split("?", 1)[1]
    response = client.post(f"/w/acme/support/approvals/tool-calls/?{query}", {**form, "decision": "approve"})
    assert response.status_code == 302 and response["Location"] == second_url
    again = client.get(second_url).content.decode()
    assert re.findall(r'data-run="(run_q\d+)" data-call', again) == ["run_q21"]
    assert re.search(r'id="tool-calls-count">21<', again)

    # A made-up cursor: a 400 with no cards and the first page's link; a cursor of the other queue
    # (the pending re-executions') is refused as well.
    response = client.get("/w/acme/support/approvals/", {"calls_after": "nonsense"})
    html = response.content.decode()
    assert response.status_code == 400 and 'id="calls-broken-page"' in html and 'id="calls-first"' in html
    assert "tool-call-approval" not in html
    response = client.get("/w/acme/support/approvals/", {"after": query.removeprefix("calls_after=")})
    assert response.status_code == 400 and 'id="broken-page"' in response.content.decode()
    client.force_login(outsider)
    assert client.get(second_url).status_code == 404
