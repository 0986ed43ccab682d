"""The console used with the keyboard alone, as a screen reader user would, in headless Chromium
against a Daphne with DEBUG off, the production static files and the CSP: where the focus lands
after each action (the skip link, a tab, a pager, a form's answer, a live refresh), that a refused
field says so (aria-invalid, aria-describedby) and takes the focus, that a one-time secret is
focused and selected for copying, that Escape folds a waterfall panel back to its bar, and that a
run's status changing live is announced in a live region. No page may log a CSP violation or a
script error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser import data
from tests.browser.conftest import Appender, live_reaches, log_in_to_demo
from tests.browser.test_live_console import RECORD_VIOLATIONS, harness
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["harness"]  # the fixture, shared with the live console's tests

SUPPORT = "/w/acme/support"


@pytest.fixture
def keyboard(open_context: Any) -> Iterator[Any]:
    """New pages (each its own context, so its own user) that must end without a CSP violation or
    a script error; refused forms answer 4xx here on purpose, so those are not problems."""
    pages: list[tuple[Page, list[str]]] = []

    def _new() -> Page:
        page = open_context().new_page()
        page.add_init_script(RECORD_VIOLATIONS)
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        pages.append((page, problems))
        return page

    yield _new
    for page, problems in pages:
        assert page.evaluate("window.__cspViolations || []") == [] and problems == [], problems


def focused(page: Page, attribute: str = "id") -> Any:
    return page.evaluate(f"document.activeElement ? document.activeElement.getAttribute({attribute!r}) : null")


def focus_is_visible(page: Page) -> bool:
    """A ring a sighted keyboard user can see: an outline or a box shadow on the focused element."""
    return bool(
        page.evaluate(
            """() => { const s = getComputedStyle(document.activeElement);
            return (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) > 0) || s.boxShadow !== 'none'; }"""
        )
    )


def test_the_skip_link_puts_the_focus_on_the_main_content(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    page.goto(f"{production.url}/accounts/login/")
    page.keyboard.type("alice")  # the username field has the focus already
    page.keyboard.press("Tab")
    page.keyboard.type("runledger-demo")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{SUPPORT}/")

    page.keyboard.press("Tab")
    assert focused(page, "class") == "skip" and focus_is_visible(page)
    page.keyboard.press("Enter")
    assert focused(page) == "main"  # the focus itself, not only the scroll position
    page.keyboard.press("Tab")
    assert page.evaluate("document.getElementById('main').contains(document.activeElement)")
    assert focused(page) == "id_q"  # the first filter, past every link of the navigation


def test_a_live_refresh_of_the_runs_list_keeps_the_focus_on_its_link(
    keyboard: Any, production: Daphne, harness: Appender
) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "dave")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    link = page.locator('#runs-rows tr.run[data-run-id="run_demo_triage"] .run-id a')
    link.focus()
    href = link.get_attribute("href")

    harness.append("run_arrives", data.started(label="arrives while the focus is in the list"))
    expect(page.locator('#runs-rows tr.run[data-run-id="run_arrives"]')).to_be_visible()
    assert focused(page, "href") == href  # the same run's link, in the rows swapped in
    assert focus_is_visible(page)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{href}")


def test_a_live_refresh_of_the_approvals_keeps_the_focus_on_approve(
    keyboard: Any, production: Daphne, harness: Appender
) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "bob")
    page.goto(f"{production.url}{SUPPORT}/approvals/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    approve = page.locator(".tool-call-approval button.approve")
    approve.focus()
    before = page.evaluate("window.runledgerLive.refreshes")

    harness.append("run_elsewhere", data.started(label="moves the workspace's feed"))
    live_reaches(page, "refreshes", before + 1)
    assert page.evaluate("document.activeElement.matches('.tool-call-approval button.approve')")


def test_a_run_status_changing_live_is_announced_alone(keyboard: Any, production: Daphne, harness: Appender) -> None:
    harness.append("run_spoken", data.started(label="spoken"), *data.step("extract"))
    page = keyboard()
    log_in_to_demo(page, production, "carol")
    page.goto(f"{production.url}{SUPPORT}/runs/run_spoken/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    region = page.locator("#live-announce")
    expect(region).to_have_attribute("aria-live", "polite")
    expect(region).to_have_text("")
    page.locator("#cancel-run summary").focus()  # the header is swapped around it

    harness.append("run_spoken", data.ev("StepCompleted", stepPath="extract", attempt=1, output={"n": 1}))
    expect(page.locator("#run-header .facts")).to_contain_text("4")
    live_reaches(page, "refreshes", 1)
    expect(region).to_have_text("")  # the run moved, its status did not: nothing to say
    assert page.evaluate("document.activeElement.matches('#cancel-run summary')")

    harness.append("run_spoken", data.ev("RunCompleted", output={"ok": True}))
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(region).to_have_text("Run status: completed")  # the change, not the whole header again


def test_a_tab_keeps_the_focus_and_is_marked_current(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/")
    expect(page.locator("#run-tabs a[aria-current=page]")).to_have_text("Timeline")
    page.locator("#run-tabs a").first.focus()
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/conversation/")
    expect(page.locator("#tab-conversation")).to_have_attribute("aria-current", "page")
    expect(page.locator("#tab-conversation")).to_be_focused()
    assert focus_is_visible(page)
    page.keyboard.press("Tab")
    expect(page.locator("#tab-waterfall")).to_be_focused()  # on along the tabs, not from the top


def test_escape_folds_a_waterfall_panel_back_to_its_bar(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/waterfall/")
    bar = page.locator('.wf-row[data-kind="model"] button.wf-bar').first
    panel = page.locator(f"#{bar.get_attribute('aria-controls')}")
    bar.focus()
    page.keyboard.press("Enter")
    expect(bar).to_have_attribute("aria-expanded", "true")
    expect(panel).to_contain_text("tokens")
    page.keyboard.press("Escape")
    expect(bar).to_have_attribute("aria-expanded", "false")
    expect(panel).to_be_hidden()
    expect(bar).to_be_focused()

    page.keyboard.press("Space")
    expect(bar).to_have_attribute("aria-expanded", "true")
    # From inside the panel too (a focusable put there, as a long value's controls would be).
    panel.evaluate("p => { const b = document.createElement('button'); b.id = 'inside'; p.appendChild(b); }")
    page.locator("#inside").focus()
    page.keyboard.press("Escape")
    expect(bar).to_have_attribute("aria-expanded", "false")
    expect(bar).to_be_focused()
