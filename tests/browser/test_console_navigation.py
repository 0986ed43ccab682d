"""Getting around the console in a real browser: from the usage chart to the runs behind a bar,
and what each role is offered on the evidence tab."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import Workspace
from tests.browser import data
from tests.browser.conftest import Daphne, live_reaches, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_bar_of_the_usage_chart_drills_down_to_its_runs_and_on_to_a_run(
    page: Page,
    server: Daphne,
    workspace: Workspace,
    viewer: User,
) -> None:
    data.priced_run(workspace, "run_mini", "openai", "gpt-4o-mini")
    data.priced_run(workspace, "run_sonnet", "anthropic", "claude-sonnet-4-6")
    data.running_run(workspace, "run_no_model")
    today = datetime.now(UTC).date().isoformat()
    log_in(page, server, viewer)

    page.goto(f"{server.url}/w/acme/support/usage/?from={today}&to={today}")
    expect(page.locator("table#usage-table")).to_contain_text("gpt-4o-mini")
    expect(page.locator("a#usage-csv")).to_be_visible()
    bar = page.locator('svg.usage-chart a.bar[href*="gpt-4o-mini"]')
    expect(bar).to_have_count(1)
    bar.click()

    page.wait_for_url(re.compile(r"/w/acme/support/\?"))
    query = page.evaluate("Object.fromEntries(new URLSearchParams(location.search))")
    assert query["model"] == "openai/gpt-4o-mini"
    assert query["from"] == today and query["to"] == today
    rows = page.locator("#runs-rows tr.run")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-run-id", "run_mini")
    # The filter lives in the URL: its form shows it too.
    expect(page.locator("form#run-filters [name=model]")).to_have_value("openai/gpt-4o-mini")

    # The list is live: click once it has fetched itself again on its socket's opening.
    live_reaches(page, "refreshes", 1)
    rows.first.locator('a[href*="/runs/run_mini/"]').first.click()
    page.wait_for_url(re.compile(r"/w/acme/support/runs/run_mini/"))
    expect(page.locator('#timeline-rows tr.event[data-sequence="1"]')).to_be_visible()
    expect(page.locator("#live-status")).to_have_attribute("data-state", "finished")


@pytest.mark.parametrize("role, sees_form", [("viewer", False), ("operator", True)])
def test_only_an_operator_is_offered_the_reconcile_form(
    page: Page,
    server: Daphne,
    workspace: Workspace,
    role: str,
    sees_form: bool,
    request: pytest.FixtureRequest,
) -> None:
    data.running_run(workspace, "run_doubt")
    data.in_doubt_call(workspace, "run_doubt")
    log_in(page, server, request.getfixturevalue(role))  # the named user of that role

    page.goto(f"{server.url}/w/acme/support/runs/run_doubt/evidence/")
    # Both see the call in doubt; only one may settle it.
    expect(page.get_by_text("call_refund").first).to_be_visible()
    expect(page.get_by_text(re.compile(r"in[ _-]doubt", re.IGNORECASE)).first).to_be_visible()
    expect(page.locator("form.reconcile-form")).to_have_count(1 if sees_form else 0)
    expect(page.locator("form#feedback-form")).to_be_visible()


def test_the_usage_chart_keeps_readable_text_at_390_px_and_scrolls_in_its_figure(
    page: Page, server: Daphne, workspace: Workspace, viewer: User
) -> None:
    """Scaled to the width of a phone, the chart's axis and legend text came out at 4 px; it keeps
    its drawn size there and scrolls sideways inside its own figure, which a keyboard can reach."""
    data.priced_run(workspace, "run_mini", "openai", "gpt-4o-mini")
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, server, viewer)
    page.goto(f"{server.url}/w/acme/support/usage/")
    chart = page.locator("svg.usage-chart")
    expect(chart.locator(".legend-model")).to_contain_text("gpt-4o-mini")
    drawn = chart.evaluate("svg => svg.viewBox.baseVal.width")
    box = chart.bounding_box()
    assert box is not None and box["width"] == drawn, (box, drawn)  # one drawn unit, one CSS pixel
    figure = page.locator("figure.usage-figure")
    assert figure.evaluate("f => f.scrollWidth > f.clientWidth && getComputedStyle(f).overflowX === 'auto'")
    assert figure.get_attribute("tabindex") == "0"
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # the page does not scroll sideways


def test_a_links_underline_sits_below_the_underscores_of_an_id(
    page: Page, server: Daphne, workspace: Workspace, viewer: User
) -> None:
    """At its default offset the underline ran through an id's underscores: the Approvals card's
    link to run_demo_triage read "run demo triage"."""
    data.running_run(workspace, "run_doubt")
    log_in(page, server, viewer)
    page.goto(f"{server.url}/w/acme/support/runs/run_doubt/")
    link = page.locator("main a", has_text="acme/support").first
    expect(link).to_be_visible()
    offset, size = link.evaluate(
        "a => [getComputedStyle(a).textUnderlineOffset, parseFloat(getComputedStyle(a).fontSize)]"
    )
    assert offset.endswith("px") and float(offset[:-2]) >= 0.2 * size, (offset, size)


def test_the_reconcile_form_is_in_view_at_390_px_without_scrolling_the_table(
    page: Page, server: Daphne, workspace: Workspace, operator: User
) -> None:
    """It sat in the last column of the calls table, which scrolls in its own box at 390 px: an
    operator saw a tall empty row and had to scroll the table right to find it."""
    data.running_run(workspace, "run_doubt")
    data.in_doubt_call(workspace, "run_doubt")
    page.set_viewport_size({"width": 390, "height": 844})
    log_in(page, server, operator)
    page.goto(f"{server.url}/w/acme/support/runs/run_doubt/evidence/")
    form = page.locator("form.reconcile-form")
    expect(form).to_have_count(1)
    # Down the page to it, as a person scrolls: the table's own box is not scrolled sideways.
    form.evaluate("f => window.scrollTo(0, f.getBoundingClientRect().top + window.scrollY - 100)")
    assert form.evaluate("f => f.closest('.table-wrap') ? f.closest('.table-wrap').scrollLeft : 0") == 0
    box = form.bounding_box()
    assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 390, box
    expect(form.locator("button[type=submit]")).to_be_in_viewport()
    assert page.evaluate("document.documentElement.scrollWidth") <= 390  # nor does the page scroll sideways
