"""`make run`'s console with DEBUG off, under the Content-Security-Policy, in headless Chromium:
a Daphne started with DEBUG=0 (console/settings.py itself, not the test settings), the demo's
runs, and a page that records every CSP violation (the `securitypolicyviolation` event) and every
console error. Login, the runs list, a run page's htmx tabs, the waterfall (placed by script, not
inline styles), a live update over the WebSocket, the usage chart and Swagger UI must all work
with none recorded."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.browser import data
from tests.browser.conftest import Appender, log_in_to_demo
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

SUPPORT = "/w/acme/support"
RESEARCH = "/w/acme/research/runs"
RECORD_VIOLATIONS = """
window.__cspViolations = [];
document.addEventListener("securitypolicyviolation", function (e) {
  window.__cspViolations.push(e.violatedDirective + " blocked " + (e.blockedURI || "inline") + " at " + e.sourceFile + ":" + e.lineNumber);
});
"""


@pytest.fixture
def watched(open_context: Any) -> Iterator[tuple[Page, list[str]]]:
    """A page, and the CSP violations and console errors seen on it (checked after the test's steps)."""
    page = open_context().new_page()
    page.add_init_script(RECORD_VIOLATIONS)
    problems: list[str] = []
    page.on(
        "console",
        lambda message: problems.append(f"console {message.type}: {message.text}") if message.type == "error" else None,
    )
    page.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    page.on(
        "response",
        lambda response: problems.append(f"{response.status} {response.url}") if response.status >= 400 else None,
    )
    yield page, problems


def _violations(page: Page) -> list[str]:
    return page.evaluate("window.__cspViolations || []")


def _assert_clean(page: Page, problems: list[str]) -> None:
    assert _violations(page) == [] and problems == [], (_violations(page), problems)


def test_the_console_works_with_debug_off_under_the_csp(
    watched: tuple[Page, list[str]],
    production: Daphne,
    demo: None,
) -> None:
    page, problems = watched
    login = page.goto(f"{production.url}/accounts/login/")
    assert login is not None
    policy = login.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy and "unsafe-inline" not in policy
    expect(page.locator("link[rel=stylesheet]").first).to_have_attribute(
        "href", re.compile(r"^/static/css/console\.[0-9a-f]{12}\.css$")
    )  # collected: hashed names
    assert page.evaluate("htmx.config.includeIndicatorStyles") is False
    assert page.evaluate("getComputedStyle(document.body).margin") != "8px"  # console.css applied
    log_in_to_demo(page, production)

    # The runs list.
    page.goto(f"{production.url}{SUPPORT}/")
    expect(page.locator('#runs-rows tr.run[data-run-id="run_demo_triage"]')).to_be_visible()

    # A run page and its tabs, each fetched by htmx into the panel (no reload).
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/")
    expect(page.locator('#timeline-rows tr.event[data-sequence="1"]')).to_be_visible()
    page.evaluate("window.__notReloaded = true")
    for tab in ("conversation", "waterfall", "evidence", "timeline"):
        page.locator(f'#run-tabs a[data-tab="{tab}"]').click()
        expect(page.locator(f'#run-tabs a[data-tab="{tab}"]')).to_have_attribute("aria-current", "page")
        expect(page).to_have_url(re.compile(rf"/runs/run_demo_crashed_resumed/{tab}/$"))
    assert page.evaluate("window.__notReloaded") is True

    # The waterfall's bars are placed from their data-* attributes (no inline style allowed).
    page.goto(f"{production.url}{RESEARCH}/run_demo_orchestrator/waterfall/")
    bars = page.locator('.wf-row[data-kind="subrun"] .wf-bar')
    expect(bars).to_have_count(5)
    widths = bars.evaluate_all("bars => bars.map(b => b.getBoundingClientRect().width)")
    lefts = bars.evaluate_all("bars => bars.map(b => b.style.left)")
    assert all(w >= 3 for w in widths) and len(set(lefts)) > 1 and all(v.endswith("%") for v in lefts), (widths, lefts)
    expand = page.locator('.wf-row[data-kind="subrun"] .wf-expand').first
    expand.click()
    expect(expand).to_have_attribute("aria-expanded", "true")
    nested = page.locator(".wf-children .wf-row").first
    expect(nested).to_be_visible()
    depth = nested.get_attribute("data-depth")
    assert depth and int(depth) > 0
    assert nested.evaluate("row => row.style.getPropertyValue('--depth')") == depth

    # A live update over the WebSocket (connect-src 'self' covers ws: of the same host).
    workspace = Workspace.objects.get(tenant__slug="acme", slug="support")
    appender = Appender(production)
    try:
        _, appender.key = create_key(workspace=workspace, scopes=["ingest"])
        appender.append("run_prod_live", data.started(label="live under the CSP"), *data.step("extract"))
        page.goto(f"{production.url}{SUPPORT}/runs/run_prod_live/")
        expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
        expect(page.locator("#timeline-rows tr.event")).to_have_count(3)
        appender.append("run_prod_live", data.ev("StepCompleted", stepPath="extract", attempt=1, output={"n": 1}))
        expect(page.locator('#timeline-rows tr.event[data-sequence="4"]')).to_be_visible()
    finally:
        appender.close()

    # The usage chart.
    page.goto(f"{production.url}{SUPPORT}/usage/")
    expect(page.locator("svg.usage-chart a.bar").first).to_be_visible()

    _assert_clean(page, problems)


def test_swagger_ui_comes_from_our_own_static_files_and_works_under_the_csp(
    watched: tuple[Page, list[str]],
    production: Daphne,
) -> None:
    page, problems = watched
    outside: list[str] = []
    page.on(
        "request",
        lambda request: (
            outside.append(request.url)
            if not request.url.startswith(production.url) and not request.url.startswith("data:")
            else None
        ),
    )
    page.goto(f"{production.url}/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Runledger API")
    expect(page.locator(".opblock").first).to_be_visible()
    assert page.locator(".opblock").count() > 10
    assert outside == []
    _assert_clean(page, problems)


def test_a_forbidden_inline_script_is_reported(watched: tuple[Page, list[str]], production: Daphne) -> None:
    """The recorder sees what the policy blocks, so an empty list above means something."""
    page, problems = watched
    page.goto(f"{production.url}/accounts/login/")
    page.evaluate("""() => { const s = document.createElement("script"); s.textContent = "window.__ran = 1";
                             document.body.appendChild(s); }""")
    expect(page.locator("body")).to_be_visible()
    page.wait_for_function("window.__cspViolations.length > 0")
    assert page.evaluate("window.__ran") is None
    assert any("script-src" in v for v in _violations(page))
