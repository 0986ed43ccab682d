"""Cancelling a run: a running one stops at its executor's next write, an idle one is failed at
once; either ends `RunFailed {error: {name: "Cancelled", message: reason}}`, audited. The API
over real HTTP (a live server and httpx), the CLI, and the refusals."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from io import StringIO
from typing import Any

import httpx
import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from ledger.errors import RunFinished
from ledger.log.leases import acquire_run_lease
from ledger.models import AuditEntry, Run, ToolCall, ToolGatewayClaim, Workspace
from ledger.replay.cancellation import cancel_run
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.registry import CodeRun, SubWorkflow, Tool, Workflow, register
from ledger.runtime.registry import ToolCall as ToolStep
from ledger.tenancy.services import create_key
from tests.conftest import log_in
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    every_run_verifies,
    run_events,
)

REASON = "wrong customer, stop it"


def _cancelling_workflow(
    name: str,
    workspace: Workspace,
    calls: Counter[str],
    *,
    effect: str = "read",
    cancel: Callable[[str], Any] | None = None,
) -> Workflow:
    """A tool that cancels its own run while it is in flight (what an operator does from outside,
    at that moment), then a step that must never run."""
    holder: dict[str, str] = {}

    def tool(args: Any) -> dict[str, Any]:
        calls["tool"] += 1
        (cancel or (lambda run_id: cancel_run(workspace=workspace, run_id=run_id, reason=REASON, by="carol")))(
            holder["run_id"]
        )
        return {"sent": True}

    def remember(run_input: Any, outputs: Any) -> dict[str, Any]:
        holder["run_id"] = run_input["runId"]
        return {}

    def after(run_input: Any, outputs: Any) -> str:
        calls["after"] += 1
        return "never"

    return Workflow(
        name=name,
        tools={"send": Tool("send", tool, effect=effect)},
        steps=(
            CodeRun("remember", remember),
            ToolStep("send", "send", {"to": "x"}),
            CodeRun("after", after),
        ),
    )


def _cancelled_error(run: Run) -> Any:
    return run.error


def test_a_running_run_stops_at_its_next_write_and_its_read_call_in_flight_is_abandoned(workspace: Workspace) -> None:
    calls: Counter[str] = Counter()
    wf = _cancelling_workflow("cancel_read", workspace, calls)

    outcome = start_run(workspace=workspace, workflow=wf, input={"runId": "run_cancel_read"}, run_id="run_cancel_read")

    assert (outcome.status, outcome.error) == ("failed", {"name": "Cancelled", "message": REASON})
    assert (calls["tool"], calls["after"]) == (1, 0)
    events = run_events(workspace, "run_cancel_read")
    assert events[-1]["type"] == "RunFailed"
    assert events[-1]["payload"]["error"] == {"name": "Cancelled", "message": REASON}
    assert [e["type"] for e in events[-2:]] == ["harness.tool_call.failed", "RunFailed"]
    assert events[-2]["payload"]["error"] == {"name": "Cancelled", "message": REASON}
    assert not any(e["type"] == "StepCompleted" and e["payload"]["stepPath"] == "send" for e in events)
    run = Run.objects.get(workspace=workspace, run_id="run_cancel_read")
    assert (run.status, run.error) == ("failed", {"name": "Cancelled", "message": REASON})
    assert ToolGatewayClaim.objects.get(run=run).status == "failed"
    entry = AuditEntry.objects.get(action="run.cancelled")
    assert (entry.actor, entry.target, entry.reason, entry.details["held"]) == (
        "carol",
        "run_cancel_read",
        REASON,
        True,
    )
    assert entry.details["abandoned"] == [ToolGatewayClaim.objects.get(run=run).call_id]
    # Resuming a cancelled run runs nothing more.
    again = resume_run(workspace=workspace, run_id="run_cancel_read", workflow=wf)
    assert (again.status, calls["tool"], calls["after"]) == ("failed", 1, 0)


def test_a_write_call_in_flight_when_its_run_is_cancelled_is_in_doubt(workspace: Workspace) -> None:
    calls: Counter[str] = Counter()
    wf = _cancelling_workflow("cancel_write", workspace, calls, effect="write")

    outcome = start_run(
        workspace=workspace, workflow=wf, input={"runId": "run_cancel_write"}, run_id="run_cancel_write"
    )

    assert outcome.error == {"name": "Cancelled", "message": REASON}
    run = Run.objects.get(workspace=workspace, run_id="run_cancel_write")
    claim = ToolGatewayClaim.objects.get(run=run)
    assert claim.status == "in_doubt"
    assert ToolCall.objects.get(run=run).status == "in_doubt"
    assert [e["type"] for e in run_events(workspace, "run_cancel_write")[-2:]] == [
        "harness.tool_call.in_doubt",
        "RunFailed",
    ]
    assert AuditEntry.objects.get(action="run.cancelled").details["inDoubt"] == [claim.call_id]


def test_an_idle_run_is_failed_at_once(workspace: Workspace, append: Any) -> None:
    append("run_idle", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})

    done = cancel_run(workspace=workspace, run_id="run_idle", reason=REASON, by="carol")

    assert (done.held, done.abandoned, done.in_doubt) == (False, [], [])
    run = Run.objects.get(workspace=workspace, run_id="run_idle")
    assert (run.status, run.error) == ("failed", {"name": "Cancelled", "message": REASON})
    assert run_events(workspace, "run_idle")[-1]["type"] == "RunFailed"
    assert AuditEntry.objects.get(action="run.cancelled").details["held"] is False


def test_a_run_whose_executor_died_holding_its_lease_is_failed_at_once_under_that_lease(
    workspace: Workspace, append: Any
) -> None:
    append("run_held", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    acquire_run_lease(workspace=workspace, run_id="run_held", owner="elsewhere:1:x", ttl_s=300)

    done = cancel_run(workspace=workspace, run_id="run_held", reason=REASON, by="carol")

    assert done.held is True
    assert Run.objects.get(workspace=workspace, run_id="run_held").status == "failed"


def test_a_finished_run_cannot_be_cancelled_and_nothing_is_written(workspace: Workspace, append: Any) -> None:
    append(
        "run_done",
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}},
        {"type": "RunCompleted", "payload": {"output": 1}},
    )

    with pytest.raises(RunFinished):
        cancel_run(workspace=workspace, run_id="run_done", reason=REASON, by="carol")

    assert Run.objects.get(workspace=workspace, run_id="run_done").last_sequence == 2
    assert not AuditEntry.objects.filter(action="run.cancelled").exists()


def test_cancelling_a_parent_cancels_its_running_sub_run_and_neither_goes_on(workspace: Workspace) -> None:
    calls: Counter[str] = Counter()
    parent_id = "run_cancel_parent"
    child = _cancelling_workflow(
        "cancel_child",
        workspace,
        calls,
        cancel=lambda run_id: cancel_run(workspace=workspace, run_id=parent_id, reason=REASON, by="carol"),
    )
    register(child)
    parent = Workflow(
        name="cancel_parent",
        steps=(
            SubWorkflow("child", "cancel_child", {"runId": "unused"}),
            CodeRun("after_child", lambda i, o: calls.update(["after_child"])),
        ),
    )

    outcome = start_run(workspace=workspace, workflow=parent, input={}, run_id=parent_id)

    assert outcome.error == {"name": "Cancelled", "message": REASON}
    children = list(Run.objects.filter(workspace=workspace, parent_run_id=parent_id))
    assert len(children) == 1
    assert (children[0].status, children[0].error) == ("failed", {"name": "Cancelled", "message": REASON})
    assert (calls["after"], calls["after_child"]) == (0, 0)
    entry = AuditEntry.objects.get(action="run.cancelled")
    assert entry.details["subRuns"] == [children[0].run_id]


def test_the_cli_cancels_and_refuses_a_finished_run(workspace: Workspace, append: Any) -> None:
    append("run_cli", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    out = StringIO()

    call_command("ledger", "cancel", "run_cli", "--reason", REASON, stdout=out, stderr=StringIO())

    assert json.loads(out.getvalue())["status"] == "failed"
    assert Run.objects.get(workspace=workspace, run_id="run_cli").error["name"] == "Cancelled"
    assert AuditEntry.objects.get(action="run.cancelled").actor == "system:cli"
    with pytest.raises(CommandError, match="already ended"):
        call_command("ledger", "cancel", "run_cli", "--reason", REASON, stdout=StringIO(), stderr=StringIO())


# --- the API, over real HTTP -------------------------------------------------------------------


@pytest.fixture
def server(live_server: Any) -> str:
    return live_server.url


@pytest.fixture
def clients() -> Iterator[list[httpx.Client]]:
    made: list[httpx.Client] = []
    yield made
    for client in made:
        client.close()


def _key_client(server: str, workspace: Workspace, scopes: str, clients: list[httpx.Client]) -> httpx.Client:
    _, key = create_key(workspace=workspace, scopes=scopes.split(","))
    client = httpx.Client(base_url=server, headers={"Authorization": f"Bearer {key}"}, timeout=30)
    clients.append(client)
    return client


def _error(response: httpx.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    assert response.json()["error"]["code"] == code, response.text


@pytest.mark.django_db(transaction=True)
def test_api_cancels_a_running_run_from_inside_its_tool_call(
    server: str, workspace: Workspace, clients: list[httpx.Client]
) -> None:
    api = _key_client(server, workspace, "read,execute", clients)
    answers: list[httpx.Response] = []
    calls: Counter[str] = Counter()
    wf = _cancelling_workflow(
        "cancel_api",
        workspace,
        calls,
        cancel=lambda run_id: answers.append(api.post(f"/api/v1/runs/{run_id}/cancel", json={"reason": REASON})),
    )

    outcome = start_run(workspace=workspace, workflow=wf, input={"runId": "run_api_cancel"}, run_id="run_api_cancel")

    assert answers[0].status_code == 202, answers[0].text
    body = answers[0].json()
    assert (body["runId"], body["status"], body["error"], body["executorHeld"]) == (
        "run_api_cancel",
        "failed",
        {"name": "Cancelled", "message": REASON},
        True,
    )
    assert len(body["abandonedCalls"]) == 1 and body["inDoubtCalls"] == []
    assert (outcome.status, outcome.error, calls["after"]) == ("failed", {"name": "Cancelled", "message": REASON}, 0)
    got = api.get("/api/v1/runs/run_api_cancel").json()
    assert (got["status"], got["error"]) == ("failed", {"name": "Cancelled", "message": REASON})
    entry = AuditEntry.objects.get(action="run.cancelled")
    assert entry.actor.startswith("key:") and entry.reason == REASON
    _error(api.post("/api/v1/runs/run_api_cancel/cancel", json={"reason": "again"}), 409, "run_finished")


@pytest.mark.django_db(transaction=True)
def test_api_cancel_refusals(
    server: str,
    workspace: Workspace,
    other_workspace: Workspace,
    append: Any,
    operator: User,
    viewer: User,
    outsider: User,
    clients: list[httpx.Client],
) -> None:
    append("run_target", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    url = "/api/v1/runs/run_target/cancel"
    # Another tenant's key and member: 404, never 403 (existence not revealed).
    _error(
        _key_client(server, other_workspace, "read,execute", clients).post(url, json={"reason": "x"}), 404, "not_found"
    )
    outsider_session = log_in(server, outsider, send_csrf=True)
    clients.append(outsider_session)
    _error(outsider_session.post(url, json={"reason": "x"}), 404, "not_found")
    # Below the role or the scope: 403.
    _error(
        _key_client(server, workspace, "read,ingest", clients).post(url, json={"reason": "x"}),
        403,
        "insufficient_scope",
    )
    viewer_session = log_in(server, viewer, send_csrf=True)
    clients.append(viewer_session)
    _error(viewer_session.post(url, json={"reason": "x"}), 403, "forbidden")
    # No credentials: 401. Bad input: 400, nothing written.
    anonymous = httpx.Client(base_url=server, timeout=30)
    clients.append(anonymous)
    assert anonymous.post(url, json={"reason": "x"}).status_code == 401
    operator_session = log_in(server, operator, send_csrf=True)
    clients.append(operator_session)
    _error(operator_session.post(url, json={}), 400, "invalid_request")
    _error(operator_session.post(url, json={"reason": "   "}), 400, "invalid_request")
    _error(operator_session.post("/api/v1/runs/bad id/cancel", json={"reason": "x"}), 400, "invalid_run_id")
    _error(operator_session.post("/api/v1/runs/run_absent/cancel", json={"reason": "x"}), 404, "not_found")
    assert Run.objects.get(workspace=workspace, run_id="run_target").last_sequence == 1
    assert not AuditEntry.objects.filter(action="run.cancelled").exists()
    # An operator's session cancels the idle run at once.
    done = operator_session.post(url, json={"reason": REASON})
    assert done.status_code == 202, done.text
    assert done.json()["executorHeld"] is False
    assert AuditEntry.objects.get(action="run.cancelled").actor == "carol"


# --- the console's Cancel action ------------------------------------------------------------------


def test_operators_see_cancel_on_a_running_run_and_it_cancels_with_htmx(
    client: Any, workspace: Workspace, append: Any, operator: User, viewer: User
) -> None:
    append("run_console", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    page = "/w/acme/support/runs/run_console/"
    url = page + "cancel/"
    client.force_login(viewer)
    assert 'id="cancel-run"' not in client.get(page).content.decode()
    assert client.post(url, {"reason": REASON}).status_code == 403
    client.force_login(operator)
    html = client.get(page).content.decode()
    assert 'id="cancel-run"' in html and f'hx-post="{url}"' in html

    refused = client.post(url, {"reason": "  "}, HTTP_HX_REQUEST="true")
    assert refused.status_code == 400
    assert "the reason is required" in refused.content.decode()
    assert Run.objects.get(run_id="run_console").status == "running"

    done = client.post(url, {"reason": REASON}, HTTP_HX_REQUEST="true")

    assert (done.status_code, done["HX-Redirect"]) == (204, page)
    run = Run.objects.get(run_id="run_console")
    assert (run.status, run.error) == ("failed", {"name": "Cancelled", "message": REASON})
    assert AuditEntry.objects.get(action="run.cancelled").actor == "carol"
    assert 'id="cancel-run"' not in client.get(page).content.decode()  # ended: nothing to cancel
    again = client.post(url, {"reason": REASON})
    assert again.status_code == 409 and "already ended" in again.content.decode()


def test_cancel_of_another_tenants_run_is_404(client: Any, workspace: Workspace, append: Any, outsider: User) -> None:
    append("run_theirs", {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_x"}})
    client.force_login(outsider)

    assert client.post("/w/acme/support/runs/run_theirs/cancel/", {"reason": REASON}).status_code == 404
    assert client.post("/w/globex/main/runs/run_theirs/cancel/", {"reason": REASON}).status_code == 404
    assert Run.objects.get(run_id="run_theirs").status == "running"
