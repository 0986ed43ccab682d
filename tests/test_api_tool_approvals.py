"""Tool approvals over the API (docs/api.md "Run control"): an approver's console session approves
or denies a call waiting for approval, bound to the arguments' digest, audited; the worker then
resumes the run by itself. The requester, a viewer, an API key and another tenant are refused,
each with the error body and the log untouched. Also the run object's `attention` and the runs
list's `?attention=` filter, and the console's runs list, header and Needs filter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User

from ledger.models import AuditEntry, Run, Workspace
from ledger.reexecution import services
from ledger.replay.cancellation import cancel_run
from ledger.runtime.executor import start_run
from ledger.tenancy.services import create_key
from tests.conftest import IN_PROCESS, http_client, log_in
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse: ledger verify passes on every run)

GOODWILL = {"ticket": "Late twice.", "orderId": "B-2", "amount": 25}
IMMEDIATE = {
    "default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend", "QUEUES": ["default", "reexecutions"]}
}


@pytest.fixture
def clients() -> Iterator[list[httpx.Client]]:
    made: list[httpx.Client] = []
    yield made
    for client in made:
        client.close()


def _session(user: User, clients: list[httpx.Client]) -> httpx.Client:
    client = log_in(IN_PROCESS, user, send_csrf=True)
    clients.append(client)
    return client


def _key(workspace: Workspace, scopes: str, clients: list[httpx.Client]) -> httpx.Client:
    _, key = create_key(workspace=workspace, scopes=scopes.split(","))
    client = http_client(IN_PROCESS, headers={"Authorization": f"Bearer {key}"})
    clients.append(client)
    return client


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == code, response.text


def _waiting(workspace: Workspace, run_id: str = "run_credit", requested_by: str = "carol") -> dict[str, Any]:
    """Start the demo's goodwill credit, which stops at its call; the attention the API shows."""
    assert (
        start_run(
            workspace=workspace, workflow="support.goodwill", input=GOODWILL, run_id=run_id, requested_by=requested_by
        ).status
        == "waiting_approval"
    )
    return {"run_id": run_id}


def _last_sequence(workspace: Workspace, run_id: str) -> int:
    return Run.objects.get(workspace=workspace, run_id=run_id).last_sequence


@pytest.mark.django_db(transaction=True)
def test_an_approver_approves_over_the_api_and_the_run_completes_by_itself(
    workspace: Workspace, approver: User, clients: list[httpx.Client], settings: Any
) -> None:
    settings.TASKS = IMMEDIATE  # the task runs when the decision commits, as the worker would take it
    _waiting(workspace)
    bob = _session(approver, clients)

    run = bob.get("/api/v1/runs/run_credit").json()
    assert run["status"] == "running" and run["cancelled"] is False
    needs = run["attention"]
    assert needs["kind"] == "waiting_tool_approval" and needs["detail"]["toolName"] == "send_goodwill_credit"
    listed = bob.get("/api/v1/runs", params={"attention": "waiting_tool_approval"}).json()["runs"]
    assert [r["runId"] for r in listed] == ["run_credit"]
    call_id, digest = needs["detail"]["callId"], needs["detail"]["argsDigest"]

    answer = bob.post(
        f"/api/v1/runs/run_credit/tool-calls/{call_id}/approve", json={"note": "fair", "argsDigest": digest}
    )

    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "runId": "run_credit",
        "callId": call_id,
        "toolName": "send_goodwill_credit",
        "decision": "approved",
        "status": "approved",
        "argsDigest": digest,
        "by": "bob",
        "note": "fair",
    }
    done = bob.get("/api/v1/runs/run_credit").json()
    assert (done["status"], done["output"], done["attention"]) == ("completed", {"credited": "gc-B-2"}, None)
    entry = AuditEntry.objects.get(action="tool_call.approved")
    assert (entry.actor, entry.target, entry.reason) == ("bob", f"run_credit/{call_id}", "fair")
    assert bob.get("/api/v1/runs", params={"attention": "any"}).json()["runs"] == []


@pytest.mark.django_db(transaction=True)
def test_a_denial_over_the_api_fails_the_step_and_the_run_by_itself(
    workspace: Workspace, approver: User, clients: list[httpx.Client], settings: Any
) -> None:
    settings.TASKS = IMMEDIATE
    _waiting(workspace)
    bob = _session(approver, clients)
    detail = bob.get("/api/v1/runs/run_credit").json()["attention"]["detail"]

    answer = bob.post(
        f"/api/v1/runs/run_credit/tool-calls/{detail['callId']}/deny",
        json={"note": "order D-4 arrived on time", "argsDigest": detail["argsDigest"]},
    )

    assert answer.status_code == 200 and answer.json()["decision"] == "rejected" and answer.json()["status"] == "failed"
    run = bob.get("/api/v1/runs/run_credit").json()
    assert run["status"] == "failed" and run["cancelled"] is False and run["attention"] is None
    assert "order D-4 arrived on time" in run["error"]["message"]  # the rejection's, as its step failed with it
    assert AuditEntry.objects.filter(action="tool_call.rejected", actor="bob").count() == 1


@pytest.mark.django_db(transaction=True)
def test_who_may_not_decide_is_refused_with_the_error_body_and_the_log_untouched(
    workspace: Workspace,
    other_workspace: Workspace,
    approver: User,
    operator: User,
    viewer: User,
    outsider: User,
    clients: list[httpx.Client],
) -> None:
    _waiting(workspace)
    _waiting(workspace, "run_bobs", requested_by="bob")
    bob = _session(approver, clients)
    detail = bob.get("/api/v1/runs/run_credit").json()["attention"]["detail"]
    own = bob.get("/api/v1/runs/run_bobs").json()["attention"]["detail"]
    url = f"/api/v1/runs/run_credit/tool-calls/{detail['callId']}/approve"
    body = {"note": "ok", "argsDigest": detail["argsDigest"]}
    before = _last_sequence(workspace, "run_credit")

    # Another tenant's member and key: 404, never 403.
    _error(_session(outsider, clients).post(url, json=body), 404, "not_found")
    _error(_key(other_workspace, "read,execute", clients).post(url, json=body), 404, "not_found")
    # Below approver, and any API key (a person decides): 403.
    _error(_session(viewer, clients).post(url, json=body), 403, "forbidden")
    _error(_session(operator, clients).post(url, json=body), 403, "forbidden")
    _error(_key(workspace, "read,ingest,execute", clients).post(url, json=body), 403, "forbidden")
    _error(_key(workspace, "ingest", clients).post(url, json=body), 403, "insufficient_scope")
    # The run's requester, though an approver: 403.
    _error(
        bob.post(
            f"/api/v1/runs/run_bobs/tool-calls/{own['callId']}/approve",
            json={"note": "mine", "argsDigest": own["argsDigest"]},
        ),
        403,
        "self_approval_forbidden",
    )
    # Other arguments than the ones reviewed: 409 with the current digest.
    stale = bob.post(url, json={"note": "ok", "argsDigest": "sha256:" + "0" * 64})
    _error(stale, 409, "approval_stale")
    assert stale.json()["error"]["details"]["argsDigest"] == detail["argsDigest"]
    # Bad input: 400; no such call: 404; no credentials: 401.
    _error(bob.post(url, json={"argsDigest": detail["argsDigest"]}), 400, "invalid_request")
    _error(bob.post(url, content=b"{not json", headers={"Content-Type": "application/json"}), 400, "invalid_json")
    _error(bob.post("/api/v1/runs/run_credit/tool-calls/nope/approve", json=body), 404, "not_found")
    _error(bob.post("/api/v1/runs/bad id/tool-calls/x/approve", json=body), 400, "invalid_run_id")
    anonymous = http_client(IN_PROCESS)
    clients.append(anonymous)
    assert anonymous.post(url, json=body).status_code == 401

    assert _last_sequence(workspace, "run_credit") == before
    assert not AuditEntry.objects.filter(action__startswith="tool_call.").exists()
    # Decided once, a second decision finds nothing waiting.
    assert bob.post(url, json=body).status_code == 200
    _error(bob.post(url, json=body), 409, "tool_call_not_waiting")


@pytest.mark.django_db(transaction=True)
def test_the_attention_filter_refuses_an_unknown_kind(workspace: Workspace, clients: list[httpx.Client]) -> None:
    _error(
        _key(workspace, "read", clients).get("/api/v1/runs", params={"attention": "bored"}), 400, "invalid_parameter"
    )


@pytest.mark.django_db
def test_the_runs_list_and_the_run_header_show_what_a_run_waits_for(
    client: Any, workspace: Workspace, approver: User, operator: User, outsider: User
) -> None:
    _waiting(workspace)
    start_run(workspace=workspace, workflow="support.goodwill", input=GOODWILL, run_id="run_stop", requested_by="carol")
    cancel_run(workspace=workspace, run_id="run_stop", reason="the customer withdrew", by=operator)
    assert start_run(workspace=workspace, workflow="support.triage", input={"ticket": "?"}, run_id="run_t").status
    services.request_reexecution(workspace=workspace, run_id="run_t", mode="rerun", reason="r", by=operator)
    client.force_login(approver)

    page = client.get("/w/acme/support/").content.decode()
    assert 'data-attention="waiting_tool_approval"' in page and 'data-attention="reexecution_pending"' in page
    assert 'data-ended="cancelled"' in page and "the customer withdrew" in page
    needing = client.get("/w/acme/support/", {"attention": "waiting_tool_approval"}).content.decode()
    assert 'data-run-id="run_credit"' in needing and 'data-run-id="run_t"' not in needing
    assert client.get("/w/acme/support/", {"attention": "bored"}).status_code == 400

    header = client.get("/w/acme/support/runs/run_credit/").content.decode()
    assert 'data-attention="waiting_tool_approval"' in header and "send_goodwill_credit" in header
    assert 'href="/w/acme/support/approvals/"' in header
    stopped = client.get("/w/acme/support/runs/run_stop/").content.decode()
    assert 'data-ended="cancelled"' in stopped and "the customer withdrew" in stopped
    # The navigation's badge counts the page's cards: one tool call and one request.
    assert 'id="pending-badge" title="waiting for approval">2<' in page

    client.force_login(outsider)
    assert client.get("/w/acme/support/", {"attention": "any"}).status_code == 404
    assert client.get("/w/acme/support/runs/run_credit/").status_code == 404
