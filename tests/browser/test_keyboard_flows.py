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

from console.pages.runs import PAGE_SIZE
from ledger.models import Workspace
from tests.browser import data
from tests.browser.conftest import Appender, live_reaches, log_in_to_demo
from tests.browser.test_live_console import RECORD_VIOLATIONS, harness
from tests.conftest import ev
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

__all__ = ["harness"]  # the fixture, shared with the live console's tests

SUPPORT = "/w/acme/support"


@pytest.fixture
def keyboard(open_context: Any) -> Iterator[Any]:
    """New pages (each its own context, so its own user) that must end without a CSP violation, a
    script error or an htmx error; refused forms answer 4xx here on purpose, so those are not problems."""
    pages: list[tuple[Page, list[str]]] = []

    def _new() -> Page:
        page = open_context().new_page()
        page.add_init_script(RECORD_VIOLATIONS)
        problems: list[str] = []
        page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
        # htmx says what it could not do on the console (an out-of-band part with no target: htmx:oobErrorNoTarget).
        page.on(
            "console", lambda m: problems.append(m.text) if m.type == "error" and m.text.startswith("htmx:") else None
        )
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


def test_a_note_typed_before_a_live_refresh_is_still_there_to_send(
    keyboard: Any, production: Daphne, harness: Appender
) -> None:
    """A note typed, then Tab to Approve: a refresh that swaps the list meanwhile must not empty the
    note (its field is required: Enter would then send nothing at all)."""
    page = keyboard()
    log_in_to_demo(page, production, "bob")
    page.goto(f"{production.url}{SUPPORT}/approvals/")
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    waiting = page.locator("#tool-calls-count").inner_text()
    note = page.locator("article.request.pending:not(.tool-call-approval) input[name=note]")
    note.focus()
    page.keyboard.type("checked the plan")
    page.keyboard.press("Tab")
    assert focused(page, "class") == "approve"

    harness.append(
        "run_waits_for_a_person",
        data.started(label="a call to approve"),
        *data.step("refund"),
        ev(
            "harness.tool_call.approval_requested",
            callId="call_waits",
            toolName="issue_refund",
            args={"order": 7},
            argsDigest=f"sha256:{7:064x}",
            stepPath="refund",
        ),
    )
    expect(page.locator("#tool-calls-count")).to_have_text(str(int(waiting) + 1))
    expect(note).to_have_value("checked the plan")
    assert focused(page, "class") == "approve"
    page.keyboard.press("Enter")
    expect(page.locator("table.decided")).to_contain_text("checked the plan")


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


def test_older_events_keep_the_focus_on_the_pager(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/timeline/?after=10&limit=5")
    older = page.locator("#timeline-older")
    older.focus()
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{SUPPORT}/runs/run_demo_crashed_resumed/timeline/?after=5&limit=5")
    expect(page.locator("#timeline-rows tr.event").first).to_have_attribute("data-sequence", "6")
    expect(older).to_be_focused()  # Enter again goes on paging back
    page.keyboard.press("Enter")
    expect(page.locator("#timeline-rows tr.event").first).to_have_attribute("data-sequence", "1")
    expect(page.locator("#tab-panel")).to_be_focused()  # no older page: the panel, not the top


def test_the_runs_lists_next_page_puts_the_focus_on_its_first_new_run(
    keyboard: Any, production: Daphne, demo: None
) -> None:
    workspace = Workspace.objects.get(tenant__slug="acme", slug="support")
    for n in range(PAGE_SIZE):
        data.append(workspace, f"run_paged_{n:02}", data.started(label=f"paged {n}"))
    page = keyboard()
    log_in_to_demo(page, production, "dave")
    shown = page.locator("#runs-rows tr.run").count()
    more = page.locator("#next-page")
    more.focus()
    page.keyboard.press("Enter")
    expect(page.locator("#runs-rows tr.paged")).to_have_count(1)
    new_first = page.locator("#runs-rows tr.paged + tr.run .run-id a")
    expect(new_first).to_be_focused()  # where the list went on, not its end nor the page's top
    assert page.locator("#runs-rows tr.run").count() > shown and focus_is_visible(page)
    href = new_first.get_attribute("href")
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{href}")


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


def test_a_refused_reexecution_focuses_the_field_that_says_why(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "carol")
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_triage/")
    page.locator("#reexecute").focus()
    page.keyboard.press("Enter")
    page.wait_for_url(f"{production.url}{SUPPORT}/runs/run_demo_triage/reexecute/")
    page.locator("input[name=mode][value=simulate]").focus()
    page.keyboard.press("ArrowDown")  # evaluate
    page.keyboard.press("ArrowDown")  # resume is not offered for this run: skipped
    expect(page.locator("input[name=mode][value=fork]")).to_be_checked()
    page.locator("textarea[name=reason]").focus()
    page.keyboard.type("try the other branch")
    page.locator("#submit-request").focus()
    page.keyboard.press("Enter")  # a fork without its step

    step = page.locator("#from-step")
    expect(step).to_be_focused()
    expect(step).to_have_attribute("aria-invalid", "true")
    message = page.locator(f"#{step.get_attribute('aria-describedby')}")
    expect(message).to_have_text("Choose the step the fork runs live from.")
    expect(message).to_have_attribute("role", "alert")


def test_a_changed_reexecution_plan_is_said_in_one_sentence(keyboard: Any, production: Daphne, demo: None) -> None:
    """The plan's table is not a live region (a screen reader would read every step again at each
    change of mode); one polite sentence says what the new plan does."""
    page = keyboard()
    log_in_to_demo(page, production, "carol")
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_triage/reexecute/")
    page.wait_for_load_state()  # htmx binds the form's change trigger once the page has loaded
    said = page.locator("#plan-said")
    expect(said).to_have_attribute("aria-live", "polite")
    assert page.locator("#plan").get_attribute("aria-live") is None
    page.locator("input[name=mode][value=simulate]").focus()
    page.keyboard.press("ArrowDown")  # evaluate
    expect(page.locator("#plan h2")).to_contain_text("evaluate")
    expect(said).to_have_text(
        "Plan for evaluate: model calls live, tool calls from the record; no write tool can fire."
    )
    expect(page.locator("input[name=mode][value=evaluate]")).to_be_focused()  # the swap left it there


def test_a_refused_cancel_focuses_its_reason(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "carol")
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_in_progress/")
    page.locator("#cancel-run summary").focus()
    page.keyboard.press("Enter")
    reason = page.locator("#cancel-run input[name=reason]")
    page.keyboard.press("Tab")
    expect(reason).to_be_focused()
    page.keyboard.type("   ")  # past the browser's "required", refused by the server
    page.keyboard.press("Enter")

    expect(page.locator("#cancel-error")).to_be_visible()
    expect(reason).to_be_focused()
    expect(reason).to_have_attribute("aria-invalid", "true")
    expect(reason).to_have_attribute("aria-describedby", "cancel-error")
    expect(page.locator("#run-status")).to_have_text("running")


def test_a_refused_approval_focuses_the_note_that_says_why(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "bob")
    page.goto(f"{production.url}{SUPPORT}/approvals/")
    note = page.locator("article.request.pending:not(.tool-call-approval) input[name=note]")
    note.focus()
    page.keyboard.type("  ")
    page.keyboard.press("Tab")
    assert focused(page, "class") == "approve"
    page.keyboard.press("Enter")

    expect(page.locator("#decision-refused")).to_contain_text("the note is required")
    refused = page.locator("input[name=note][aria-invalid=true]")
    expect(refused).to_have_count(1)
    expect(refused).to_be_focused()
    expect(refused).to_have_attribute("aria-describedby", "decision-refused")
    # The socket's first refresh must not take the refusal away while it is being read.
    expect(page.locator("#live-status")).to_have_attribute("data-state", "live")
    live_reaches(page, "refreshes", 1)
    expect(page.locator("#decision-refused")).to_be_visible()
    expect(refused).to_be_focused()

    # With a note, from the keyboard: approved.
    page.keyboard.type("checked the plan")
    page.keyboard.press("Tab")
    page.keyboard.press("Enter")
    expect(page.locator("#decided-first, table.decided")).not_to_have_count(0)
    expect(page.locator("table.decided")).to_contain_text("checked the plan")


def test_a_new_share_link_is_focused_and_selected_for_copying(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_triage/")
    page.locator("#share-create input[name=expires_in_hours]").focus()
    page.keyboard.press("Control+A")
    page.keyboard.type("2")
    page.keyboard.press("Enter")

    url = page.locator("#share-new-url")
    expect(url).to_be_focused()
    value = url.input_value()
    assert value.startswith(f"{production.url}/s/")
    assert url.evaluate("el => [el.selectionStart, el.selectionEnd]") == [0, len(value)]


def test_a_new_api_key_secret_takes_the_focus_and_a_revoke_keeps_it_nearby(
    keyboard: Any, production: Daphne, demo: None
) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/settings/")
    page.locator("#key-name").focus()
    page.keyboard.type("keyboard-made")
    page.locator("#key-create").focus()
    page.keyboard.press("Enter")

    secret = page.locator("#new-key-secret")
    expect(secret).to_be_focused()
    value = secret.input_value()
    assert value and secret.evaluate("el => [el.selectionStart, el.selectionEnd]") == [0, len(value)]

    row = page.locator("tr.api-key", has_text="keyboard-made")
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.revoke").focus()
    page.keyboard.press("Enter")
    expect(row).to_contain_text("revoked")
    expect(row).to_be_focused()  # the row that changed, not the top of the page


def test_a_rating_lands_the_focus_on_the_rating_section(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production, "dave")
    page.goto(f"{production.url}{SUPPORT}/runs/run_demo_triage/")
    page.locator("#feedback-form input[name=rating]").first.focus()
    page.keyboard.press("ArrowRight")
    page.keyboard.press("ArrowRight")
    expect(page.locator("#feedback-form input[value='3']")).to_be_checked()
    page.locator("#feedback-form button[type=submit]").focus()
    page.keyboard.press("Enter")

    expect(page.locator("#feedback-title")).to_contain_text("3.0/5 from 1")
    expect(page.locator("#feedback")).to_be_focused()


def test_settings_refusals_and_one_time_passwords_take_the_focus(keyboard: Any, production: Daphne, demo: None) -> None:
    page = keyboard()
    log_in_to_demo(page, production)
    page.goto(f"{production.url}{SUPPORT}/settings/")
    for box in page.locator("#key-form input[name=scopes]:checked").all():
        box.uncheck()
    page.locator("#key-create").focus()
    page.keyboard.press("Enter")
    first_scope = page.locator("#key-form input[name=scopes]").first
    expect(first_scope).to_be_focused()
    expect(first_scope).to_have_attribute("aria-invalid", "true")
    expect(page.locator(f"#{first_scope.get_attribute('aria-describedby')}")).to_contain_text("at least one scope")

    page.goto(f"{production.url}{SUPPORT}/settings/redaction/")
    page.locator("#redaction-form [name=patterns]").fill("([unclosed")
    page.locator("#redaction-form button[type=submit]").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#redaction-refused")).to_be_focused()
    assert focus_is_visible(page)

    page.goto(f"{production.url}{SUPPORT}/settings/members/")
    page.locator("#member-username").focus()
    page.keyboard.type("erin")
    page.keyboard.press("Enter")
    password = page.locator("#new-member-password")
    expect(password).to_be_focused()
    value = password.input_value()
    assert value and password.evaluate("el => [el.selectionStart, el.selectionEnd]") == [0, len(value)]
