"""Cancel and tool approval in headless Chromium, on a Daphne with DEBUG off under the
Content-Security-Policy (as `make serve` runs it), recording every CSP violation, console error
and failed response: carol (operator) cancels a running run from its page with a reason (htmx),
and it reads "cancelled" with the reason; a goodwill credit waiting for an approver says so on the
runs list and in its header; bob (approver) approves it on the Approvals page, which carol, who
asked for the run, may not; the real worker process then resumes the run by itself and the credit
is sent once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from ledger.models import AuditEntry, Run, ToolCall, Workspace
from ledger.runtime.executor import start_run
from tests.browser.conftest import Worker, log_in_to_demo
from tests.browser.test_production_console import RECORD_VIOLATIONS
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

SUPPORT = "/w/acme/support"


@pytest.fixture
def watched(open_context: Any) -> Iterator[Any]:
    """Pages that record CSP violations, console errors and failed responses."""
    made: list[tuple[Page, list[str]]] = []

    def new() -> tuple[Page, list[str]]:
        page = open_context().new_page()
        page.add_init_script(RECORD_VIOLATIONS)
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        made.append((page, problems))
        return page, problems

    yield new


def _assert_clean(page: Page, problems: list[str]) -> None:
    violations = page.evaluate("window.__cspViolations || []")
    assert violations == [] and problems == [], (violations, problems)


def test_an_operator_cancels_a_running_run_from_its_page(watched: Any, production: Daphne, demo: None) -> None:
    support = Workspace.objects.get(tenant__slug="acme", slug="support")
    start_run(
        workspace=support,
        workflow="support.goodwill",
        run_id="run_to_cancel",
        input={"ticket": "Credit please", "orderId": "A-1", "amount": 5},
        requested_by="carol",
    )
    page, problems = watched()
    log_in_to_demo(page, production, "carol")
    page.goto(f"{production.url}{SUPPORT}/runs/run_to_cancel/")
    expect(page.locator("#run-status")).to_have_attribute("data-status", "running")

    page.locator("#cancel-run summary").click()
    page.fill("#cancel-run input[name=reason]", "the customer withdrew the request")
    page.click("#cancel-submit")

    expect(page.locator("#run-status")).to_have_attribute("data-status", "failed")
    expect(page.locator("#cancel-run")).to_have_count(0)
    expect(page.locator(".run-head [data-ended=cancelled]")).to_contain_text("the customer withdrew the request")
    run = Run.objects.get(workspace=support, run_id="run_to_cancel")
    assert run.error == {"name": "Cancelled", "message": "the customer withdrew the request"}
    assert AuditEntry.objects.filter(action="run.cancelled", target="run_to_cancel", actor="carol").count() == 1
    _assert_clean(page, problems)

    # A viewer is offered no Cancel on a running run.
    viewer, viewer_problems = watched()
    log_in_to_demo(viewer, production, "dave")
    viewer.goto(f"{production.url}{SUPPORT}/runs/run_demo_awaiting_approval/")
    expect(viewer.locator("#run-status")).to_have_attribute("data-status", "running")
    expect(viewer.locator("#cancel-run")).to_have_count(0)
    _assert_clean(viewer, viewer_problems)


def test_an_approver_approves_the_waiting_call_on_the_approvals_page_and_the_run_completes_by_itself(
    watched: Any, production: Daphne, demo: None, worker: list[Worker], tmp_path: Path
) -> None:
    support = Workspace.objects.get(tenant__slug="acme", slug="support")
    card_selector = '.tool-call-approval[data-run="run_demo_awaiting_approval"]'
    row_selector = 'tr.run[data-run-id="run_demo_awaiting_approval"]'
    worker.append(Worker(tmp_path / "worker.log"))  # `make run` starts it beside Daphne

    # carol asked for the run: the runs list and its header say what it waits for.
    carol, carol_problems = watched()
    log_in_to_demo(carol, production, "carol")
    carol.goto(f"{production.url}{SUPPORT}/?attention=waiting_tool_approval")
    waiting = carol.locator(f"{row_selector} [data-attention]")
    expect(waiting).to_have_attribute("data-attention", "waiting_tool_approval")
    expect(waiting).to_contain_text("send_goodwill_credit")
    expect(carol.locator('tr.run[data-run-id="run_demo_in_doubt"]')).to_have_count(0)  # another need
    carol.goto(f"{production.url}{SUPPORT}/runs/run_demo_awaiting_approval/")
    expect(carol.locator("#run-status")).to_have_attribute("data-status", "running")
    expect(carol.locator(".run-head [data-attention]")).to_have_attribute("data-attention", "waiting_tool_approval")

    # She sees the call and its arguments on the Approvals page, and no Approve.
    carol.goto(f"{production.url}{SUPPORT}/approvals/")
    card = carol.locator(card_selector)
    expect(card).to_contain_text("send_goodwill_credit")
    expect(card.locator("pre.tool-args")).to_contain_text('"orderId": "B-2"')
    expect(card.locator("button.approve")).to_have_count(0)
    _assert_clean(carol, carol_problems)

    bob, problems = watched()
    log_in_to_demo(bob, production, "bob")
    bob.goto(f"{production.url}{SUPPORT}/approvals/")
    # The live list is fetched again once its socket opens (static/js/live.js): let that
    # reload land before writing the note, or the click can hit the card the reload replaces.
    expect(bob.locator("#live-status")).to_have_attribute("data-state", "live")
    bob.wait_for_load_state("networkidle")
    card = bob.locator(card_selector)
    expect(card.locator("pre.tool-args")).to_contain_text('"amount": 25')
    card.locator("input[name=note]").fill("Two late deliveries: a credit is fair.")
    card.locator("button.approve").click()

    expect(bob.locator(card_selector)).to_have_count(0)
    expect(bob.locator("#no-tool-calls")).to_be_visible()
    _assert_clean(bob, problems)
    assert AuditEntry.objects.get(action="tool_call.approved").actor == "bob"

    # No command line: the worker resumes the run, the credit is sent once, the header says so.
    bob.goto(f"{production.url}{SUPPORT}/runs/run_demo_awaiting_approval/")
    status = bob.locator("#run-status")
    for _ in range(120):  # a reload until the worker has finished the run (each answer is a fresh page)
        if status.get_attribute("data-status") == "completed":
            break
        bob.wait_for_timeout(500)
        bob.reload()
    expect(status).to_have_attribute("data-status", "completed")
    expect(bob.locator(".run-head [data-attention]")).to_have_count(0)
    run = Run.objects.get(workspace=support, run_id="run_demo_awaiting_approval")
    assert run.output == {"credited": "gc-B-2"}
    call = ToolCall.objects.get(run=run)
    assert (call.status, call.result) == ("succeeded", {"creditId": "gc-B-2", "amount": 25})
    _assert_clean(bob, problems)
