"""Re-execution in the console: the run page's "Re-execute…" form and plan, the Approvals page
(approve/deny, self-approval refused, the navigation's count, the live socket), evaluate batches,
the divergence page and the tenant's audit page. For each page: it works, anonymous is refused,
each role sees what it may, another tenant's member gets 404.

Runs are made by the runtime (the demo's support.triage workflow) and requests go through the
real services; an approved request is executed by the built-in worker's task body, in-process."""

from __future__ import annotations

import re
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import cursors
from console.pages.approvals import DECIDED_CURSOR, PENDING_CURSOR
from ledger.log.verify import verify_run
from ledger.models import AuditEntry, ReexecutionRequest, Run, Workspace
from ledger.reexecution import executor, services
from ledger.runtime.executor import start_run
from tests.conftest import named_user
from tests.live_support import communicator, session_id

pytestmark = pytest.mark.django_db

RUN = "run_triage"
BASE = "/w/acme/support"
FORM = f"{BASE}/runs/{RUN}/reexecute/"
TICKET = {"ticket": "Where is my parcel?", "orderId": "A-1"}
Status = ReexecutionRequest.Status


@pytest.fixture
def people(admin: User, approver: User, operator: User, viewer: User, outsider: User) -> dict[str, User]:
    """conftest's named users: alice admin, bob approver, carol operator, dave viewer; olga of globex."""
    return {u.get_username(): u for u in (admin, approver, operator, viewer, outsider)}


@pytest.fixture
def run(workspace: Workspace) -> Run:
    start_run(workspace=workspace, workflow="support.triage", run_id=RUN, input=TICKET)
    return Run.objects.get(workspace=workspace, run_id=RUN)


def as_(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _fork(workspace: Workspace, by: User, **extra: Any) -> ReexecutionRequest:
    """A fork from the first step (the later ones read its output, not the run's input)."""
    return services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="fork", from_step="normalize", reason="try order D-4", by=by, **extra
    )


def _execute(rx: ReexecutionRequest) -> ReexecutionRequest:
    executor.run_request(request_pk=rx.pk)
    rx.refresh_from_db()
    return rx


# --- the request form --------------------------------------------------------------------------


def test_operators_see_the_action_and_viewers_do_not(people: dict[str, User], run: Run) -> None:
    for name in ("carol", "bob", "alice"):
        html = as_(people[name]).get(f"{BASE}/runs/{RUN}/").content.decode()
        assert f'href="{FORM}"' in html, name
    html = as_(people["dave"]).get(f"{BASE}/runs/{RUN}/").content.decode()
    assert 'id="reexecute"' not in html
    assert as_(people["dave"]).get(FORM).status_code == 403
    assert as_(people["dave"]).post(FORM, {"mode": "simulate", "reason": "x"}).status_code == 403
    assert not ReexecutionRequest.objects.exists()


def test_anonymous_and_outsiders_are_refused(people: dict[str, User], run: Run) -> None:
    response = Client().get(FORM)
    assert response.status_code == 302 and "/accounts/login/" in response["Location"]
    outsider = as_(people["olga"])
    assert outsider.get(FORM).status_code == 404
    assert outsider.post(FORM, {"mode": "simulate", "reason": "x"}).status_code == 404
    assert outsider.get(f"{FORM}plan/?mode=simulate").status_code == 404
    assert not ReexecutionRequest.objects.exists()


def test_the_form_shows_each_modes_plan_and_the_fork_steps(people: dict[str, User], run: Run) -> None:
    carol = as_(people["carol"])
    html = carol.get(FORM).content.decode()
    for mode in ("simulate", "evaluate", "resume", "fork", "rerun"):
        assert f'value="{mode}"' in html
    for step in ("normalize", "draft", "confirm"):
        assert f'<option value="{step}"' in html
    # The fork's plan, as a plain GET (no JavaScript) and as the htmx fragment.
    page = carol.get(FORM, {"mode": "fork", "from_step": "draft"}).content.decode()
    fragment = carol.get(f"{FORM}plan/", {"mode": "fork", "from_step": "draft"}, HTTP_HX_REQUEST="true")
    assert fragment.status_code == 200 and "<html" not in fragment.content.decode()
    for html in (page, fragment.content.decode()):
        assert re.search(r'data-step="normalize" data-action="reuse"', html)
        assert re.search(r'data-step="draft" data-action="live"', html)
        assert re.search(r'data-step="confirm" data-action="live"', html)
    simulate = carol.get(f"{FORM}plan/", {"mode": "simulate"}, HTTP_HX_REQUEST="true").content.decode()
    assert 'data-action="live"' not in simulate and "no write tool can fire" in simulate
    # What a screen reader is told of the changed plan: one sentence, into the form's live region.
    assert '<p id="plan-said" class="visually-hidden" role="status" aria-live="polite"></p>' in page
    said = re.search(r'<span hx-swap-oob="innerHTML:#plan-said">([^<]*)</span>', fragment.content.decode())
    assert said is not None and said[1] == (
        "Plan for fork from draft: model calls live, tool calls live; no write tool can fire."
    )


def test_resume_is_greyed_out_with_the_reason_on_a_finished_run(people: dict[str, User], run: Run) -> None:
    """A finished run has nothing to resume: the form says so beside the choice, before a reason
    is typed, instead of refusing the request after it."""
    assert run.status == "completed"
    html = as_(people["carol"]).get(FORM, {"mode": "resume"}).content.decode()
    resume = re.search(r'<input[^>]*value="resume"[^>]*>', html)
    assert resume is not None and " disabled" in resume[0] and "checked" not in resume[0]
    assert "This run has completed: there is nothing to resume." in html
    for mode in ("simulate", "evaluate", "fork", "rerun"):
        offered = re.search(rf'<input[^>]*value="{mode}"[^>]*>', html)
        assert offered is not None and "disabled" not in offered[0], mode


def test_the_plan_lists_write_tools_that_could_fire(people: dict[str, User], workspace: Workspace) -> None:
    start_run(
        workspace=workspace,
        workflow="support.refund",
        run_id="run_refund",
        input={"ticket": "Refund please", "orderId": "A-1", "amount": 10},
    )
    html = (
        as_(people["carol"])
        .get(f"{BASE}/runs/run_refund/reexecute/plan/", {"mode": "rerun"}, HTTP_HX_REQUEST="true")
        .content.decode()
    )
    assert 'id="live-write-tools"' in html and "issue_refund" in html


def test_bad_json_input_is_the_form_again_with_an_error_and_nothing_is_made(people: dict[str, User], run: Run) -> None:
    response = as_(people["carol"]).post(
        FORM, {"mode": "fork", "from_step": "draft", "input": "{not json", "reason": "try another order"}
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="input-error"' in html and "must be JSON" in html and "{not json" in html
    assert not ReexecutionRequest.objects.exists()
    assert not AuditEntry.objects.filter(action__startswith="reexecution.").exists()


def test_an_input_that_names_a_key_twice_is_refused_as_the_api_refuses_it(people: dict[str, User], run: Run) -> None:
    """Which of the two values would have been asked and approved? Parsers differ; the API's body
    is refused (invalid_json), and so is the form's input."""
    response = as_(people["carol"]).post(
        FORM,
        {"mode": "fork", "from_step": "draft", "input": '{"orderId": "A-1", "orderId": "D-4"}', "reason": "other"},
    )
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="input-error"' in html and "appears twice" in html
    assert not ReexecutionRequest.objects.exists()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"mode": "fork", "from_step": "draft", "reason": ""}, "reason is required"),
        ({"mode": "fork", "reason": "x"}, "Choose the step"),
        ({"mode": "teleport", "reason": "x"}, "Choose one of the five modes"),
        ({"mode": "evaluate", "reason": "x", "model:default": "gpt-4o"}, "as provider/model"),
        ({"mode": "evaluate", "reason": "x", "model:default": "nobody/gpt-4o"}, "no model provider"),
    ],
)
def test_invalid_requests_are_400_with_the_reason(
    people: dict[str, User], run: Run, body: dict[str, str], message: str
) -> None:
    response = as_(people["carol"]).post(FORM, body)
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not ReexecutionRequest.objects.exists()


def test_a_fork_request_goes_through_the_service_and_is_listed_on_the_evidence_tab(
    people: dict[str, User],
    run: Run,
) -> None:
    response = as_(people["carol"]).post(
        FORM,
        {
            "mode": "fork",
            "from_step": "draft",
            "input": '{"ticket": "Where is my parcel?", "orderId": "D-4"}',
            "reason": "what if it had been delivered",
            "model:default": "",
        },
    )
    assert response.status_code == 302 and response["Location"].startswith(f"{BASE}/runs/{RUN}/evidence/")
    rx = ReexecutionRequest.objects.get()
    assert (rx.mode, rx.from_step, rx.status, rx.requested_by) == ("fork", "draft", Status.PENDING_APPROVAL, "carol")
    assert rx.has_input and rx.input == {"ticket": "Where is my parcel?", "orderId": "D-4"}
    assert AuditEntry.objects.filter(action="reexecution.requested", target=rx.public_id, actor="carol").count() == 1
    html = as_(people["dave"]).get(f"{BASE}/runs/{RUN}/evidence/").content.decode()
    assert f'data-reexecution="{rx.public_id}" data-status="pending_approval"' in html
    assert "what if it had been delivered" in html


def test_the_requester_lands_on_a_notice_saying_what_becomes_of_the_request(people: dict[str, User], run: Run) -> None:
    carol = as_(people["carol"])
    asked = carol.post(FORM, {"mode": "fork", "from_step": "draft", "reason": "what if"})
    notice = carol.get(asked["Location"]).content.decode().split('id="just-requested"', 1)[1].split("</p>", 1)[0]
    rx = ReexecutionRequest.objects.get()
    assert f'data-reexecution="{rx.public_id}"' in notice and "pending approval" in notice
    assert "waits for an approver other than you" in notice and f'href="{BASE}/approvals/"' in notice
    # A simulation needs no approver: queued for the worker (none runs in this test).
    simulated = carol.post(FORM, {"mode": "simulate", "reason": "does it reproduce"})
    notice = carol.get(simulated["Location"]).content.decode().split('id="just-requested"', 1)[1].split("</p>", 1)[0]
    assert "approved" in notice and "the worker executes it" in notice
    # Without the parameter, or naming another run's request, there is no notice.
    assert 'id="just-requested"' not in carol.get(f"{BASE}/runs/{RUN}/evidence/?requested=rx_nope").content.decode()


def test_a_resume_of_a_finished_run_is_refused_on_the_form(people: dict[str, User], run: Run) -> None:
    response = as_(people["carol"]).post(FORM, {"mode": "resume", "reason": "again"})
    assert response.status_code in (400, 409)
    assert 'id="request-refused"' in response.content.decode() or "resume" in response.content.decode()
    assert not ReexecutionRequest.objects.exists()


# --- approvals ---------------------------------------------------------------------------------


def test_approvals_page_shows_pending_with_plan_digest_requester_and_reason(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    rx = _fork(workspace, people["carol"])
    html = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode()
    card = html[html.index(f'id="rx-{rx.public_id}"') :]
    assert "carol" in card and "try order D-4" in card and rx.digest[:20] in card
    assert 'data-step="normalize" data-action="live"' in card and 'id="live-write-tools"' in card
    assert f'action="{BASE}/approvals/{rx.public_id}/approve/"' in card
    # The card's plan is the form's without its live region's sentence: no #plan-said here.
    refreshed = as_(people["bob"]).get(f"{BASE}/approvals/", HTTP_HX_REQUEST="true").content.decode()
    assert 'data-step="normalize" data-action="live"' in refreshed and "plan-said" not in html + refreshed
    # The count in the navigation, on every workspace page.
    runs_page = as_(people["dave"]).get(f"{BASE}/").content.decode()
    assert re.search(r'id="pending-badge"[^>]*>1<', runs_page)


def test_the_requester_has_no_approve_button_and_a_post_is_refused(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    promoted = named_user("carol", "approver")
    rx = _fork(workspace, promoted)
    carol = as_(promoted)
    card = carol.get(f"{BASE}/approvals/").content.decode()
    assert f'formaction="{BASE}/approvals/{rx.public_id}/approve/"' not in card
    assert "another approver decides it" in card
    response = carol.post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "looks fine to me"})
    assert response.status_code == 403
    assert "never by its requester" in response.content.decode()
    rx.refresh_from_db()
    assert rx.status == Status.PENDING_APPROVAL
    assert not AuditEntry.objects.filter(action="reexecution.approved").exists()


def test_the_requester_has_no_deny_button_either_and_a_deny_is_refused(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    promoted = named_user("carol", "approver")
    rx = _fork(workspace, promoted)
    carol = as_(promoted)
    card = (
        carol.get(f"{BASE}/approvals/").content.decode().split(f'id="rx-{rx.public_id}"', 1)[1].split("</article>")[0]
    )
    assert "another approver decides it" in card and 'class="deny"' not in card and "<form" not in card
    response = carol.post(f"{BASE}/approvals/{rx.public_id}/deny/", {"note": "never mind"})
    assert response.status_code == 403 and "never by its requester" in response.content.decode()
    rx.refresh_from_db()
    assert rx.status == Status.PENDING_APPROVAL
    assert not AuditEntry.objects.filter(action="reexecution.denied").exists()
    # Another approver still has both buttons.
    card = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode().split(f'id="rx-{rx.public_id}"', 1)[1]
    assert 'class="approve"' in card.split("</article>")[0] and 'class="deny"' in card.split("</article>")[0]


def test_viewers_and_operators_cannot_decide(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    rx = _fork(workspace, people["bob"])
    for name in ("dave", "carol"):
        client = as_(people[name])
        html = client.get(f"{BASE}/approvals/").content.decode()
        assert f'id="rx-{rx.public_id}"' in html and 'form class="decide"' not in html
        assert client.post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "ok"}).status_code == 403
        assert client.post(f"{BASE}/approvals/{rx.public_id}/deny/", {"note": "no"}).status_code == 403
    assert ReexecutionRequest.objects.get().status == Status.PENDING_APPROVAL


def test_outsiders_get_404_on_approvals(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    rx = _fork(workspace, people["carol"])
    olga = as_(people["olga"])
    assert olga.get(f"{BASE}/approvals/").status_code == 404
    assert olga.post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "ok"}).status_code == 404
    assert olga.post(f"{BASE}/approvals/{rx.public_id}/deny/", {"note": "no"}).status_code == 404
    # Another tenant's request id in one's own workspace is not found either.
    assert (
        as_(people["olga"]).post(f"/w/globex/main/approvals/{rx.public_id}/approve/", {"note": "ok"}).status_code == 404
    )
    assert Client().get(f"{BASE}/approvals/").status_code == 302


def test_a_note_is_required(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    rx = _fork(workspace, people["carol"])
    response = as_(people["bob"]).post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "  "})
    assert response.status_code == 400 and "the note is required" in response.content.decode()
    assert ReexecutionRequest.objects.get().status == Status.PENDING_APPROVAL


def test_approve_executes_the_fork_and_both_runs_link_the_divergence(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    rx = _fork(workspace, people["carol"], input={"ticket": "Where is my parcel?", "orderId": "D-4"})
    response = as_(people["bob"]).post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "go ahead"})
    assert response.status_code == 302 and response["Location"] == f"{BASE}/approvals/"
    rx.refresh_from_db()
    assert (rx.status, rx.approver_name, rx.note) == (Status.APPROVED, "bob", "go ahead")
    rx = _execute(rx)
    assert rx.status == Status.SUCCEEDED
    new = Run.objects.get(workspace=workspace, run_id=rx.new_run_id)
    assert all(c.status == "pass" for c in verify_run(new))
    divergence = f"{BASE}/reexecutions/{rx.public_id}/divergence/"

    new_page = as_(people["dave"]).get(f"{BASE}/runs/{new.run_id}/").content.decode()
    assert 'id="run-origin"' in new_page and f'href="{BASE}/runs/{RUN}/"' in new_page
    assert f'href="{divergence}"' in new_page and "approved by bob" in new_page and "fork" in new_page
    evidence = as_(people["dave"]).get(f"{BASE}/runs/{RUN}/evidence/").content.decode()
    row = evidence[evidence.index(f'data-reexecution="{rx.public_id}"') :]
    assert 'data-status="succeeded"' in row[:80] and f'href="{divergence}"' in row
    assert f'href="{BASE}/runs/{new.run_id}/"' in row and "carol" in row and "bob" in row

    page = as_(people["dave"]).get(divergence)
    assert page.status_code == 200
    html = page.content.decode()
    assert 'id="first-divergence"' in html and 'data-comparison="changed"' in html
    first = re.search(r'<tr class="dv-row dv-row-(\w+) first-divergence" data-step="([^"]+)"', html)
    assert first is not None and first.group(1) == "changed" and first.group(2) == "normalize"
    assert re.search(r'data-step="draft" data-comparison="changed"', html)
    assert 'class="d-add"' in html and 'class="d-del"' in html  # the text diff, coloured per line
    assert "D-4" in html
    # Words, not the report's field names: the changed fields and the diff headings.
    draft = html[html.index('data-step="draft" data-comparison="changed"') :]
    assert '<span class="muted">output, model outputs, tool results</span>' in draft[:400]
    assert "<h3>Model outputs <span" in html and "<h3>Tool results <span" in html
    assert '<span class="status status-succeeded">' in html and ">pending_approval<" not in html
    decided = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode()
    assert f'data-reexecution="{rx.public_id}" data-status="succeeded"' in decided


def test_a_simulation_needs_no_approval_and_reproduces_the_original(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    response = as_(people["carol"]).post(FORM, {"mode": "simulate", "reason": "check the record replays"})
    assert response.status_code == 302
    rx = _execute(ReexecutionRequest.objects.get())
    assert rx.status == Status.SUCCEEDED and rx.approver_name == ""
    html = as_(people["carol"]).get(f"{BASE}/reexecutions/{rx.public_id}/divergence/").content.decode()
    assert "no divergence" in html and 'data-comparison="changed"' not in html
    assert 'id="first-divergence"' not in html


def _reexecutions_in_header(user: User) -> str:
    html = as_(user).get(f"{BASE}/runs/{RUN}/").content.decode()
    found = re.search(r'<div id="run-reexecutions">.*?</div>', html, re.S)
    assert found, "the header lists the run's re-executions"
    return found.group(0)


def test_the_header_links_a_new_run_only_once_an_executor_started_it(
    people: dict[str, User], workspace: Workspace, run: Run
) -> None:
    """An approved request has its new run's id reserved, but no run yet: a link to it was a 404."""
    rx = services.request_reexecution(workspace=workspace, run_id=RUN, mode="simulate", reason="c", by=people["carol"])
    assert rx.status == Status.APPROVED and rx.new_run_id
    waiting = _reexecutions_in_header(people["dave"])
    assert rx.new_run_id not in waiting and "<a" not in waiting
    assert rx.public_id in waiting and "waiting for an executor" in waiting
    rx = _execute(rx)
    started = _reexecutions_in_header(people["dave"])
    assert f'<a class="mono" href="{BASE}/runs/{rx.new_run_id}/">{rx.new_run_id}</a>' in started
    assert "waiting for an executor" not in started
    assert as_(people["dave"]).get(f"{BASE}/runs/{rx.new_run_id}/").status_code == 200


def test_deny_with_a_note(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    rx = services.request_reexecution(workspace=workspace, run_id=RUN, mode="rerun", reason="again", by=people["carol"])
    assert (
        as_(people["alice"]).post(f"{BASE}/approvals/{rx.public_id}/deny/", {"note": "costs too much"}).status_code
        == 302
    )
    rx.refresh_from_db()
    assert (rx.status, rx.approver_name, rx.note) == (Status.DENIED, "alice", "costs too much")
    html = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode()
    assert 'id="nothing-pending"' in html and "costs too much" in html
    # Deciding again is refused with the reason, not a 500.
    again = as_(people["bob"]).post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "ok now"})
    assert again.status_code == 409 and "not pending" in again.content.decode()


def test_the_divergence_page_of_a_denied_request_says_denied_and_promises_no_comparison(
    people: dict[str, User], workspace: Workspace, run: Run
) -> None:
    rx = services.request_reexecution(workspace=workspace, run_id=RUN, mode="rerun", reason="again", by=people["carol"])
    services.deny(workspace=workspace, reexecution_id=rx.public_id, by=people["alice"], note="costs too much")
    html = as_(people["dave"]).get(f"{BASE}/reexecutions/{rx.public_id}/divergence/").content.decode()
    assert "denied by alice" in html and "approved by" not in html
    no_report = html.split('id="no-report"', 1)[1].split("</p>", 1)[0]
    assert "the request was denied" in no_report and "appears once" not in no_report


def test_the_divergence_page_of_a_resume_points_at_the_run_it_continued(
    people: dict[str, User], workspace: Workspace, append: Any
) -> None:
    """A resume has no second run: the page says so instead of waiting for one that never comes."""
    from tests.conftest import started

    append("run_open", started())
    rx = services.request_reexecution(
        workspace=workspace, run_id="run_open", mode="resume", reason="go on", by=people["carol"]
    )
    services.approve(workspace=workspace, reexecution_id=rx.public_id, by=people["bob"], note="ok")
    html = as_(people["dave"]).get(f"{BASE}/reexecutions/{rx.public_id}/divergence/").content.decode()
    no_report = html.split('id="no-report"', 1)[1].split("</p>", 1)[0]
    assert "continues the run" in no_report and f'href="{BASE}/runs/run_open/"' in no_report
    assert "does not exist yet" not in no_report


def test_plan_changed_since_the_request_is_refused_at_approval(
    people: dict[str, User],
    workspace: Workspace,
) -> None:
    from ledger.log import append
    from tests.conftest import ev, started

    append(
        workspace=workspace,
        run_id="run_open",
        events=[started(), ev("StepScheduled", stepPath="a"), ev("StepAttemptStarted", stepPath="a", attempt=1)],
    )
    rx = services.request_reexecution(
        workspace=workspace, run_id="run_open", mode="rerun", reason="x", by=people["carol"]
    )
    append(workspace=workspace, run_id="run_open", events=[ev("StepCompleted", stepPath="a", attempt=1)])
    response = as_(people["bob"]).post(f"{BASE}/approvals/{rx.public_id}/approve/", {"note": "fine"})
    assert response.status_code == 409 and "changed since the request" in response.content.decode()


# --- batches -----------------------------------------------------------------------------------


def test_batch_evaluate_from_the_runs_list(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    start_run(
        workspace=workspace,
        workflow="support.triage",
        run_id="run_triage_2",
        input={"ticket": "Refund status?", "orderId": "B-2"},
    )
    runs_page = as_(people["carol"]).get(f"{BASE}/").content.decode()
    assert 'id="batch-form"' in runs_page and 'name="run" value="run_triage_2"' in runs_page
    assert 'id="batch-form"' not in as_(people["dave"]).get(f"{BASE}/").content.decode()

    response = as_(people["carol"]).post(
        f"{BASE}/batches/",
        {"run": [RUN, "run_triage_2"], "models": "default=scripted/gpt-4o", "reason": "does gpt-4o do better"},
    )
    assert response.status_code == 302
    made = list(ReexecutionRequest.objects.order_by("pk"))
    assert [r.mode for r in made] == ["evaluate", "evaluate"] and len({r.batch_id for r in made}) == 1
    batch_url = response["Location"]
    assert batch_url == f"{BASE}/batches/{made[0].batch_id}/"
    # One card, one decision, for the whole batch.
    approvals = as_(people["bob"]).get(f"{BASE}/approvals/").content.decode()
    assert approvals.count('class="request pending"') == 1 and "a batch of 2 runs" in approvals
    assert (
        as_(people["bob"]).post(f"{BASE}/approvals/{made[1].public_id}/approve/", {"note": "try it"}).status_code == 302
    )
    for rx in made:
        assert _execute(rx).status == Status.SUCCEEDED
    html = as_(people["dave"]).get(batch_url).content.decode()
    summary = html[html.index('id="batch-summary"') :]
    assert re.search(r"<strong>\d of 2</strong> kept their outcome", summary)
    assert "cost before" in summary and "after" in summary
    assert as_(people["olga"]).get(batch_url).status_code == 404
    assert (
        as_(people["dave"])
        .post(f"{BASE}/batches/", {"run": [RUN], "models": "default=scripted/x", "reason": "x"})
        .status_code
        == 403
    )


@pytest.mark.parametrize(
    "body, message",
    [
        ({"models": "default=scripted/gpt-4o", "reason": "x"}, "Tick the runs to evaluate"),
        ({"run": [RUN], "models": "default=scripted/gpt-4o"}, "reason is required"),
        ({"run": [RUN], "models": "gpt-4o", "reason": "x"}, "slot=provider/model"),
        ({"run": ["run_nope"], "models": "default=scripted/gpt-4o", "reason": "x"}, "not found"),
    ],
)
def test_bad_batches_are_400(people: dict[str, User], run: Run, body: dict[str, Any], message: str) -> None:
    response = as_(people["carol"]).post(f"{BASE}/batches/", body)
    assert response.status_code == 400 and message in response.content.decode()
    assert not ReexecutionRequest.objects.exists()


def test_a_refused_batch_keeps_what_was_typed_and_says_why_beside_each_field(people: dict[str, User], run: Run) -> None:
    """Nothing ticked: the runs list again, the form open with the mapping and reason as typed."""
    typed = {"models": "default=scripted/gpt-4o\nplanner=openai/gpt-4o-mini", "reason": "does gpt-4o do better"}
    response = as_(people["carol"]).post(f"{BASE}/batches/", typed)
    assert response.status_code == 400
    html = response.content.decode()
    form = html[html.index('<form id="batch-form"') : html.index("</form>", html.index('<form id="batch-form"'))]
    assert "<details open>" in form and 'role="alert"' in form
    assert '<p class="field-error" id="batch-run-error">Tick the runs to evaluate' in form
    assert ">default=scripted/gpt-4o\nplanner=openai/gpt-4o-mini</textarea>" in form
    assert 'name="reason" maxlength="2000" value="does gpt-4o do better"' in form
    assert '<tbody id="runs-rows">' in html and f'data-run-id="{RUN}"' in html  # the list to tick from
    # Ticked but nothing else: the tick is kept, and both other fields say why.
    again = as_(people["carol"]).post(f"{BASE}/batches/", {"run": [RUN]}).content.decode()
    assert re.search(rf'value="{RUN}" form="batch-form" aria-label="select {RUN}" checked', again)
    assert 'id="batch-models-error"' in again and 'id="batch-reason-error"' in again
    assert not ReexecutionRequest.objects.exists()


# --- divergence page access --------------------------------------------------------------------


def test_divergence_page_before_the_run_exists_and_for_outsiders(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    rx = _fork(workspace, people["carol"])
    url = f"{BASE}/reexecutions/{rx.public_id}/divergence/"
    html = as_(people["dave"]).get(url).content.decode()
    assert 'id="no-report"' in html
    assert as_(people["olga"]).get(url).status_code == 404
    assert as_(people["olga"]).get(f"/w/globex/main/reexecutions/{rx.public_id}/divergence/").status_code == 404
    assert Client().get(url).status_code == 302


# --- audit -------------------------------------------------------------------------------------


def test_the_audit_page_lists_each_action_for_admins_only(
    people: dict[str, User],
    workspace: Workspace,
    run: Run,
) -> None:
    rx = _fork(workspace, people["carol"])
    services.approve(workspace=workspace, reexecution_id=rx.public_id, by=people["bob"], note="go")
    _execute(ReexecutionRequest.objects.get())
    alice = as_(people["alice"])
    html = alice.get("/t/acme/audit/").content.decode()
    for action in ("reexecution.requested", "reexecution.approved", "reexecution.started", "reexecution.finished"):
        assert f'data-action="{action}"' in html, action
    assert 'id="audit-csv" href="/api/v1/audit?format=csv&amp;tenant=acme"' in html
    assert 'id="nav-audit"' in alice.get(f"{BASE}/").content.decode()
    assert 'id="nav-audit"' not in as_(people["bob"]).get(f"{BASE}/").content.decode()

    only_bob = alice.get("/t/acme/audit/", {"actor": "bob"}).content.decode()
    assert only_bob.count('class="audit-entry"') == 1 and 'data-action="reexecution.approved"' in only_bob
    denied = alice.get("/t/acme/audit/", {"action": "reexecution.denied"}).content.decode()
    assert 'class="audit-entry"' not in denied
    csv = alice.get("/api/v1/audit", {"format": "csv", "tenant": "acme", "actor": "bob"})
    assert csv.status_code == 200 and "reexecution.approved" in csv.content.decode()

    for name in ("bob", "carol", "dave"):
        assert as_(people[name]).get("/t/acme/audit/").status_code == 403
    assert as_(people["olga"]).get("/t/acme/audit/").status_code == 404
    assert as_(people["alice"]).get("/t/globex/audit/").status_code == 404
    assert Client().get("/t/acme/audit/").status_code == 302


@pytest.mark.parametrize(
    "query",
    [
        {"from": "yesterday"},
        {"action": "reexecution.teleported"},
        {"from": "2026-02-02", "to": "2026-01-01"},
        {"cursor": "!!"},
    ],
)
def test_bad_audit_filters_are_400_with_the_form(people: dict[str, User], query: dict[str, str]) -> None:
    response = as_(people["alice"]).get("/t/acme/audit/", query)
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="audit-filters"' in html and "cannot be applied" in html


def test_audit_pages_by_cursor(people: dict[str, User], workspace: Workspace, run: Run) -> None:
    from django.db import transaction

    from ledger.audit import record

    with transaction.atomic():
        for n in range(55):
            record(actor="alice", tenant=workspace.tenant, action="api_key.created", target=f"key:{n:04d}")
    alice = as_(people["alice"])
    first = alice.get("/t/acme/audit/", {"action": "api_key.created"}).content.decode()
    assert first.count('class="audit-entry"') == 50
    assert first.index("key:0054") < first.index("key:0053")  # newest first
    link = re.search(r'id="next-page" href="([^"]+)"', first)
    assert link is not None
    second = alice.get(link.group(1).replace("&amp;", "&")).content.decode()
    assert second.count('class="audit-entry"') == 5 and "key:0000" in second and "key:0054" not in second


# --- live --------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_the_approvals_socket_tells_members_and_refuses_outsiders(people: dict[str, User], run: Run) -> None:
    workspace = run.workspace
    bob_session, olga_session = session_id(people["bob"]), session_id(people["olga"])

    async def scenario() -> tuple[dict[str, Any], bool, bool]:
        from channels.db import database_sync_to_async

        path = "/ws/workspaces/acme/support/reexecutions/"
        bob = communicator(path, bob_session)
        connected, _ = await bob.connect()
        assert connected
        olga = communicator(path, olga_session)
        olga_connected, _ = await olga.connect()
        anonymous = communicator(path)
        anonymous_connected, _ = await anonymous.connect()
        rx = await database_sync_to_async(_fork)(workspace, people["carol"])
        message = await bob.receive_json_from(timeout=10)
        assert message["id"] == rx.public_id
        for each in (bob, olga, anonymous):
            await each.disconnect()
        return message, olga_connected, anonymous_connected

    message, olga_connected, anonymous_connected = async_to_sync(scenario)()
    assert message["type"] == "reexecution" and message["status"] == "pending_approval" and message["pending"] == 1
    assert not olga_connected and not anonymous_connected
    assert get_channel_layer() is not None


def _header_reads(user: User, path: str) -> tuple[str, list[str]]:
    """The run page's HTML and its queries of re-execution requests by run (the navigation's
    badge counts the workspace's pending ones apart, and the header's one question whether any
    names the run, selectors.neighbourhood, is not one of them)."""
    with CaptureQueriesContext(connection) as queries:
        response = as_(user).get(path)
    assert response.status_code == 200
    sql = [
        q["sql"]
        for q in queries
        if 'FROM "ledger_reexecutionrequest"' in q["sql"]
        and "_run_id" in q["sql"]
        and not q["sql"].startswith("SELECT EXISTS(")
    ]
    return response.content.decode(), sql


def test_the_header_reads_the_requests_around_a_run_once(
    people: dict[str, User], workspace: Workspace, run: Run
) -> None:
    """The re-executions listed in the header, the request that made the run and the one waiting
    for an approver (its attention) come from one query; they were three. A run no request names
    reads none."""
    html, sql = _header_reads(people["dave"], f"{BASE}/runs/{RUN}/")
    assert sql == [] and '<div id="run-reexecutions">' not in html  # none names the run: none read
    made = _execute(
        services.request_reexecution(workspace=workspace, run_id=RUN, mode="simulate", reason="c", by=people["carol"])
    )
    pending = services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="rerun", reason="r", by=people["carol"]
    )
    html, sql = _header_reads(people["dave"], f"{BASE}/runs/{RUN}/")
    assert len(sql) == 1, sql
    listed = re.search(r'<div id="run-reexecutions">.*?</div>', html, re.S)
    assert listed and made.public_id in listed.group(0) and pending.public_id in listed.group(0)
    assert 'data-attention="reexecution_pending"' in html and "rerun asked by carol" in html
    html, sql = _header_reads(people["dave"], f"{BASE}/runs/{made.new_run_id}/")
    assert len(sql) == 1, sql
    assert f'id="original-run" href="{BASE}/runs/{RUN}/">{RUN}</a>' in html and made.public_id in html


def test_a_run_with_more_requests_than_the_header_lists_still_shows_its_pending_one(
    people: dict[str, User], workspace: Workspace, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one query reads the first GLANCE_KEYS + 2 requests; a run with more asks again for
    what those leave open: here the pending request, the newest."""
    monkeypatch.setattr("console.pages.run.GLANCE_KEYS", 1)
    done = [
        _execute(
            services.request_reexecution(
                workspace=workspace, run_id=RUN, mode="simulate", reason=f"c{n}", by=people["carol"]
            )
        )
        for n in range(3)
    ]
    pending = services.request_reexecution(
        workspace=workspace, run_id=RUN, mode="rerun", reason="r", by=people["carol"]
    )
    html, sql = _header_reads(people["dave"], f"{BASE}/runs/{RUN}/")
    listed = re.search(r'<div id="run-reexecutions">.*?</div>', html, re.S)
    assert listed and done[0].public_id in listed.group(0)
    assert all(rx.public_id not in listed.group(0) for rx in [*done[1:], pending])
    assert 'data-attention="reexecution_pending"' in html and "rerun asked by carol" in html
    assert len(sql) == 3, sql  # the first rows, then the request that made the run and the pending one


def test_pending_decisions_are_paged_oldest_first_and_a_decision_keeps_its_page(
    people: dict[str, User], workspace: Workspace, other_workspace: Workspace, run: Run
) -> None:
    """Each single request's card computes its plan: 23 waiting decisions are a page of 20 and a
    page of 3; the count and the navigation's badge say 23 on both, and a decision made on the
    second page comes back to it."""
    waiting = [_fork(workspace, people["carol"]) for _ in range(22)]
    start_run(workspace=workspace, workflow="support.triage", run_id="run_triage_2", input=TICKET)
    batch_id, _ = services.request_batch(
        workspace=workspace, run_ids=[RUN, "run_triage_2"], reason="both", by=people["carol"]
    )
    bob = as_(people["bob"])

    first = bob.get(f"{BASE}/approvals/").content.decode()
    cards = re.findall(r'<article class="request pending" id="rx-([^"]+)"', first)
    assert cards == [rx.public_id for rx in waiting[:20]]
    assert re.search(r'id="pending-count">23<', first) and re.search(r'id="pending-badge"[^>]*>23<', first)
    assert 'id="pending-first"' not in first
    next_url = re.search(r'href="([^"]+)" id="pending-next" rel="next">Next page \(3 more waiting\)', first)
    assert next_url is not None

    second_url = next_url.group(1).replace("&amp;", "&")
    second = bob.get(second_url).content.decode()
    cards = re.findall(r'<article class="request pending" id="rx-([^"]+)"', second)
    batch_first = ReexecutionRequest.objects.filter(batch_id=batch_id).order_by("pk").first()
    assert batch_first is not None
    assert cards == [waiting[20].public_id, waiting[21].public_id, batch_first.public_id]
    assert "a batch of 2 runs" in second and re.search(r'id="pending-count">23<', second)
    assert 'id="pending-first"' in second and 'id="pending-next"' not in second
    assert f'data-live-src="{second_url}&amp;fragment=list"' in second  # live updates keep this page

    # Decided on the second page, without htmx: back to the second page; the count follows.
    action = f"{BASE}/approvals/{waiting[20].public_id}/approve/?{second_url.split('?', 1)[1]}"
    assert f'action="{action.replace("&", "&amp;")}"' in second
    response = bob.post(action, {"note": "fine"})
    assert response.status_code == 302 and response["Location"] == second_url
    assert ReexecutionRequest.objects.get(pk=waiting[20].pk).status != Status.PENDING_APPROVAL
    again = bob.get(second_url).content.decode()
    assert re.findall(r'<article class="request pending" id="rx-([^"]+)"', again) == [
        waiting[21].public_id,
        batch_first.public_id,
    ]
    assert re.search(r'id="pending-count">22<', again)
    # A refused decision on that page shows that page again, saying why.
    refused = bob.post(
        f"{BASE}/approvals/{waiting[21].public_id}/approve/?{second_url.split('?', 1)[1]}", {"note": " "}
    )
    assert refused.status_code == 400 and 'id="pending-first"' in refused.content.decode()

    # A cursor of another workspace's list, or none at all: a 400 with no cards and the first page's link.
    foreign = cursors.seal(
        {"t": waiting[0].created_at.isoformat(), "id": waiting[0].pk}, kind=PENDING_CURSOR, scope=other_workspace
    )
    for bad in (foreign, "not-a-cursor"):
        response = bob.get(f"{BASE}/approvals/", {"after": bad})
        html = response.content.decode()
        assert response.status_code == 400 and 'id="broken-page"' in html and 'id="pending-first"' in html
        assert '<article class="request pending" id="rx-' not in html
    # An outsider with this list's page link: 404.
    assert as_(people["olga"]).get(second_url).status_code == 404


def test_decided_requests_are_paged_newest_first_and_keep_the_queues_place(
    people: dict[str, User], workspace: Workspace, other_workspace: Workspace, run: Run, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Decided table showed the newest DECIDED_SHOWN and nothing older; now *Older decisions*
    leads on (here 2 to a page: 5 denied are pages of 2, 2 and 1), keeping the pending queue's
    place, and a broken link is a 400 with no rows and the newest page's link."""
    monkeypatch.setattr("console.pages.approvals.DECIDED_SHOWN", 2)
    monkeypatch.setattr("console.pages.approvals.PENDING_SHOWN", 1)
    denied = []
    for _ in range(5):
        rx = _fork(workspace, people["carol"])
        services.deny(workspace=workspace, reexecution_id=rx.public_id, by=people["bob"], note="no")
        denied.append(rx)
    waiting = [_fork(workspace, people["carol"]) for _ in range(2)]
    newest_first = [rx.public_id for rx in reversed(denied)]
    dave = as_(people["dave"])

    def rows(html: str) -> list[str]:
        return re.findall(r'<tr data-reexecution="([^"]+)" data-status="denied">', html)

    # On the pending queue's second page: the decided pages keep it, and it keeps theirs.
    first = dave.get(f"{BASE}/approvals/").content.decode()
    pending_next = re.search(r'href="([^"]+)" id="pending-next"', first)
    assert pending_next is not None
    url = pending_next.group(1).replace("&amp;", "&")
    pages = []
    while True:
        html = dave.get(url).content.decode()
        pages.append(rows(html))
        assert re.findall(r'<article class="request pending" id="rx-([^"]+)"', html) == [waiting[1].public_id]
        found = re.search(r'href="([^"]+)" id="decided-next" rel="next">Older decisions', html)
        if found is None:
            break
        url = found.group(1).replace("&amp;", "&")
        assert "after=" in url.split("decided_after=")[0]  # the pending queue's place, kept
    assert pages == [newest_first[:2], newest_first[2:4], newest_first[4:]]
    assert 'id="decided-first"' in html and "Older decisions" not in html
    assert 'id="decided-first"' not in first

    # Another workspace's cursor, or none at all: 400, no rows, the newest page's link.
    foreign = cursors.seal(
        {"t": denied[0].created_at.isoformat(), "id": denied[0].pk, "p": 0},
        kind=DECIDED_CURSOR,
        scope=other_workspace,
    )
    for bad in (foreign, "not-a-cursor"):
        response = dave.get(f"{BASE}/approvals/", {"decided_after": bad})
        html = response.content.decode()
        assert response.status_code == 400 and 'id="decided-broken-page"' in html and 'id="decided-first"' in html
        assert rows(html) == [] and "Nothing decided yet" not in html
    # An outsider with a page link of this table: 404.
    assert as_(people["olga"]).get(url).status_code == 404
