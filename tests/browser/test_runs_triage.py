"""The runs list to triage from and the error pages, in headless Chromium against a Daphne with
DEBUG off and the collected static files (as production): sorted by cost, the most expensive tree
comes first with its sub-runs nested under it; an error page keeps the console's layout and leads
back; at 390 px wide no page scrolls sideways, and at laptop widths a wide table scrolls in its
own box, not the page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from ledger.models import Run, Workspace
from ledger.reads import runlist
from tests.browser.conftest import log_in_to_demo, screenshot_dir
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

RESEARCH = "/w/acme/research/"
NARROW = {"width": 390, "height": 844}


def _dearest_tree(workspace: Workspace) -> tuple[str, int]:
    """The run without a parent whose tree costs most, by the database's own sums, and its size."""
    roots = runlist.with_tree_totals(Run.objects.filter(workspace=workspace, parent_run_id=""))
    dearest = max((r for r in roots if r.tree_cost is not None), key=lambda r: (r.tree_cost, r.pk))
    assert dearest.below > 0, "the demo's dearest tree has sub-runs"
    return dearest.run_id, dearest.below


def test_sorted_by_cost_the_dearest_tree_comes_first_with_its_sub_runs_nested(
    open_context: Any, production: Daphne, demo: None
) -> None:
    workspace = Workspace.objects.get(tenant__slug="acme", slug="research")
    dearest, below = _dearest_tree(workspace)
    page = open_context().new_page()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{RESEARCH}")
    page.locator("#sort-cost").click()  # the header: a link, the sort kept in the URL
    expect(page).to_have_url(re.compile(r"/w/acme/research/\?sort=cost$"))
    expect(page.locator("th:has(#sort-cost)")).to_have_attribute("aria-sort", "descending")
    rows = page.locator("#runs-rows tr.run")
    expect(rows.first).to_have_attribute("data-run-id", dearest)
    expect(rows.first).to_have_attribute("data-tree", str(below))
    expect(rows.first.locator("td.cost")).to_contain_text("tree")
    nested = min(below, 10)
    for i in range(1, nested + 1):
        expect(rows.nth(i)).not_to_have_attribute("data-depth", "0")
    expect(rows.nth(nested + 1)).to_have_attribute("data-depth", "0")
    # The first nested row is a direct sub-run of the dearest tree.
    expect(rows.nth(1)).to_have_attribute("data-parent", dearest)
    # Bookmarked, the same view comes back.
    page.goto(f"{production.url}{RESEARCH}?sort=cost")
    expect(page.locator("#runs-rows tr.run").first).to_have_attribute("data-run-id", dearest)
    page.screenshot(path=str(screenshot_dir() / "runs-by-cost-light.png"), full_page=True)


def test_an_error_page_keeps_the_layout_and_leads_back(open_context: Any, production: Daphne, demo: None) -> None:
    page = open_context().new_page()
    log_in_to_demo(page, production, username="dave")  # a viewer
    response = page.goto(f"{production.url}/t/acme/audit/")
    assert response is not None and response.status == 403
    expect(page.locator("header.top")).to_be_visible()
    expect(page.locator("#error-title")).to_have_text("Not allowed")
    expect(page.locator("link[rel=stylesheet]").first).to_have_attribute(
        "href", re.compile(r"^/static/css/console\.[0-9a-f]{12}\.css$")
    )
    assert page.evaluate("getComputedStyle(document.body).margin") != "8px"  # console.css applied
    page.locator("#error-back").click()
    expect(page).to_have_url(re.compile(r"/w/acme/[a-z]+/$"))  # a workspace of the tenant
    response = page.goto(f"{production.url}/no/such/page/")
    assert response is not None and response.status == 404
    expect(page.locator("nav.switcher")).to_be_visible()
    expect(page.locator("#error-title")).to_have_text("Not found")


NARROW_PAGES = (
    "/w/acme/support/",
    "/w/acme/research/?sort=cost",
    "/w/acme/research/loops/",
    "/w/acme/support/settings/",
    "/t/acme/audit/",
    "/w/acme/support/settings/redaction/",
    "/w/acme/support/settings/members/",
    "/w/acme/support/settings/prices/",
    "/no/such/page/",
    "/w/acme/support/runs/run_demo_crashed_resumed/",
    "/w/acme/support/runs/run_demo_in_doubt/steps/",
    "/w/acme/support/runs/run_demo_in_doubt/evidence/",
    "/w/acme/support/runs/run_demo_in_doubt/state/",
    "/w/acme/research/runs/run_demo_orchestrator/waterfall/",
    "/w/acme/research/runs/run_demo_orchestrator/conversation/",
    "/w/acme/research/runs/run_demo_orchestrator/subruns/",
    "/w/acme/research/runs/run_demo_orchestrator/costs/",
    "/w/acme/research/runs/run_ol_demo_refine/",  # an outer loop's record: its workflow id is long
    "/w/acme/support/approvals/",
    "/w/acme/support/usage/",
)


def test_wide_tables_scroll_in_their_own_box_at_laptop_widths(
    open_context: Any, production: Daphne, demo: None
) -> None:
    """At 1024-1440 px the runs list, the Steps tab and Approvals made the whole page, header and
    all, scroll sideways; a table wider than the window scrolls inside its own box instead. The
    stylesheets' one breakpoint is 640 px: above it the layout is fluid, so the narrowest laptop
    width checked holds for the wider ones (each more width a page pass of its own in CI)."""
    context = open_context()
    page = context.new_page()
    log_in_to_demo(page, production)
    wide = {}
    for width in (1024,):
        page.set_viewport_size({"width": width, "height": 860})
        for path in (*NARROW_PAGES, "/w/acme/research/runs/run_demo_export/steps/"):
            response = page.goto(f"{production.url}{path}")
            assert response is not None and response.status == (404 if "/no/" in path else 200), path
            overflow = page.evaluate(
                "() => document.scrollingElement.scrollWidth - document.scrollingElement.clientWidth"
            )
            if path == "/w/acme/research/?sort=cost":
                page.screenshot(path=str(screenshot_dir() / f"runs-{width}.png"))
            if overflow > 0:
                wide[f"{width} {path}"] = overflow
    assert not wide, f"the page scrolls sideways by (px): {wide}"


# The tables that scroll in their own box (not the lists of cards) by class, and the words of
# theirs that a line break cuts in two: each run of letters whose text spans two lines.
BROKEN_WORDS = """() => {
  const tables = [], broken = [];
  for (const table of document.querySelectorAll("table.grid:not(.runs):not(.keys):not(.members):not(.audit):not(.events)")) {
    tables.push(table.className);
    const walker = document.createTreeWalker(table, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const word of node.data.matchAll(/[A-Za-z]{2,}/g)) {
        const range = document.createRange();
        range.setStart(node, word.index);
        range.setEnd(node, word.index + word[0].length);
        const lines = new Set([...range.getClientRects()].map(rect => Math.round(rect.top)));
        if (lines.size > 1) broken.push(`${word[0]} (${table.className})`);
      }
    }
  }
  return {tables, broken};
}"""


# The shown selects whose chosen option is cut: its text wider than the box leaves it (the box's
# width less its padding and the arrow's ~20 px).
CUT_SELECTS = """() => {
  const ctx = document.createElement("canvas").getContext("2d");
  return [...document.querySelectorAll("select")].filter(s => s.offsetParent !== null && s.selectedIndex >= 0)
    .filter(s => {
      const cs = getComputedStyle(s);
      ctx.font = `${cs.fontStyle} ${cs.fontWeight} ${cs.fontSize} ${cs.fontFamily}`;
      const room = s.clientWidth - parseFloat(cs.paddingLeft) - parseFloat(cs.paddingRight) - 20;
      return ctx.measureText(s.options[s.selectedIndex].text).width > room;
    }).map(s => `${s.name}: ${s.options[s.selectedIndex].text}`);
}"""


def test_no_sideways_scroll_at_390_px(open_context: Any, production: Daphne, demo: None) -> None:
    """Nor does a table that scrolls in its own box break a word in the middle: a fixed layout
    squeezed Approvals' Decided table and the usage tables until "evaluate" read "evalu/ate". Nor
    is a select's chosen option cut ("highest / newest firs" on the runs list's filters)."""
    context = open_context(viewport=NARROW)
    page = context.new_page()
    log_in_to_demo(page, production)
    wide, broken, checked = {}, {}, set()
    for path in NARROW_PAGES:
        response = page.goto(f"{production.url}{path}")
        assert response is not None and response.status in (200, 404), path
        overflow = page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth")
        if overflow > 0:
            wide[path] = overflow
        words = page.evaluate(BROKEN_WORDS)
        checked.update(words["tables"])
        if words["broken"]:
            broken[path] = words["broken"]
        if cut := page.evaluate(CUT_SELECTS):
            broken[path] = [*broken.get(path, []), *cut]
        if path == "/w/acme/support/":
            page.screenshot(path=str(screenshot_dir() / "runs-390.png"), full_page=True)
    assert wide == {}, wide
    assert {"grid decided", "grid usage-rows"} <= checked, checked
    assert broken == {}, f"words broken in the middle, or options cut, at 390 px: {broken}"
