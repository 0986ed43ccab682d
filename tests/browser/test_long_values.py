"""Long values a run or a request carries, in Chromium: a 100 KB input override on the Approvals
page, and ids, workflow versions and model names without a space in the run header and timeline,
never push a page sideways, at 1280 px or at 390 px (docs/operations.md), light or dark; a long
value is folded to its beginning with a way to read it all. Nor do step paths, call ids and tool
names without a space in the run's tabs (Steps, Costs, Conversation and the rest), as production
serves them. The header's actions read at the size of the text around them, not the heading's.
The audit log's detail labels stay whole beside long values."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger import log
from ledger.models import Workspace
from ledger.reexecution import services
from ledger.runtime.executor import start_run
from tests.browser import data
from tests.browser.conftest import Daphne, live_reaches, log_in, screenshot_dir
from tests.conftest import ev, started

# Layout only: how the pages lay out what they were given is the templates' and the CSS's, the
# same on both databases (the SQLite pass runs it; about 30 s).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.backend_independent]

WIDTHS = (1280, 390)
SCHEMES = ("light", "dark")


def _sideways(page: Page) -> int:
    return int(page.evaluate("() => document.scrollingElement.scrollWidth - window.innerWidth"))


# What lies past the window's right edge outside a box that scrolls or clips it (a wide table
# scrolls in its own box at 390 px by design: console.css): elements, and text that overflows its
# element (a flex container's own words).
PAST_THE_WINDOW = """() => {
  const inBox = node => { for (let a = node.parentElement; a && a !== document.body; a = a.parentElement) {
    if (getComputedStyle(a).overflowX !== "visible") return true; } return false; };
  const name = e => e.tagName.toLowerCase() + (e.className ? "." + String(e.className).split(" ").join(".") : "");
  const past = [];
  for (const e of document.body.querySelectorAll("*")) {
    if (e.getBoundingClientRect().right > innerWidth + 1 && !inBox(e)) past.push(name(e));
  }
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const range = document.createRange();
    range.selectNodeContents(node);
    if ([...range.getClientRects()].some(r => r.right > innerWidth + 1) && !inBox(node)) past.push("text in " + name(node.parentElement));
  }
  return past.slice(0, 6);
}"""


def test_a_100_kb_input_override_is_folded_and_approvals_stay_in_the_window(
    open_context: Any, server: Daphne, workspace: Workspace, operator: User, approver: User
) -> None:
    start_run(workspace=workspace, workflow="support.triage", run_id="run_big_input", input={"ticket": "t"})
    rx = services.request_reexecution(
        workspace=workspace,
        run_id="run_big_input",
        mode="fork",
        from_step="normalize",
        input="x" * 100_000,
        reason="try a long ticket",
        by=operator,
    )
    wide = {}
    for width in WIDTHS:
        for scheme in SCHEMES:
            page = open_context(viewport={"width": width, "height": 860}, color_scheme=scheme).new_page()
            log_in(page, server, approver, "/w/acme/support/approvals/")
            live_reaches(page, "refreshes", 1)  # look at the list after its swap on the socket's opening
            card = page.locator(f"#rx-{rx.public_id}")
            override = card.locator(".input-override")
            # Its beginning, then a way to read all of it.
            preview = override.locator("pre.preview")
            expect(preview).to_be_visible()
            assert len(preview.inner_text()) <= 502  # PREVIEW_CHARS and the ellipsis
            summary = override.locator("details summary")
            expect(summary).to_have_text("Show all 100,002 characters")
            if _sideways(page) > 0:
                wide[f"{width} {scheme} folded"] = _sideways(page)
            if width == 390 and scheme == "light":
                card.screenshot(path=str(screenshot_dir() / "approvals-long-input-390.png"))
            summary.click()
            whole = override.locator("details pre.text")
            expect(whole).to_be_visible()
            expect(preview).to_be_hidden()
            assert whole.evaluate("pre => pre.textContent.length") == 100_002
            # Open, it scrolls in its own bounded box, not the page.
            assert whole.evaluate("pre => pre.clientHeight < pre.scrollHeight && pre.clientWidth <= innerWidth")
            if _sideways(page) > 0:
                wide[f"{width} {scheme} open"] = _sideways(page)
    assert wide == {}, f"the Approvals page scrolls sideways by (px): {wide}"


def _long_run(workspace: Workspace) -> str:
    """A failed run whose every header value is as long as the API lets it be, without a space."""
    parent = "run_" + "p" * 80
    run_id = "run_" + "a" * 80
    log.append(workspace=workspace, run_id=parent, events=[started()])
    log.append(
        workspace=workspace,
        run_id=run_id,
        events=[
            started(
                "outer_loop:wfver_" + "w" * 180,
                parentRunId=parent,
                replayOf="run_" + "r" * 80,
                label="l" * 200,
                input={"k" * 60: "v" * 3000, "short": "s" * 300},
            ),
            ev("StepScheduled", stepPath="s" * 200),
            ev("StepAttemptStarted", stepPath="s" * 200, attempt=1),
            ev(
                "harness.model.responded",
                turn=1,
                callId="c" * 200,
                stepPath="s" * 200,
                model={"provider": "p" * 60, "modelId": "m" * 130},
                response={"text": "t" * 2000, "usage": {"inputTokens": 10, "outputTokens": 2}},
            ),
            ev("RunFailed", error={"name": "E" * 150, "message": "x" * 3000}),
        ],
    )
    return run_id


def test_long_unbroken_values_in_the_run_header_and_timeline_break_instead_of_scrolling(
    open_context: Any, server: Daphne, workspace: Workspace, viewer: User
) -> None:
    run_id = _long_run(workspace)
    wide = {}
    for width in WIDTHS:
        for scheme in SCHEMES:
            page = open_context(viewport={"width": width, "height": 860}, color_scheme=scheme).new_page()
            log_in(page, server, viewer, f"/w/acme/support/runs/{run_id}/")
            expect(page.locator("#run-status")).to_have_text("failed")
            expect(page.locator("#timeline-rows tr.event")).to_have_count(5)
            if _sideways(page) > 0:
                wide[f"{width} {scheme}"] = _sideways(page)
            if width == 390 and scheme == "light":
                page.locator("#run-header").screenshot(path=str(screenshot_dir() / "run-header-long-values-390.png"))
    assert wide == {}, f"the run page scrolls sideways by (px): {wide}"


def test_the_header_actions_read_at_the_size_of_the_text_light_and_dark(
    open_context: Any, server: Daphne, workspace: Workspace, operator: User
) -> None:
    """Re-execute…, Download evidence (.zip) and Cancel run… are `.action-link`s: outlined like the
    console's buttons and at the size of the text around them (they were the heading's size)."""
    log.append(workspace=workspace, run_id="run_actions", events=[started()])
    for scheme in SCHEMES:
        page = open_context(color_scheme=scheme).new_page()
        log_in(page, server, operator, "/w/acme/support/runs/run_actions/")
        body = page.evaluate("getComputedStyle(document.body).fontSize")
        for selector in ("#reexecute", "#evidence-zip", "#cancel-run summary"):
            action = page.locator(selector)
            expect(action).to_be_visible()
            style = action.evaluate(
                """el => { const s = getComputedStyle(el);
                  return {size: s.fontSize, weight: s.fontWeight, border: s.borderTopStyle, color: s.color,
                          background: s.backgroundColor, underline: s.textDecorationLine}; }"""
            )
            assert float(style["size"].removesuffix("px")) <= float(body.removesuffix("px")), (selector, style)
            assert style["weight"] == "400" and style["border"] == "solid", (selector, style)
            assert style["underline"] == "none" and style["color"] != style["background"], (selector, style)
        page.locator("#run-header").screenshot(path=str(screenshot_dir() / f"run-header-actions-{scheme}.png"))
        narrow = open_context(viewport={"width": 390, "height": 844}, color_scheme=scheme).new_page()
        log_in(narrow, server, operator, "/w/acme/support/runs/run_actions/")
        assert _sideways(narrow) == 0


def _long_paths_run(workspace: Workspace) -> str:
    """A run whose step, harness session, model and tool call carry the longest names the API
    takes without a space: a 200-character step path, call ids and a tool name."""
    run_id = "run_long_paths"
    path = "s" * 200
    log.append(
        workspace=workspace,
        run_id=run_id,
        events=[
            started(),
            ev("StepScheduled", stepPath=path),
            ev("StepAttemptStarted", stepPath=path, attempt=1),
            ev(
                "harness.session.started",
                role="r" * 100,
                task="t" * 300,
                manifest={},
                manifestHash="h" * 64,
                stepPath=path,
            ),
            ev(
                "harness.model.called",
                turn=1,
                stepPath=path,
                promptHash="p" * 64,
                request={"messages": [{"role": "user", "content": "u" * 500}]},
            ),
            ev(
                "harness.model.responded",
                turn=1,
                callId="c" * 200,
                stepPath=path,
                model={"provider": "p" * 60, "modelId": "m" * 130},
                response={"text": "t" * 2000, "usage": {"inputTokens": 10, "outputTokens": 2}},
            ),
            ev(
                "harness.tool_call.started",
                callId="k" * 200,
                caller="x" * 50,
                toolName="n" * 200,
                args={"a" * 100: "b" * 300},
                stepPath=path,
            ),
            ev("harness.tool_call.succeeded", callId="k" * 200, result="r" * 500, durationMs=3, stepPath=path),
            ev("harness.session.completed", stepPath=path),
            ev("StepCompleted", stepPath=path, attempt=1, output="o" * 500),
        ],
    )
    return run_id


TABS = ("steps", "costs", "conversation", "evidence", "state", "waterfall", "subruns")


def test_long_step_paths_and_call_names_in_the_tabs_break_instead_of_scrolling(
    open_context: Any, production: Daphne, workspace: Workspace, viewer: User
) -> None:
    """A 200-character step path (and the call ids and tool name beside it) widened the Steps,
    Costs and Conversation tabs until the page scrolled sideways at 390 px; it breaks in its line,
    or past a reading width in its table's cell."""
    run_id = _long_paths_run(workspace)
    wide = {}
    for width in WIDTHS:
        page = open_context(viewport={"width": width, "height": 860}).new_page()
        log_in(page, production, viewer, f"/w/acme/support/runs/{run_id}/")
        for tab in TABS:
            response = page.goto(f"{production.url}/w/acme/support/runs/{run_id}/{tab}/")
            assert response is not None and response.status == 200, tab
            expect(page.locator(f"#run-tabs a[data-tab={tab}]")).to_have_attribute("aria-current", "page")
            past = page.evaluate(PAST_THE_WINDOW)
            if _sideways(page) > 0 or past:
                wide[f"{width} {tab}"] = (_sideways(page), past)
            if width == 390 and tab in ("steps", "conversation"):
                page.screenshot(path=str(screenshot_dir() / f"run-{tab}-long-paths-390.png"), full_page=True)
    assert wide == {}, f"the run's tabs scroll sideways by (px, what lies past the window): {wide}"


# A label of the Audit page's details that reads on more than one line (its words' boxes at more
# than one height).
BROKEN_LABELS = """() => [...document.querySelectorAll("table.audit .details-list dt")].filter(dt => {
  const range = document.createRange();
  range.selectNodeContents(dt);
  return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size > 1;
}).map(dt => dt.textContent)"""


def test_audit_detail_labels_stay_whole_beside_long_values(
    open_context: Any, production: Daphne, workspace: Workspace, admin: User
) -> None:
    """The Details column of the audit log is the narrow one beside long reasons and targets: its
    labels broke in the middle ("newR" over "unId") as the values beside them took the width; a
    label keeps its line and a long value goes under it."""
    from django.db import transaction

    from ledger import audit

    for n in range(3):
        with transaction.atomic():
            audit.record(
                actor="worker:vm:2507:8d171711",
                tenant=workspace.tenant,
                workspace=workspace,
                action="evidence_bundle.downloaded",
                target=f"run_with_a_rather_long_identifier_{n}",
                reason="What would the customer have been told had the order been the one asked about? " * 2,
                details={"runId": f"run_with_a_rather_long_identifier_{n}", "sha256": "0123456789abcdef" * 4},
            )
    broken = {}
    for width in WIDTHS:
        page = open_context(viewport={"width": width, "height": 860}).new_page()
        log_in(page, production, admin, "/t/acme/audit/")
        expect(page.locator("table.audit .details-list dt").first).to_be_visible()
        labels = page.evaluate(BROKEN_LABELS)
        if labels or _sideways(page) > 0:
            broken[width] = (labels, _sideways(page))
    assert broken == {}, f"labels broken over lines, and sideways scroll, per width: {broken}"


@pytest.mark.parametrize("steps", ["a loop's visits", "200-character paths"])
def test_the_reexecute_form_and_its_plan_stay_in_the_window(
    open_context: Any, production: Daphne, workspace: Workspace, operator: User, steps: str
) -> None:
    """The form is a grid whose one column took the plan table's whole width, so at 390 px the
    page scrolled sideways (the demo's run_demo_escalation by 46 px); the table scrolls in its
    own box instead. A 200-character step path widened the step picker and the plan's table past
    the window at 1280 px as well (by 593 px): both break it or keep it in their box."""
    if steps == "200-character paths":
        run_id = _long_paths_run(workspace)
    else:
        run_id = "run_loop"
        events = [started()]
        for path in ("draft.visit[0]", "review.visit[0]", "draft.visit[1]", "review.visit[1]", "send_the_reply"):
            events += [
                ev("StepScheduled", stepPath=path),
                ev("StepAttemptStarted", stepPath=path, attempt=1),
                ev("StepCompleted", stepPath=path, attempt=1, output={"ok": True}),
            ]
        log.append(workspace=workspace, run_id=run_id, events=[*events, ev("RunCompleted", output="sent")])
    wide = {}
    for width in WIDTHS:
        page = open_context(viewport={"width": width, "height": 860}).new_page()
        log_in(page, production, operator, f"/w/acme/support/runs/{run_id}/reexecute/")
        expect(page.locator("#plan table")).to_be_visible()
        past = page.evaluate(PAST_THE_WINDOW)
        if _sideways(page) > 0 or past:
            wide[width] = (_sideways(page), past)
    assert wide == {}, f"the re-execute form scrolls sideways by (px, what lies past the window): {wide}"


def test_the_usage_reports_days_read_on_one_line_at_390_px(
    open_context: Any, production: Daphne, workspace: Workspace, viewer: User
) -> None:
    """At 390 px the usage tables scroll in their own box, and the day column was squeezed to its
    narrowest: each date broke at its hyphens ("2026-11-" over "07")."""
    # Large counts widen the number columns, which squeezed the day column.
    data.append(
        workspace, "run_priced", started(), *data.model_call("answer", 1, "openai", "gpt-4o-mini", (1_234_567, 89_012))
    )
    page = open_context(viewport={"width": 390, "height": 860}).new_page()
    log_in(page, production, viewer, "/w/acme/support/usage/")
    days = page.locator("#usage-days tbody th")
    expect(days.first).to_be_visible()
    lines = days.evaluate_all(
        """ths => ths.map(th => { const range = document.createRange(); range.selectNodeContents(th);
             return new Set([...range.getClientRects()].map(r => Math.round(r.top))).size; })"""
    )
    assert lines and set(lines) == {1}, f"lines per day: {lines}"
    assert _sideways(page) == 0
