"""The run page's htmx forms when the server refuses, in headless Chromium on a Daphne with DEBUG
off (hashed static files, the CSP): a refused form is swapped in with its message next to the
field and what was typed kept, instead of htmx dropping the 4xx answer; an action after the
session ended takes the whole window to the login page and back, instead of pasting the login
page into the run page."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import Feedback, Workspace
from tests.browser import data
from tests.browser.conftest import log_in
from tests.conftest import PASSWORD
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

SUPPORT = "/w/acme/support"


def test_a_reconcile_with_bad_json_shows_why_and_keeps_what_was_typed(
    page: Page, production: Daphne, workspace: Workspace, operator: User
) -> None:
    data.running_run(workspace, "run_doubt")
    data.in_doubt_call(workspace, "run_doubt")
    log_in(page, production, operator)
    page.goto(f"{production.url}{SUPPORT}/runs/run_doubt/evidence/")

    form = page.locator("form.reconcile-form")
    form.locator("input[value=succeeded]").check()
    form.locator("textarea[name=value]").fill('{"refundId": "R-1", ')
    form.locator("input[name=note]").fill("the bank statement shows the refund")
    with page.expect_response(lambda r: r.url.endswith("/reconcile/")) as answer:
        form.locator("button[type=submit]").click()
    assert answer.value.status == 400

    form = page.locator("form.reconcile-form")
    expect(form.locator("[role=alert]")).to_contain_text("The result must be JSON")
    expect(form.locator("textarea[name=value]")).to_have_value('{"refundId": "R-1", ')
    expect(form.locator("input[name=note]")).to_have_value("the bank statement shows the refund")


def test_an_action_after_the_session_ended_goes_to_the_login_and_back(
    open_context: Any, production: Daphne, workspace: Workspace, operator: User
) -> None:
    data.running_run(workspace, "run_signed_out")
    context = open_context()
    page = context.new_page()
    log_in(page, production, operator)
    run_path = f"{SUPPORT}/runs/run_signed_out/"
    page.goto(f"{production.url}{run_path}")

    other_tab = context.new_page()  # the same cookies: logging out here ends the first tab's session
    other_tab.goto(f"{production.url}{SUPPORT}/")
    other_tab.click("form.logout [type=submit]")
    other_tab.wait_for_url(lambda url: "/accounts/login/" in url)

    page.locator("#feedback-form input[name=rating][value='4']").check()
    page.click("#feedback-form [type=submit]")
    page.wait_for_url(lambda url: "/accounts/login/" in url)
    assert page.url == f"{production.url}/accounts/login/?next={quote(run_path, safe='')}"
    expect(page.locator("input[name=username]")).to_have_count(1)  # the login page, once, as a page

    page.fill("input[name=username]", operator.get_username())
    page.fill("input[name=password]", PASSWORD)
    page.click("form:has(input[name=password]) [type=submit]")
    page.wait_for_url(f"{production.url}{run_path}")


def test_a_form_sent_after_logging_in_again_elsewhere_says_so_in_place_and_keeps_what_was_typed(
    open_context: Any, production: Daphne, workspace: Workspace, operator: User
) -> None:
    """Logging in again in another tab rotates the CSRF token: the first tab's htmx form got a
    403 that htmx dropped, and the click did nothing. The message now stands before the form."""
    data.running_run(workspace, "run_rotated")
    context = open_context()
    page = context.new_page()
    log_in(page, production, operator)
    run_path = f"{SUPPORT}/runs/run_rotated/"
    page.goto(f"{production.url}{run_path}")

    other_tab = context.new_page()  # the same cookies: its new login is the first tab's session too
    other_tab.goto(f"{production.url}{SUPPORT}/")
    other_tab.click("form.logout [type=submit]")
    log_in(other_tab, production, operator)

    form = page.locator("#feedback-form")
    form.locator("input[name=rating][value='4']").check()
    form.locator("input[name=comment]").fill("the refund step waited too long")
    for _ in range(2):  # twice: one message, not two
        with page.expect_response(lambda r: r.url.endswith("/feedback/")) as answer:
            form.locator("[type=submit]").click()
        assert answer.value.status == 403
    message = page.locator("#feedback .form-expired")
    expect(message).to_have_count(1)
    expect(message).to_have_attribute("role", "alert")
    expect(message).to_contain_text("this form expired")
    expect(message).to_contain_text(f"signed in as {operator.get_username()}")
    expect(form.locator("input[name=comment]")).to_have_value("the refund step waited too long")
    expect(form.locator("input[name=rating][value='4']")).to_be_checked()
    assert not Feedback.objects.filter(run__run_id="run_rotated").exists()

    message.locator("a.form-expired-reload").click()  # the page again, with the session's token
    page.wait_for_load_state()
    assert page.url == f"{production.url}{run_path}"
    form.locator("input[name=rating][value='4']").check()
    form.locator("input[name=comment]").fill("the refund step waited too long")
    form.locator("[type=submit]").click()
    expect(page.locator("#feedback .feedback-item[data-rating='4']")).to_have_count(1)
    expect(page.locator(".form-expired")).to_have_count(0)
