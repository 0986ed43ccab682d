"""Issue 33 in headless Chromium, with DEBUG off under the Content-Security-Policy (production
static files): a waterfall bar is a button that opens its call's detail panel in place, by mouse
and by keyboard, and folds it again; no navigation, no CSP violation, no console error."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.browser.axe import blocking_violations
from tests.browser.conftest import log_in_to_demo
from tests.browser.test_production_console import _assert_clean, watched
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["watched"]  # the fixture, shared with the production console's test

WATERFALL = "/w/acme/support/runs/run_demo_crashed_resumed/waterfall/"


def test_a_waterfall_bar_opens_its_calls_detail_in_place(
    watched: tuple[Page, list[str]], production: Daphne, demo: Any
) -> None:
    page, problems = watched
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{WATERFALL}")
    page.evaluate("window.__notReloaded = true")
    tool = page.locator('.wf-row[data-kind="tool"]').first
    expect(tool.locator(".wf-usage")).to_have_count(0)  # a tool call has no tokens or cost
    bar = tool.locator("button.wf-bar")
    expect(bar).to_have_attribute("aria-expanded", "false")
    panel = page.locator(f"#{bar.get_attribute('aria-controls')}")
    expect(panel).to_be_hidden()

    bar.click()
    expect(bar).to_have_attribute("aria-expanded", "true")
    expect(panel.locator(".wf-panel")).to_be_visible()
    expect(panel).to_contain_text("lookup_order")
    expect(panel).to_contain_text('"orderId": "B-2"')  # its arguments
    expect(panel).to_contain_text('"status": "delayed"')  # its result
    bar.click()
    expect(bar).to_have_attribute("aria-expanded", "false")
    expect(panel).to_be_hidden()

    # A model call's bar, from the keyboard: its tokens and cost on the row and in the panel.
    model = page.locator('.wf-row[data-kind="model"]').first
    expect(model.locator(".wf-usage")).to_contain_text(" in / ")
    model_bar = model.locator("button.wf-bar")
    model_bar.focus()
    page.keyboard.press("Enter")
    expect(model_bar).to_have_attribute("aria-expanded", "true")
    model_panel = page.locator(f"#{model_bar.get_attribute('aria-controls')}")
    expect(model_panel).to_contain_text("tokens")
    expect(model_panel).to_contain_text("request")
    assert blocking_violations(page) == []  # axe, with a panel open

    assert page.url == f"{production.url}{WATERFALL}" and page.evaluate("window.__notReloaded") is True
    _assert_clean(page, problems)
