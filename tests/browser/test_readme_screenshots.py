"""The README's pictures of the console, taken from the demo `make run` loads as a new user meets
it: the runs list, a run's conversation and waterfall, the re-execution form with its plan, and a
divergence report. `make screenshots` writes them to docs/img/ (RUNLEDGER_DOCS_IMG); any other run
of this test writes them under var/screenshots/readme/, so the tracked pictures change only when
asked. Each is checked for what it must show before it is taken, and kept small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect

from ledger.demo import load_demo
from ledger.demo import reexecution as demo_reexecution
from ledger.models import ReexecutionRequest
from tests.browser.conftest import Daphne, log_in_to_demo, screenshot_dir

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

SUPPORT, RESEARCH = "/w/acme/support", "/w/acme/research"
# The README shows them at this size: wide enough for the tables, small enough to stay light.
VIEWPORT = {"width": 1200, "height": 720}
MAX_BYTES = 250_000
NAMES = ("runs", "run-conversation", "run-waterfall", "reexecute-form", "divergence")


def folder() -> Path:
    target = os.environ.get("RUNLEDGER_DOCS_IMG")
    path = Path(target) if target else screenshot_dir() / "readme"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _shoot(page: Page, name: str, *, full_page: bool = False) -> None:
    page.mouse.move(0, 0)  # no hover state in the picture
    page.screenshot(path=str(folder() / f"{name}.png"), animations="disabled", caret="hide", full_page=full_page)


def test_the_readme_pictures_show_the_demo(open_context: object, server: Daphne) -> None:
    load_demo(history_runs=12)
    for name in NAMES:
        (folder() / f"{name}.png").unlink(missing_ok=True)
    page = open_context(color_scheme="light").new_page()  # type: ignore[operator]
    page.set_viewport_size(VIEWPORT)
    log_in_to_demo(page, server)

    page.goto(f"{server.url}{SUPPORT}/")
    expect(page.locator('#runs-rows tr.run[data-run-id="run_demo_in_doubt"]')).to_be_visible()
    _shoot(page, "runs")

    page.goto(f"{server.url}{SUPPORT}/runs/run_demo_crashed_resumed/conversation/")
    expect(page.locator("li.turn").first).to_be_visible()
    _shoot(page, "run-conversation")

    page.goto(f"{server.url}{RESEARCH}/runs/run_demo_orchestrator/waterfall/")
    page.locator(".wf-label .wf-expand").first.click()
    expect(page.locator(".wf-children .wf-row").first).to_be_visible()
    _shoot(page, "run-waterfall")

    page.goto(f"{server.url}{SUPPORT}/runs/run_demo_triage/reexecute/")
    page.wait_for_load_state()  # htmx binds the form's change trigger once the page has loaded
    page.check("input[name=mode][value=fork]")
    page.select_option("#from-step", "normalize")
    expect(page.locator('#plan tr[data-step="normalize"][data-action="live"]')).to_be_visible()
    page.fill("textarea[name=input]", '{"ticket": "Where is my parcel?", "orderId": "D-4"}')
    page.fill("textarea[name=reason]", "What would we have told the customer about order D-4?")
    page.locator("textarea[name=reason]").blur()
    _shoot(page, "reexecute-form", full_page=True)  # the choice and, below it, the plan it makes

    changed = ReexecutionRequest.objects.get(reason=demo_reexecution.CHANGED)
    page.goto(f"{server.url}{SUPPORT}/reexecutions/{changed.public_id}/divergence/")
    expect(page.locator("#first-divergence")).to_have_attribute("data-step", "normalize")
    _shoot(page, "divergence")

    sizes = {name: (folder() / f"{name}.png").stat().st_size for name in NAMES}
    assert all(10_000 < size <= MAX_BYTES for size in sizes.values()), sizes
