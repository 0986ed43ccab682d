"""The evidence views of issue 13 in headless Chromium, on the runs `ledger demo` lays out: the
conversation of the crashed-and-resumed run, search inside it, the in-doubt run at any event
(slider, ←/→, `?at=N` after a reload) and the orchestrator's waterfall with its five sub-runs."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Daphne, log_in_to_demo

pytestmark = pytest.mark.django_db(transaction=True)

SUPPORT = "/w/acme/support/runs"
RESEARCH = "/w/acme/research/runs"


def test_the_crashed_run_reads_as_a_conversation_and_search_finds_its_tool(
    page: Page, server: Daphne, demo: None
) -> None:
    log_in_to_demo(page, server)
    page.goto(f"{server.url}{SUPPORT}/run_demo_crashed_resumed/")
    page.click('a[data-tab="conversation"]')
    expect(page).to_have_url(f"{server.url}{SUPPORT}/run_demo_crashed_resumed/conversation/")
    session = page.locator(".session-view").first
    expect(session).to_contain_text("worker.ai-generate")
    # Turn 1, the tool call it asked for with its arguments and result, then turn 2: in that order.
    items = session.locator(".turn, .tool-call").evaluate_all(
        "nodes => nodes.map(n => n.classList.contains('turn') ? 'turn ' + n.dataset.turn : 'tool ' + n.dataset.tool)"
    )
    assert items == ["turn 1", "tool lookup_order", "turn 2"], items
    tool = session.locator(".tool-call").first
    expect(tool).to_contain_text('"orderId": "B-2"')
    expect(tool).to_contain_text('"status": "delayed"')
    turn_2 = session.locator('.turn[data-turn="2"]')
    expect(turn_2).to_contain_text("Answer for: Customer says: My order is late, again.")
    expect(turn_2).to_contain_text("later")  # answered twenty minutes after it was called: the crash

    page.click('a[data-tab="timeline"]')
    page.fill("#timeline-search input[name=tool]", "lookup_order")
    page.click("#timeline-search button[type=submit]")
    expect(page.locator("#search-summary")).to_contain_text("4 matching events")
    types = page.locator("#timeline-rows .ev-type").all_inner_texts()
    assert types == ["harness.tool_call.started", "harness.tool_call.succeeded"] * 2, types
    assert "tool=lookup_order" in page.url


def test_the_in_doubt_run_at_the_event_before_its_call_and_after_a_reload(
    page: Page, server: Daphne, demo: None
) -> None:
    log_in_to_demo(page, server)
    page.goto(f"{server.url}{SUPPORT}/run_demo_in_doubt/state/")
    refund = page.locator('#at-tools tr[data-call="refund:call"]')
    expect(refund).to_contain_text("in doubt")
    last = int(page.locator("#scrubber").get_attribute("max") or 0)
    # The in-doubt call's events are its start and the in-doubt marker, the log's last two.
    page.locator("#scrubber").focus()
    page.keyboard.press("ArrowLeft")
    expect(page).to_have_url(f"{server.url}{SUPPORT}/run_demo_in_doubt/state/?at={last - 1}")
    expect(refund).to_contain_text("started")
    expect(page.locator("#scrubber")).to_be_focused()
    page.keyboard.press("ArrowLeft")
    before = f"{server.url}{SUPPORT}/run_demo_in_doubt/state/?at={last - 2}"
    expect(page).to_have_url(before)
    expect(refund).to_contain_text("not started yet")
    expect(page.locator("#at-event")).to_contain_text("StepAttemptStarted")
    shown = page.locator("#run-at").inner_text()

    page.reload()
    expect(page.locator("#scrubber")).to_have_value(str(last - 2))
    expect(refund).to_contain_text("not started yet")
    assert page.locator("#run-at").inner_text() == shown

    page.keyboard.press("ArrowRight")  # anywhere on the page, not only on the slider
    expect(page).to_have_url(f"{server.url}{SUPPORT}/run_demo_in_doubt/state/?at={last - 1}")


def test_the_orchestrators_waterfall_shows_five_sub_runs_that_expand_and_open(
    page: Page, server: Daphne, demo: None
) -> None:
    log_in_to_demo(page, server)
    page.goto(f"{server.url}{RESEARCH}/run_demo_orchestrator/waterfall/")
    subruns = page.locator('.wf-row[data-kind="subrun"]')
    expect(subruns).to_have_count(5)
    expect(page.locator('.wf-row.pattern-hatched[data-kind="subrun"]')).to_have_count(1)  # the licence failure
    first = subruns.first
    child = first.get_attribute("data-subrun")
    assert child and child.startswith("run_sub_")

    expand = first.locator(".wf-expand")
    expand.click()
    expect(expand).to_have_attribute("aria-expanded", "true")
    expect(page.locator(f"#wf-sub-{child} .wf-row").first).to_be_visible()
    expect(page.locator(f"#wf-sub-{child}")).to_contain_text("fetch_sources")
    expand.click()
    expect(page.locator(f"#wf-sub-{child}")).to_be_hidden()

    first.locator("a.wf-link").click()
    expect(page).to_have_url(f"{server.url}{RESEARCH}/{child}/")
    expect(page.locator("h1 .run-id")).to_have_text(child)
