"""The fragments the live pages fetch again (static/js/live.js) and the run at a glance.

The run's header fragment (`…/runs/<id>/header/`), the Approvals list with the navigation's count,
an evaluate batch's body; what a page opened on a running and on a finished run wires (one socket
or none); the Approvals socket hearing a tool call that starts waiting; outsiders get 404 (or a
refused handshake) everywhere."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.db import database_sync_to_async
from django.contrib.auth.models import User
from django.test import Client

from ledger.log import append
from ledger.models import ToolCall, Workspace
from ledger.replay import toolapproval
from ledger.runtime.executor import start_run
from ledger.runtime.registry import CodeRun, Tool, Workflow
from ledger.runtime.registry import ToolCall as ToolStep
from tests.conftest import ev, started
from tests.live_support import TIMEOUT_S, communicator, session_id

BASE = "/w/acme/support"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _responded(call_id: str, step: str, inp: int, out: int) -> list[dict[str, Any]]:
    return [
        ev("harness.model.called", stepPath=step, turn=1, callId=call_id, promptHash="h", request={}),
        ev(
            "harness.model.responded",
            stepPath=step,
            turn=1,
            callId=call_id,
            model=MINI,
            response={"text": "ok", "usage": {"inputTokens": inp, "outputTokens": out}},
        ),
    ]


def _family(workspace: Workspace) -> None:
    """run_parent (running, one model call, a long input) with a finished child run_child."""
    long_text = "word " * 400
    append(
        workspace=workspace,
        run_id="run_parent",
        events=[
            started(
                "wf_glance",
                input={"ticket": "Where is my order?", "orderId": "A-17", "notes": long_text, "nested": {"a": [1, 2]}},
            ),
            *_responded("p1", "draft", 1200, 34),
        ],
    )
    append(
        workspace=workspace,
        run_id="run_child",
        events=[
            started("wf_child", parentRunId="run_parent", rootRunId="run_parent"),
            *_responded("c1", "look", 300, 7),
            ev("RunCompleted", output={"answer": "It ships tomorrow", "confidence": 0.9}),
        ],
    )


@pytest.mark.django_db
def test_the_header_fragment_shows_the_run_at_a_glance(workspace: Workspace, operator: User) -> None:
    _family(workspace)
    html = as_(operator).get(f"{BASE}/runs/run_parent/header/").content.decode()
    assert "<html" not in html and 'id="run-header"' in html
    assert f'data-live-src="{BASE}/runs/run_parent/header/"' in html
    # The input as fields, each readable; a long value folded with a way to see it all.
    inp = html[html.index('id="run-input"') : html.index('id="run-output"')]
    assert re.search(r'<dt class="mono">ticket</dt><dd><pre class="text" dir="auto">Where is my order\?</pre>', inp)
    assert "A-17" in inp and "Show all 2,000 characters" in inp
    assert "▶ payload" not in inp and "{&quot;" not in inp
    # Still running: no output yet, and an operator is offered Cancel.
    out = html[html.index('id="run-output"') :]
    assert "not yet" in out and 'id="cancel-run"' in html
    # Tokens in/out with separators, the run's cost and its tree's (labelled), models, the zip.
    assert re.search(r'id="run-tokens"><dt>Tokens</dt><dd class="num">1,200 in · 34 out</dd>', html)
    assert "Cost with sub-runs" in html and "this run and 1 sub-run" in html
    assert '<span class="mono">openai/gpt-4o-mini</span>' in html
    zip_url = re.search(r'id="evidence-zip" class="action-link" href="([^"]+)" download', html).group(1)
    assert zip_url == "/api/v1/runs/run_parent/evidence.zip?workspace=acme/support"
    download = as_(operator).get(zip_url)
    assert download.status_code == 200 and download["Content-Type"] == "application/zip"

    child = as_(operator).get(f"{BASE}/runs/run_child/header/").content.decode()
    assert f'href="{BASE}/runs/run_parent/"' in child  # the parent, linked
    out = child[child.index('id="run-output"') :]
    assert "It ships tomorrow" in out and "confidence" in out
    assert 'id="cancel-run"' not in child and "Cost with sub-runs" not in child


@pytest.mark.django_db
def test_a_failed_run_shows_its_error_and_offers_no_cancel(workspace: Workspace, operator: User) -> None:
    append(
        workspace=workspace,
        run_id="run_broken",
        events=[
            started(),
            ev("RunFailed", error={"name": "LookupError", "message": "order A-17 not found", "stepPath": "lookup"}),
        ],
    )
    html = as_(operator).get(f"{BASE}/runs/run_broken/header/").content.decode()
    error = html[html.index('id="run-output"') :]
    assert "<h2>Error</h2>" in error and '<strong class="mono">LookupError</strong>' in error
    assert 'in step <span class="mono">lookup</span>' in error and "order A-17 not found" in error
    assert 'id="cancel-run"' not in html


@pytest.mark.django_db
def test_a_running_runs_page_has_one_socket_and_a_finished_ones_none(workspace: Workspace, member: User) -> None:
    append(workspace=workspace, run_id="run_going", events=[started(), ev("StepScheduled", stepPath="a")])
    append(workspace=workspace, run_id="run_done", events=[started(), ev("RunCompleted", output="ok")])
    going = as_(member).get(f"{BASE}/runs/run_going/steps/").content.decode()
    assert going.count("data-live-socket=") == 1
    assert 'data-live-socket="/ws/runs/run_going/" data-live-after="2" data-live-workspace="acme/support"' in going
    assert 'id="tab-panel"' in going and 'data-live-src="" data-live-swap="innerHTML"' in going
    assert "js/live.js" in going
    done = as_(member).get(f"{BASE}/runs/run_done/waterfall/").content.decode()
    assert "data-live-socket" not in done and "data-live-src" not in done
    assert '<span id="live-status" data-state="finished">finished</span>' in done
    # The open tab as the page fetches it again: the partial, not the page.
    partial = as_(member).get(f"{BASE}/runs/run_going/steps/", headers={"HX-Request": "true"}).content.decode()
    assert "<html" not in partial and 'id="run-tabs"' in partial


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["runs/run_parent/header/", "runs/run_parent/", "approvals/?fragment=list", "?x=1"])
def test_outsiders_get_404_for_every_live_fragment(workspace: Workspace, outsider: User, path: str) -> None:
    _family(workspace)
    response = as_(outsider).get(f"{BASE}/{path}", headers={"HX-Request": "true"})
    assert response.status_code == 404
    assert "run_parent" not in response.content.decode()


@pytest.mark.django_db
def test_anonymous_header_requests_go_to_the_login(workspace: Workspace) -> None:
    _family(workspace)
    response = Client().get(f"{BASE}/runs/run_parent/header/")
    assert response.status_code == 302 and "/login" in response["Location"]


def _mailer() -> Workflow:
    return Workflow(
        name="mailer",
        tools={"send_email": Tool("send_email", lambda args: {"id": "m1"}, effect="write", approval="required")},
        steps=(
            CodeRun("prep", lambda i, o: {"subject": i["subject"]}),
            ToolStep("send", "send_email", lambda i, o: {"to": "ann@example.com", "subject": o["prep"]["subject"]}),
        ),
    )


@pytest.mark.django_db
def test_the_approvals_fragment_carries_the_navigations_count(
    workspace: Workspace, approver: User, outsider: User
) -> None:
    start_run(workspace=workspace, workflow=_mailer(), input={"subject": "hi"}, run_id="run_mail", requested_by="carol")
    assert ToolCall.objects.filter(status="waiting_approval").count() == 1
    page = as_(approver).get(f"{BASE}/approvals/").content.decode()
    # The badge counts what the page lists: here one tool call waiting, no re-execution request.
    assert re.search(r'id="pending-badge" title="waiting for approval">1<', page)
    assert f'data-live-src="{BASE}/approvals/?fragment=list" data-live-swap="innerHTML"' in page
    assert 'data-live-socket="/ws/workspaces/acme/support/reexecutions/"' in page
    fragment = as_(approver).get(f"{BASE}/approvals/?fragment=list").content.decode()
    assert "<html" not in fragment
    assert re.search(
        r'<span class="badge" id="pending-badge" title="waiting for approval" hx-swap-oob="true">1<', fragment
    )
    runs_page = as_(approver).get(f"{BASE}/").content.decode()
    assert re.search(r'id="pending-badge" title="waiting for approval">1<', runs_page)


@pytest.mark.django_db(transaction=True)
def test_the_approvals_socket_hears_a_tool_call_decided(workspace: Workspace, approver: User, outsider: User) -> None:
    """Deciding a waiting tool call is announced to the workspace (not only to the run's own
    feed), so an Approvals page open elsewhere fetches its list again."""
    path = "/ws/workspaces/acme/support/reexecutions/"
    start_run(workspace=workspace, workflow=_mailer(), input={"subject": "hi"}, run_id="run_wait", requested_by="carol")
    call = ToolCall.objects.get(run__run_id="run_wait", status="waiting_approval")
    bob, olga = session_id(approver), session_id(outsider)

    async def scenario() -> tuple[list[dict[str, Any]], bool]:
        mine = communicator(path, bob)
        assert (await mine.connect(timeout=TIMEOUT_S))[0]
        theirs = communicator(path, olga)
        refused = not (await theirs.connect(timeout=TIMEOUT_S))[0]
        await database_sync_to_async(toolapproval.decide)(
            workspace=workspace,
            run_id="run_wait",
            call_id=call.call_id,
            approve=True,
            seen_digest=toolapproval.pending_digest(call),
            note="fine",
            by=approver,
        )
        heard = [await mine.receive_json_from(timeout=TIMEOUT_S)]
        while heard[-1]["type"] != "run":  # the counts' poll may speak first
            heard.append(await mine.receive_json_from(timeout=TIMEOUT_S))
        await mine.disconnect()
        return heard, refused

    heard, refused = async_to_sync(scenario)()
    assert heard[-1] == {"type": "run", "runId": "run_wait"}
    assert refused
