"""axe-core on every page of the console, light and dark: no serious or critical violation (issue
13). The pages show `ledger demo`'s runs, so each view has something in it: a conversation, a
waterfall with a sub-run expanded, an in-doubt call with its reconcile form, a pending approval,
the evaluations, their dataset and batch, a re-execution's request form and divergence report, a
shared run and a revoked link's 410, Members' add form refused and with a new user's password
shown once, and the 400, 403, 404 and 500 pages.
The new views are photographed into var/screenshots/ on the way. And the keyboard: every action
on the run page is reached with Tab and shows where the focus is."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse
from playwright.sync_api import Page, expect

from console.pages import errors
from ledger.models import Evaluation, ReexecutionRequest, Run, Workspace
from ledger.tenancy import price_settings, sharing
from tests.browser.axe import blocking_violations
from tests.browser.conftest import Daphne, log_in_to_demo, screenshot_dir
from tests.browser.test_evidence_views import RESEARCH, SUPPORT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

SCHEMES = ("light", "dark")
PAGES = {
    "runs": "/w/acme/support/",
    "run-timeline": f"{SUPPORT}/run_demo_crashed_resumed/",
    "run-search": f"{SUPPORT}/run_demo_crashed_resumed/?tool=lookup_order",
    "run-conversation": f"{SUPPORT}/run_demo_crashed_resumed/conversation/",
    "run-waterfall": f"{RESEARCH}/run_demo_orchestrator/waterfall/",
    "run-state": f"{SUPPORT}/run_demo_in_doubt/state/?at=18",
    "run-steps": f"{SUPPORT}/run_demo_in_doubt/steps/",
    "run-subruns": f"{RESEARCH}/run_demo_orchestrator/subruns/",
    "run-evidence": f"{SUPPORT}/run_demo_in_doubt/evidence/",
    "run-costs": f"{RESEARCH}/run_demo_orchestrator/costs/",
    "outer-loop": "/w/acme/research/loops/ol_demo_refine/",
    "usage": "/w/acme/support/usage/",
    "approvals": "/w/acme/support/approvals/",
    "settings": "/w/acme/support/settings/",
    "concepts": "/concepts/",
    "runs-by-cost": "/w/acme/research/?sort=cost",
    "runs-flat": "/w/acme/research/?subruns=flat&sort=tokens&order=asc",
    "loops": "/w/acme/research/loops/",
    "audit": "/t/acme/audit/",
    "redaction": "/w/acme/support/settings/redaction/",
    "members": "/w/acme/support/settings/members/",
    "prices": "/w/acme/support/settings/prices/",
    "password-change": "/accounts/password/",
}
# The error pages, each with the status it answers (console/pages/errors.py).
ERROR_PAGES = {
    "error-404": ("/no/such/page/", 404),
    "error-400": (f"{SUPPORT}/run_demo_triage/timeline/?first=in_doubt", 400),
    "error-404-run": (f"{SUPPORT}/run_nothing_here/", 404),
}
# Pages whose address holds an id the demo makes (an evaluation, its batch, a re-execution).
DEMO_PAGES = ("evaluations", "evaluation", "dataset", "batch", "reexecute", "divergence")
PHOTOGRAPHED = ("run-search", "run-conversation", "run-waterfall", "run-state", "outer-loop")


def _demo_pages() -> dict[str, str]:
    evaluation = Evaluation.objects.filter(workspace__slug="support").order_by("pk").first()
    fork = ReexecutionRequest.objects.filter(workspace__slug="support", new_run_id__gt="").order_by("pk").first()
    assert evaluation is not None and fork is not None, "the demo has an evaluation and an executed re-execution"
    return {
        "evaluations": "/w/acme/support/evaluations/",
        "evaluation": f"/w/acme/support/evaluations/{evaluation.public_id}/",
        "dataset": "/w/acme/support/datasets/triage-golden/",
        "batch": f"/w/acme/support/batches/{evaluation.batch_id}/",
        "reexecute": f"{SUPPORT}/run_demo_triage/reexecute/",
        "divergence": reverse("reexecution-divergence", args=["acme", "support", fork.public_id]),
    }


def _share_pages() -> dict[str, tuple[str, int]]:
    """A shared run (no login) and a revoked link's 410, in the share layout."""
    run = Run.objects.get(workspace__slug="research", run_id="run_demo_orchestrator")
    carol = User.objects.get(username="carol")
    _, token = sharing.create_link(
        workspace=run.workspace, run=run, by=carol, expires_in_hours=1, include_sub_runs=True
    )
    revoked, gone = sharing.create_link(
        workspace=run.workspace, run=run, by=carol, expires_in_hours=1, include_sub_runs=False
    )
    sharing.revoke_link(revoked, by=carol)
    return {"share": (f"/s/{token}/", 200), "share-410": (f"/s/{gone}/", 410)}


def _add_member(page: Page, username: str) -> None:
    """Settings → Members' add form, sent as typed (a new user, as viewer)."""
    page.locator("#member-username").fill(username)
    page.locator("button#member-add").click()
    page.wait_for_load_state()


def _check(page: Page, name: str, scheme: str, failures: dict[str, Any]) -> None:
    found = blocking_violations(page)
    if found:
        failures[f"{name} ({scheme})"] = found


def test_no_page_has_a_serious_or_critical_violation_light_or_dark(
    open_context: Any, server: Daphne, demo_with_evaluations: None
) -> None:
    failures: dict[str, Any] = {}
    pages = {**PAGES, **_demo_pages()}
    # The prices page with an override of a shipped model and a model of the workspace's own.
    support = Workspace.objects.get(tenant__slug="acme", slug="support")
    alice = User.objects.get(username="alice")
    price_settings.set_override(workspace=support, key="openai/gpt-4o", rates={"output": 8}, by=alice)
    price_settings.set_override(workspace=support, key="acme/house", rates={"input": 1, "output": 2}, by=alice)
    shared = _share_pages()
    # The 500 page as the server renders it (no route fails on purpose), at an address of the server
    # so its stylesheet loads as on a real failure.
    broken = errors.server_error(RequestFactory().get("/crash/")).content.decode()
    for scheme in SCHEMES:
        page = open_context(color_scheme=scheme).new_page()
        page.goto(f"{server.url}/accounts/login/")
        _check(page, "login", scheme, failures)
        log_in_to_demo(page, server)
        for name, path in pages.items():
            response = page.goto(f"{server.url}{path}")
            assert response is not None and response.status == 200, path
            if name == "run-waterfall":  # with a sub-run's bars loaded in place
                page.locator(".wf-label .wf-expand").first.click()
                expect(page.locator(".wf-children .wf-row").first).to_be_visible()
            _check(page, name, scheme, failures)
            if name in PHOTOGRAPHED:
                page.screenshot(path=str(screenshot_dir() / f"{name}-{scheme}.png"), full_page=True)
        for name, (path, status) in ERROR_PAGES.items():
            response = page.goto(f"{server.url}{path}")
            assert response is not None and response.status == status, path
            _check(page, name, scheme, failures)
        page.route(
            f"{server.url}/crash/", lambda route: route.fulfill(status=500, body=broken, content_type="text/html")
        )
        response = page.goto(f"{server.url}/crash/")
        assert response is not None and response.status == 500
        expect(page.locator("#error-title")).to_be_visible()
        _check(page, "error-500", scheme, failures)
        for name, (path, status) in shared.items():
            response = page.goto(f"{server.url}{path}")
            assert response is not None and response.status == status, path
            _check(page, name, scheme, failures)
        # The Members page's add form refused by the field, then a new user's password shown once.
        page.goto(f"{server.url}/w/acme/support/settings/members/")
        _add_member(page, "dave")  # a user already, asked for as a new one
        expect(page.locator("#member-username-error")).to_be_visible()
        _check(page, "members-add-refused", scheme, failures)
        _add_member(page, f"erin-{scheme}")
        expect(page.locator("#new-member-password")).to_be_visible()
        _check(page, "members-added", scheme, failures)
        # A viewer refused the audit log: the styled 403.
        viewer = open_context(color_scheme=scheme).new_page()
        log_in_to_demo(viewer, server, username="dave")
        response = viewer.goto(f"{server.url}/t/acme/audit/")
        assert response is not None and response.status == 403
        _check(viewer, "error-403", scheme, failures)
    assert failures == {}, failures
    # The pages only this demo holds, and a shared sub-run, do not scroll sideways at 390 px either
    # (tests/browser/test_runs_triage.py checks the others): long ids and digests break.
    narrow = open_context(viewport={"width": 390, "height": 844}).new_page()
    log_in_to_demo(narrow, server)
    sub_run = Run.objects.filter(workspace__slug="research", parent_run_id="run_demo_orchestrator").first()
    assert sub_run is not None
    share_root = shared["share"][0]
    wide = {}
    for path in (*_demo_pages().values(), share_root, f"{share_root}runs/{sub_run.run_id}/"):
        response = narrow.goto(f"{server.url}{path}")
        assert response is not None and response.status == 200, path
        overflow = narrow.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth")
        if overflow > 0:
            wide[path] = overflow
    assert wide == {}, f"the page scrolls sideways at 390 px by (px): {wide}"


def _tab_to(page: Page, selector: str, limit: int = 80) -> None:
    for _ in range(limit):
        page.keyboard.press("Tab")
        if page.evaluate("sel => document.activeElement && document.activeElement.matches(sel)", selector):
            return
    raise AssertionError(f"{selector} is not reachable with Tab")


def _focus_is_visible(page: Page) -> bool:
    return bool(
        page.evaluate("""() => {
        const style = getComputedStyle(document.activeElement);
        return style.outlineStyle !== 'none' && parseFloat(style.outlineWidth) >= 1;
    }""")
    )


def test_the_evidence_views_are_reached_and_worked_by_keyboard(page: Page, server: Daphne, demo: None) -> None:
    log_in_to_demo(page, server)
    page.goto(f"{server.url}{SUPPORT}/run_demo_in_doubt/")
    _tab_to(page, 'a[data-tab="state"]')
    assert _focus_is_visible(page)
    page.keyboard.press("Enter")
    expect(page.locator("#scrubber")).to_be_visible()
    _tab_to(page, "#scrubber")
    assert _focus_is_visible(page)
    page.keyboard.press("ArrowLeft")
    expect(page.locator("#scrubber")).to_have_value("18")

    page.goto(f"{server.url}{RESEARCH}/run_demo_orchestrator/waterfall/")
    _tab_to(page, ".wf-label .wf-expand")
    assert _focus_is_visible(page)
    page.keyboard.press("Enter")
    expect(page.locator(".wf-label .wf-expand").first).to_have_attribute("aria-expanded", "true")
    _tab_to(page, ".wf-row a.wf-link")
    assert _focus_is_visible(page)

    page.goto(f"{server.url}{SUPPORT}/run_demo_crashed_resumed/")
    _tab_to(page, "#timeline-search input[name=tool]")
    page.keyboard.type("lookup_order")
    page.keyboard.press("Enter")
    expect(page.locator("#search-summary")).to_contain_text("4 matching events")
    _tab_to(page, "#feedback-form input[name=rating]")  # the rating form, after the evidence
    assert _focus_is_visible(page)
