"""Four eyes in a real browser: carol (operator) asks for a fork from the run page, bob (approver)
sees it on the Approvals page and approves it with a note, the real worker process executes it,
the new run appears on bob's page without a reload, its divergence page shows the changed step,
and alice (admin) finds every action in the audit log. Screenshots of the request form, the
Approvals page and the divergence page, light and dark, land in var/screenshots/."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import ReexecutionRequest, Run, Workspace
from ledger.runtime.executor import start_run
from tests.browser.conftest import Daphne, Worker, log_in, screenshot_dir

pytestmark = pytest.mark.django_db(transaction=True)

RUN = "run_parcel"
SCHEMES = ("light", "dark")
NEW_INPUT = '{"ticket": "Where is my parcel?", "orderId": "D-4"}'


def _shoot(page: Page, name: str) -> None:
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        page.screenshot(path=str(screenshot_dir() / f"{name}-{scheme}.png"), full_page=True)
    page.emulate_media(color_scheme="light")


def _wait_for_run(workspace: Workspace, run_id: str) -> None:
    """Until the worker has written the new run's first event (it is `running` a moment before)."""
    for _ in range(600):
        if Run.objects.filter(workspace=workspace, run_id=run_id).exists():
            return
        time.sleep(0.1)
    raise AssertionError(f"the worker never started run {run_id}")


def test_carol_asks_bob_approves_the_worker_executes_and_the_audit_log_shows_it(
    open_context: object,
    server: Daphne,
    workspace: Workspace,
    worker: list[Worker],
    tmp_path: Path,
    admin: User,
    approver: User,
    operator: User,
) -> None:
    start_run(
        workspace=workspace,
        workflow="support.triage",
        run_id=RUN,
        input={"ticket": "Where is my parcel?", "orderId": "A-1"},
    )
    for name in ("reexecute-form", "approvals", "divergence"):
        for scheme in SCHEMES:
            (screenshot_dir() / f"{name}-{scheme}.png").unlink(missing_ok=True)

    # carol: the run page's action, the fork's plan refreshed as she picks the step, then the request.
    carol = open_context().new_page()  # type: ignore[operator]
    log_in(carol, server, operator, f"/w/acme/support/runs/{RUN}/")
    carol.click("#reexecute")
    carol.wait_for_load_state()  # htmx binds the form's change trigger once the page has loaded
    carol.check("input[name=mode][value=fork]")
    carol.select_option("#from-step", "normalize")
    plan = carol.locator("#plan")
    expect(plan.locator('tr[data-step="normalize"][data-action="live"]')).to_be_visible()
    expect(plan.locator('tr[data-step="confirm"][data-action="live"]')).to_be_visible()
    carol.fill("textarea[name=input]", NEW_INPUT)
    carol.fill("textarea[name=reason]", "What would we have told the customer about order D-4?")
    _shoot(carol, "reexecute-form")
    carol.click("#submit-request")
    row = carol.locator("tr.reexecution")
    expect(row).to_have_attribute("data-status", "pending_approval")
    rx = ReexecutionRequest.objects.get()
    assert (rx.mode, rx.from_step, rx.requested_by) == ("fork", "normalize", "carol")

    # bob: the request on the Approvals page, with the count in the navigation; approve with a note.
    bob = open_context().new_page()  # type: ignore[operator]
    log_in(bob, server, approver, "/w/acme/support/approvals/")
    card = bob.locator(f"#rx-{rx.public_id}")
    expect(card).to_contain_text("carol")
    expect(card).to_contain_text("order D-4")
    expect(bob.locator("#pending-badge")).to_have_text("1")
    expect(bob.locator("#live-status")).to_have_attribute("data-state", "live")
    _shoot(bob, "approvals")
    card.locator("input[name=note]").fill("Read-only lookup; go ahead.")
    card.locator("button.approve").click()
    decided = bob.locator(f'table.decided tr[data-reexecution="{rx.public_id}"]')
    expect(decided).to_have_attribute("data-status", "approved")
    expect(bob.locator("#pending-badge")).to_be_hidden()
    expect(bob.locator("#live-status")).to_have_attribute("data-state", "live")
    bob.evaluate("window.stillTheSamePage = true")

    # The worker process takes the approved request from the durable queue and executes it; bob's
    # page follows over its socket, without a reload.
    # Its model calls wait until bob's page of the new run has loaded: what streams in after that
    # is what the page must show without a reload, however slow the machine.
    gate = tmp_path / "model-gate"
    worker.append(Worker(tmp_path / "worker.log", model_gate=gate))
    expect(decided).to_have_attribute("data-status", "running", timeout=60_000)
    assert bob.evaluate("window.stillTheSamePage === true")
    rx.refresh_from_db()
    _wait_for_run(workspace, rx.new_run_id)

    # The new run streams into its page while the worker executes it (its model answers slowly).
    decided.locator("a.new-run").click()
    expect(bob.locator("#run-origin")).to_contain_text(RUN)
    expect(bob.locator("#run-origin")).to_contain_text("approved by bob")
    shown_at_load = bob.locator("#timeline-rows tr.event").count()
    bob.evaluate("window.stillTheSamePage = true")
    gate.touch()
    expect(bob.locator("#run-status")).to_have_attribute("data-status", "completed", timeout=60_000)
    expect(bob.locator("#timeline-rows tr.event").last).to_contain_text("RunCompleted")
    assert bob.locator("#timeline-rows tr.event").count() > shown_at_load
    assert bob.evaluate("window.stillTheSamePage === true")
    rx.refresh_from_db()
    assert rx.status == "succeeded" and rx.approver_name == "bob"
    assert Run.objects.get(workspace=workspace, run_id=rx.new_run_id).status == "completed"

    bob.click("#divergence-link")
    first = bob.locator("#first-divergence")
    expect(first).to_have_attribute("data-step", "normalize")
    expect(first).to_have_attribute("data-comparison", "changed")
    expect(bob.locator("pre.diff .d-add").first).to_contain_text("D-4")
    _shoot(bob, "divergence")

    # alice: every action in the tenant's audit log.
    alice = open_context().new_page()  # type: ignore[operator]
    log_in(alice, server, admin, "/t/acme/audit/")
    for action in ("reexecution.requested", "reexecution.approved", "reexecution.started", "reexecution.finished"):
        entry = alice.locator(f'tr.audit-entry[data-action="{action}"]')
        expect(entry).to_have_count(1)
        expect(entry).to_contain_text(rx.public_id)
    expect(alice.locator('tr.audit-entry[data-action="reexecution.approved"]')).to_contain_text("go ahead")

    for name in ("reexecute-form", "approvals", "divergence"):
        for scheme in SCHEMES:
            assert (screenshot_dir() / f"{name}-{scheme}.png").stat().st_size > 10_000
