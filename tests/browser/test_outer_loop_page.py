"""The outer-loop page in Chromium: from a cycle's run page to its loop, the loop's cycles with
their verdicts and summed cost, and on to another cycle's run (the demo's three-cycle loop)."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import Page, expect

from tests.browser.conftest import Daphne, log_in_to_demo

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_cycle_run_links_to_its_loop_which_lists_the_cycles_and_links_back(
    page: Page, server: Daphne, demo: None
) -> None:
    log_in_to_demo(page, server, "dave")  # a viewer reads loops like runs
    page.goto(f"{server.url}/w/acme/research/runs/run_ol_demo_refine_c2/")
    expect(page.locator("#run-outer-loop")).to_contain_text("cycle 2")

    page.click("#outer-loop-link")

    page.wait_for_url(re.compile(r"/w/acme/research/loops/ol_demo_refine/$"))
    expect(page.locator("#loop-status")).to_have_text("done")
    rows = page.locator("#cycles tbody tr.cycle")
    expect(rows).to_have_count(3)
    expect(rows.nth(0).locator(".verdict")).to_have_text("continue: cite two of the sources by name")
    expect(rows.nth(0).locator(".verdict q.note")).to_have_text("cite two of the sources by name")
    expect(rows.nth(2).locator(".verdict")).to_have_text("done")
    expect(page.locator("#loop-cycles")).to_have_text("3 of at most 5")
    expect(page.locator("#loop-cost")).to_contain_text("$")
    expect(page.locator("#loop-cost")).to_contain_text("3/3 priced")

    rows.nth(2).locator("a.cycle-run").click()

    page.wait_for_url(re.compile(r"/runs/run_ol_demo_refine_c3/$"))
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("#outer-loop-link")).to_have_text("ol_demo_refine")
