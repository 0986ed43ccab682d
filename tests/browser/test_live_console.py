"""One live mechanism (static/js/live.js), in headless Chromium against a Daphne with DEBUG off,
the production static files and the CSP: a run page opened while a harness appends through the
API follows the run to its end without a reload (header, waterfall, steps), a filtered runs list
keeps its filter while rows move and leaves them alone when nothing changed, the Approvals page follows a decision made elsewhere, and a
finished run's page opens no socket. Every page is checked for CSP violations and console errors."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.browser import data
from tests.browser.conftest import Appender, live_reaches, log_in_to_demo
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

SUPPORT = "/w/acme/support"
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline"));
});
"""


@pytest.fixture
def watch(open_context: Any) -> Iterator[Any]:
    """New pages (each its own browser context, so its own user) that record CSP violations,
    console errors, responses of 400 and more, and the WebSockets they open."""
    pages: list[tuple[Page, list[str]]] = []

    def _new() -> Page:
        page = open_context().new_page()
        page.add_init_script(RECORD_VIOLATIONS)
        problems: list[str] = []
        page.on("console", lambda m: problems.append(f"console: {m.text}") if m.type == "error" else None)
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        page.on("response", lambda r: problems.append(f"{r.status} {r.url}") if r.status >= 400 else None)
        page.sockets = []  # type: ignore[attr-defined]
        page.on("websocket", lambda ws: page.sockets.append(ws.url))  # type: ignore[attr-defined]
        pages.append((page, problems))
        return page

    yield _new
    for page, problems in pages:
        assert page.evaluate("window.__cspViolations || []") == [] and problems == [], problems


@pytest.fixture
def harness(production: Daphne, demo: None) -> Iterator[Appender]:
    """A harness appending through the production Daphne's API (so the announcement is made in the
    process that serves the pages)."""
    appender = Appender(production)
    _, appender.key = create_key(
        workspace=Workspace.objects.get(tenant__slug="acme", slug="support"), scopes=["ingest"]
    )
    yield appender
    appender.close()


def _fact(page: Page, label: str) -> Any:
    return page.locator(f"#run-header .facts div:has(dt:text-is('{label}')) dd").first


def test_a_run_page_follows_the_run_to_its_end_without_a_reload(
    watch: Any, production: Daphne, harness: Appender
) -> None:
    harness.append(
        "run_watch",
        data.started(label="watched", input={"ticket": "Where is my order?", "orderId": "A-17"}),
        *data.step("extract"),
    )
    waterfall = watch()
    log_in_to_demo(waterfall, production, "carol")  # an operator: Cancel is offered while it runs
    waterfall.goto(f"{production.url}{SUPPORT}/runs/run_watch/waterfall/")
    steps = watch()
    log_in_to_demo(steps, production, "carol")
    steps.goto(f"{production.url}{SUPPORT}/runs/run_watch/steps/")
    for page in (waterfall, steps):
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
        expect(page.locator("#run-status")).to_have_text("running")
        expect(_fact(page, "Events")).to_have_text("3")
        expect(page.locator("#cancel-run summary")).to_be_visible()
        expect(page.locator("#run-input")).to_contain_text("Where is my order?")
        page.evaluate("window.__notReloaded = true")
    expect(waterfall.locator(".wf-row[data-kind=step]")).to_have_count(1)
    expect(steps.locator("tr.step")).to_have_count(1)

    harness.append("run_watch", data.ev("StepCompleted", stepPath="extract", attempt=1, output={"n": 1}))
    harness.append(
        "run_watch", *data.step("answer"), *data.model_call("answer", 1, "openai", "gpt-4o-mini", (1200, 300))
    )
    expect(_fact(waterfall, "Events")).to_have_text("8")
    expect(waterfall.locator(".wf-row[data-kind=step]")).to_have_count(2)
    expect(steps.locator("tr.step")).to_have_count(2)
    harness.append(
        "run_watch",
        data.ev("StepCompleted", stepPath="answer", attempt=1, output={"text": "answer 1"}),
        data.ev("RunCompleted", output={"answer": "It ships tomorrow"}),
    )

    for page in (waterfall, steps):
        expect(page.locator("#run-status")).to_have_text("completed")
        expect(_fact(page, "Events")).to_have_text("10")
        expect(_fact(page, "Cost")).to_contain_text(re.compile(r"\$0\.\d+"))
        expect(page.locator("#run-tokens")).to_contain_text("1,200 in · 300 out")
        expect(page.locator("#run-models")).to_contain_text("openai/gpt-4o-mini")
        expect(page.locator("#run-output")).to_contain_text("It ships tomorrow")
        expect(page.locator("#cancel-run")).to_have_count(0)  # the action is gone with the run
        expect(page.locator("#live-status")).to_have_attribute("data-state", "finished")
        assert page.evaluate("window.__notReloaded") is True
    expect(waterfall.locator(".wf-row[data-kind=step].wf-completed")).to_have_count(2)
    expect(waterfall.locator(".wf-row[data-kind=model]")).to_have_count(1)
    expect(steps.locator("tr.step .status-completed")).to_have_count(2)
    expect(steps.locator('tr.step[data-step="answer"]')).to_contain_text("1,200")

    # Opened now, the finished run's page is static: no socket at all.
    static = watch()
    log_in_to_demo(static, production, "dave")  # lands on the runs list, which is live
    static.goto("about:blank")
    static.sockets.clear()  # type: ignore[attr-defined]
    static.goto(f"{production.url}{SUPPORT}/runs/run_watch/waterfall/")
    expect(static.locator("#live-status")).to_have_attribute("data-state", "finished")
    static.wait_for_load_state("networkidle")
    assert static.sockets == []  # type: ignore[attr-defined]
    # One socket for the whole run page (the other is the runs list the login landed on).
    assert [u for u in waterfall.sockets if "/ws/runs/" in u] == [  # type: ignore[attr-defined]
        f"{production.url.replace('http', 'ws')}/ws/runs/run_watch/?after=3&workspace=acme%2Fsupport"
    ]


def test_a_filtered_runs_list_keeps_its_filter_while_rows_move(
    watch: Any, production: Daphne, harness: Appender
) -> None:
    harness.append("run_filtered", data.started(label="will finish"), *data.step("extract"))
    page = watch()
    log_in_to_demo(page, production, "dave")
    page.goto(f"{production.url}{SUPPORT}/?status=running")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    row = page.locator('#runs-rows tr.run[data-run-id="run_filtered"]')
    expect(row).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    harness.append("run_late", data.started(label="arrived later"))
    expect(page.locator('#runs-rows tr.run[data-run-id="run_late"]')).to_be_visible()
    harness.append("run_filtered", data.ev("RunCompleted", output={"ok": True}))
    expect(row).to_have_count(0)  # completed: no longer a running run
    expect(page.locator('#runs-rows tr.run[data-run-id="run_late"]')).to_be_visible()
    assert page.evaluate("window.__notReloaded") is True


def test_a_refresh_that_changes_nothing_leaves_the_rows_alone(
    watch: Any, production: Daphne, harness: Appender
) -> None:
    """A click landing while the list is fetched again must not be lost to a swap that puts back
    the same rows: identical fragments are not swapped, changed ones are."""
    harness.append("run_quiet", data.started(label="moves, but not in this view"))
    page = watch()
    log_in_to_demo(page, production, "dave")
    page.goto(f"{production.url}{SUPPORT}/?status=failed")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    live_reaches(page, "refreshes", 1)
    # The refresh on the socket's opening fetched what the page was loaded with.
    assert page.evaluate("window.runledgerLive.unchanged") >= 1
    rows = page.locator("#runs-rows tr.run")
    shown = rows.count()
    assert shown >= 1
    rows.first.evaluate("row => { row.dataset.probe = 'the same node' }")

    before = page.evaluate("window.runledgerLive.unchanged")
    harness.append("run_quiet", *data.step("extract"))  # a running run: not listed here
    live_reaches(page, "unchanged", before + 1)
    expect(rows.first).to_have_attribute("data-probe", "the same node")

    harness.append("run_quiet", data.ev("RunFailed", error={"message": "now it is"}))
    expect(page.locator('#runs-rows tr.run[data-run-id="run_quiet"]')).to_be_visible()
    expect(rows).to_have_count(shown + 1)
    expect(page.locator("#runs-rows tr.run[data-probe]")).to_have_count(0)  # swapped this time


def test_the_approvals_page_follows_a_decision_made_elsewhere(watch: Any, production: Daphne, demo: None) -> None:
    card = '.tool-call-approval[data-run="run_demo_awaiting_approval"]'
    dave = watch()
    log_in_to_demo(dave, production, "dave")
    dave.goto(f"{production.url}{SUPPORT}/approvals/")
    expect(dave.locator("#live-status")).to_have_attribute("data-state", "live")
    waiting = dave.locator(card)
    expect(waiting).to_have_count(1)
    badge = dave.locator("#pending-badge")
    before = int(badge.inner_text())
    tool_count = dave.locator("#tool-calls-count")
    expect(tool_count).to_have_text("1")
    dave.evaluate("window.__notReloaded = true")

    bob = watch()
    log_in_to_demo(bob, production, "bob")
    bob.goto(f"{production.url}{SUPPORT}/approvals/")
    expect(bob.locator("#live-status")).to_have_attribute("data-state", "live")
    bob.wait_for_load_state("networkidle")
    mine = bob.locator(card)
    mine.locator("input[name=note]").fill("Two late deliveries: a credit is fair.")
    mine.locator("button.approve").click()
    expect(bob.locator(card)).to_have_count(0)

    expect(waiting).to_have_count(0)
    expect(tool_count).to_have_text("0")
    if before > 1:
        expect(badge).to_have_text(str(before - 1))
    else:
        expect(badge).to_be_hidden()
    assert dave.evaluate("window.__notReloaded") is True


def _listed(page: Page) -> list[tuple[str, str, str]]:
    """The runs list's rows as shown: run id, depth and parent."""
    return page.locator("#runs-rows tr.run").evaluate_all(
        "rows => rows.map(r => [r.dataset.runId, r.dataset.depth, r.dataset.parent || ''])"
    )


def test_a_sub_run_pushed_live_is_folded_under_its_parent_as_after_a_reload(
    watch: Any, production: Daphne, harness: Appender
) -> None:
    harness.append("run_live_parent", data.started(label="fans out"), *data.step("fan_out"))
    harness.append("run_live_newer", data.started(label="a newer root"))
    page = watch()
    log_in_to_demo(page, production, "dave")
    page.goto(f"{production.url}{SUPPORT}/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator('#runs-rows tr.run[data-run-id="run_live_newer"]')).to_be_visible()
    page.evaluate("window.__notReloaded = true")

    harness.append("run_live_child", data.started("wfver_notify", parentRunId="run_live_parent", label="child"))
    child = page.locator('#runs-rows tr.run[data-run-id="run_live_child"]')
    expect(child).to_be_visible()
    expect(child).to_have_attribute("data-parent", "run_live_parent")
    expect(child).to_have_attribute("data-depth", "1")
    expect(page.locator("#runs-rows tr.run").first).to_have_attribute("data-run-id", "run_live_newer")
    live = _listed(page)
    ids = [run_id for run_id, _, _ in live]
    assert ids.index("run_live_child") == ids.index("run_live_parent") + 1, live
    assert page.evaluate("window.__notReloaded") is True
    # The parent's row counts its sub-run, as the server renders it.
    expect(page.locator('#runs-rows tr.run[data-run-id="run_live_parent"] td.children')).to_have_text("1")

    page.reload()
    expect(page.locator('#runs-rows tr.run[data-run-id="run_live_child"]')).to_be_visible()
    assert _listed(page) == live
