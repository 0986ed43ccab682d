"""Every console page rendered in headless Chromium, light and dark, with a screenshot of each left
in var/screenshots/ for a person to look at (README, "Browser tests and screenshots"); overwritten
on every run. The runs list, the run header, the timeline and the waterfall are also taken 390 px
wide (a phone), light and dark, where the page must not scroll sideways."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Locator, Page, expect

from ledger import clock
from ledger.models import Workspace
from tests.browser import data
from tests.browser.conftest import Daphne, log_in, screenshot_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

RUN = "run_showcase"
SUB_RUNS = ("run_showcase_notify", "run_showcase_sms", "run_showcase_audit")
PAGES = (
    "login",
    "runs",
    "run-header",
    "run-timeline",
    "run-waterfall",
    "run-steps",
    "run-subruns",
    "run-evidence",
    "run-costs",
    "usage",
    "settings-members",
    "settings-members-refused",
    "settings-members-added",
    "settings-prices",
)
NARROW_PAGES = ("runs", "run-header", "run-timeline", "run-waterfall")  # also taken as NAME-390-SCHEME.png
SCHEMES = ("light", "dark")
NARROW = {"width": 390, "height": 844}


def _background_luminance(page: Page) -> float:
    rgb = page.evaluate("""() => getComputedStyle(document.body).backgroundColor
                               .match(/[0-9.]+/g).slice(0, 3).map(Number)""")
    return sum(weight * channel for weight, channel in zip((0.2126, 0.7152, 0.0722), rgb)) / 255


def _shoot(page: Page, name: str, backgrounds: dict[str, list[float]], element: str = "") -> None:
    """Both schemes of the page as it is, switched in place (no second login, no reload); with
    `element`, only that part of it (the run header). After a form's click the new page's
    elements can be visible before its stylesheets have loaded (a transparent body, read as
    black): the page is photographed loaded."""
    page.wait_for_load_state("load")
    for scheme in SCHEMES:
        page.emulate_media(color_scheme=scheme)  # type: ignore[arg-type]
        backgrounds[scheme].append(_background_luminance(page))
        path = str(screenshot_dir() / f"{name}-{scheme}.png")
        if element:
            page.locator(element).screenshot(path=path)
        else:
            page.screenshot(path=path, full_page=True)
    page.emulate_media(color_scheme="light")


def _sideways(page: Page) -> int:
    """How far the page scrolls sideways (0: it does not)."""
    return int(page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth"))


def _tab(page: Page, server: Daphne, tab: str) -> Locator:
    path = f"/w/acme/support/runs/{RUN}/{tab}/"
    response = page.goto(f"{server.url}{path}")
    assert response is not None and response.status == 200, path
    for name in ("timeline", "waterfall", "steps", "subruns", "evidence", "costs"):
        expect(page.locator(f'a[data-tab="{name}"]')).to_have_count(1)
    return page.locator("main")


WEEK = (
    ("openai", "gpt-4o-mini"),
    ("anthropic", "claude-sonnet-4-6"),
    ("google", "gemini-2.5-flash"),
    ("openai", "gpt-4o"),
    ("deepseek", "deepseek-v4-flash"),
    ("anthropic", "claude-sonnet-4-6"),
)


def _populate(workspace: Workspace) -> None:
    # A week of history behind the usage chart, written as the demo writes its past.
    for days_ago, (provider, model) in enumerate(WEEK, start=1):
        with clock.backdated(datetime.now(UTC) - timedelta(days=days_ago, hours=2)):
            data.priced_run(workspace, f"run_history_{days_ago}", provider, model)
    data.showcase(workspace)
    data.priced_run(workspace, "run_weekly_digest", "google", "gemini-2.5-flash")
    data.priced_run(workspace, "run_ticket_4471", "openai", "gpt-4o", finish=False)
    data.append(
        workspace,
        "run_broken_import",
        data.started("wfver_import", label="nightly import"),
        *data.step("fetch"),
        data.ev("StepFailed", stepPath="fetch", attempt=1, error={"message": "403"}),
        data.ev("RunFailed", error={"message": "fetch failed"}),
    )


def test_every_page_renders_light_and_dark_and_is_photographed(
    page: Page,
    server: Daphne,
    workspace: Workspace,
    admin: User,
) -> None:
    _populate(workspace)
    today = datetime.now(UTC).date()
    backgrounds: dict[str, list[float]] = {scheme: [] for scheme in SCHEMES}
    expected = [screenshot_dir() / f"{name}-{scheme}.png" for name in PAGES for scheme in SCHEMES]
    for path in expected:
        path.unlink(missing_ok=True)

    page.goto(f"{server.url}/accounts/login/")
    expect(page.locator("input[name=password]")).to_be_visible()
    _shoot(page, "login", backgrounds)
    log_in(page, server, admin)

    page.goto(f"{server.url}/w/acme/support/")
    expect(page.locator(f'#runs-rows tr.run[data-run-id="{RUN}"]')).to_be_visible()
    expect(page.locator('#runs-rows tr.run[data-run-id="run_broken_import"]')).to_be_visible()
    expect(page.locator("form#run-filters")).to_be_visible()
    _shoot(page, "runs", backgrounds)

    _tab(page, server, "timeline")
    expect(page.locator("#timeline-rows tr.event")).to_have_count(22)
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    expect(page.locator("#run-header #run-tokens")).to_be_visible()
    _shoot(page, "run-header", backgrounds, element="#run-header")
    _shoot(page, "run-timeline", backgrounds)

    _tab(page, server, "waterfall")
    expect(page.locator(".wf-row[data-kind=step]").first).to_be_visible()
    _shoot(page, "run-waterfall", backgrounds)

    main = _tab(page, server, "steps")
    for step in ("classify", "lookup", "decide", "refund"):
        expect(main).to_contain_text(step)
    _shoot(page, "run-steps", backgrounds)

    _tab(page, server, "subruns")
    for child in SUB_RUNS:
        expect(page.locator(f'a[href*="/runs/{child}/"]').first).to_be_visible()
    _shoot(page, "run-subruns", backgrounds)

    main = _tab(page, server, "evidence")
    expect(main).to_contain_text("call_refund")
    expect(page.locator("form.reconcile-form")).to_have_count(1)
    _shoot(page, "run-evidence", backgrounds)

    main = _tab(page, server, "costs")
    for model in ("gpt-4o-mini", "claude-sonnet-4-6", "house-model"):
        expect(main).to_contain_text(model)
    _shoot(page, "run-costs", backgrounds)

    page.goto(f"{server.url}/w/acme/support/usage/?from={today - timedelta(days=len(WEEK))}&to={today}")
    expect(page.locator("svg.usage-chart a.bar").first).to_be_visible()
    expect(page.locator('svg.usage-chart a.bar[href*="deepseek-v4-flash"]')).to_have_count(1)
    expect(page.locator("table#usage-table")).to_contain_text("gemini-2.5-flash")
    _shoot(page, "usage", backgrounds)

    page.goto(f"{server.url}/w/acme/support/settings/members/")
    expect(page.locator("main")).to_contain_text(admin.get_username())
    _shoot(page, "settings-members", backgrounds)

    # Adding a member: refused by the field (what was typed kept), then a new user's password, once.
    page.locator("#member-username").fill(admin.get_username())
    page.locator("#member-role").select_option("operator")
    page.locator("button#member-add").click()
    expect(page.locator("#member-username-error")).to_contain_text("exists already")
    _shoot(page, "settings-members-refused", backgrounds)
    page.locator("#member-username").fill("erin")
    page.locator("button#member-add").click()
    expect(page.locator("#new-member-password")).to_be_visible()
    _shoot(page, "settings-members-added", backgrounds)

    page.goto(f"{server.url}/w/acme/support/settings/prices/")
    expect(page.locator("main")).to_contain_text("gpt-4o-mini")
    _shoot(page, "settings-prices", backgrounds)

    # Dark is dark and light is light on every page, not only where a stylesheet remembered it.
    assert max(backgrounds["dark"]) < 0.3 and min(backgrounds["light"]) > 0.7, backgrounds
    assert [path.name for path in expected if not path.exists()] == []


def test_the_main_views_at_390_px_light_and_dark_do_not_scroll_sideways(
    open_context: Any, server: Daphne, workspace: Workspace, admin: User
) -> None:
    data.showcase(workspace)
    page = open_context(viewport=NARROW).new_page()
    expected = [screenshot_dir() / f"{name}-390-{scheme}.png" for name in NARROW_PAGES for scheme in SCHEMES]
    for path in expected:
        path.unlink(missing_ok=True)
    log_in(page, server, admin)
    backgrounds: dict[str, list[float]] = {scheme: [] for scheme in SCHEMES}
    wide: dict[str, int] = {}

    page.goto(f"{server.url}/w/acme/support/")
    expect(page.locator(f'#runs-rows tr.run[data-run-id="{RUN}"]')).to_be_visible()
    wide["runs"] = _sideways(page)
    _shoot(page, "runs-390", backgrounds)

    _tab(page, server, "timeline")
    expect(page.locator("#timeline-rows tr.event")).to_have_count(22)
    wide["run-timeline"] = _sideways(page)
    _shoot(page, "run-header-390", backgrounds, element="#run-header")
    _shoot(page, "run-timeline-390", backgrounds)

    _tab(page, server, "waterfall")
    expect(page.locator(".wf-row[data-kind=step]").first).to_be_visible()
    wide["run-waterfall"] = _sideways(page)
    _shoot(page, "run-waterfall-390", backgrounds)

    assert {name: px for name, px in wide.items() if px > 0} == {}
    assert max(backgrounds["dark"]) < 0.3 and min(backgrounds["light"]) > 0.7, backgrounds
    assert [path.name for path in expected if not path.exists()] == []
