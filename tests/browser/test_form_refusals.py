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

from ledger.evaluation import datasets
from ledger.models import Dataset, EvaluationPolicy, Feedback, Workspace
from ledger.runtime.executor import start_run
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


def _triage_runs(workspace: Workspace, count: int) -> list[str]:
    run_ids = [f"run_refused_{n}" for n in range(count)]
    for run_id in run_ids:
        start_run(
            workspace=workspace, workflow="support.triage", run_id=run_id, input={"ticket": "Late.", "orderId": "B-2"}
        )
    return run_ids


def test_a_refused_evaluation_policy_says_why_and_keeps_what_was_typed(
    page: Page, production: Daphne, workspace: Workspace, approver: User, operator: User
) -> None:
    """The approver's policy form on the Evaluations page: a ceiling that is no amount came back as
    a bare "Not done" page, and everything typed (kinds, scorers, ceilings, note) was lost."""
    datasets.add_runs(workspace=workspace, name="golden", run_ids=_triage_runs(workspace, 1), by=operator)
    log_in(page, production, approver, f"{SUPPORT}/evaluations/")
    form = page.locator("#policy-form")
    form.locator("summary").click()
    form.locator("input[name=change_kinds][value=prompt]").check()
    form.locator("input[name=scorers]").fill("exact, regex")
    form.locator("input[name=ceiling_per_evaluation]").fill("a dollar")
    form.locator("input[name=ceiling_per_day]").fill("7.50")
    form.locator("input[name=ttl_hours]").fill("48")
    form.locator("input[name=note]").fill("CI may try prompts on golden")
    with page.expect_response(lambda r: r.url.endswith("/evaluations/policies/")) as answer:
        form.locator("#policy-submit").click()
    assert answer.value.status == 400

    form = page.locator("#policy-form")
    expect(form.locator("#policy-error")).to_contain_text("the ceiling per evaluation is an amount in USD")
    expect(form.locator("#policy-error")).not_to_contain_text("ceilingPerEvaluationUsd")
    expect(form.locator("input[name=ceiling_per_evaluation]")).to_have_attribute("aria-invalid", "true")
    expect(form.locator("input[name=ceiling_per_evaluation]")).to_have_value("a dollar")
    expect(form.locator("input[name=change_kinds][value=model]")).to_be_checked()
    expect(form.locator("input[name=change_kinds][value=prompt]")).to_be_checked()
    expect(form.locator("input[name=change_kinds][value=input]")).not_to_be_checked()
    expect(form.locator("input[name=scorers]")).to_have_value("exact, regex")
    expect(form.locator("input[name=ceiling_per_day]")).to_have_value("7.50")
    expect(form.locator("input[name=ttl_hours]")).to_have_value("48")
    expect(form.locator("input[name=note]")).to_have_value("CI may try prompts on golden")
    assert not EvaluationPolicy.objects.exists()

    form.locator("input[name=ceiling_per_evaluation]").fill("1.50")
    form.locator("#policy-submit").click()
    expect(page.locator("#policies tbody tr")).to_have_count(1)
    policy = EvaluationPolicy.objects.get()
    assert policy.change_kinds == ["model", "prompt"] and policy.note == "CI may try prompts on golden"


def test_runs_refused_by_a_dataset_stay_ticked_with_the_name_and_the_reason(
    page: Page, production: Daphne, workspace: Workspace, operator: User
) -> None:
    """*Add the selected runs to a dataset…* with a name the dataset rules refuse: the runs list
    again, the ticks and the name kept and the reason beside the field, not a "Not done" page."""
    run_ids = _triage_runs(workspace, 3)
    log_in(page, production, operator, f"{SUPPORT}/")
    for run_id in run_ids[:2]:
        page.check(f'input.pick[value="{run_id}"]')
    page.click("#dataset-add summary")
    page.fill("#dataset-add input[name=dataset]", "Golden Set")
    with page.expect_response(lambda r: r.url.endswith("/datasets/add/")) as answer:
        page.click("#dataset-submit")
    assert answer.value.status == 400

    expect(page.locator("#dataset-error")).to_contain_text("a dataset name is 1-100 characters")
    expect(page.locator("#dataset-add input[name=dataset]")).to_have_value("Golden Set")
    for run_id in run_ids[:2]:
        expect(page.locator(f'input.pick[value="{run_id}"]')).to_be_checked()
    expect(page.locator(f'input.pick[value="{run_ids[2]}"]')).not_to_be_checked()
    assert not Dataset.objects.exists()

    page.fill("#dataset-add input[name=dataset]", "golden-set")
    page.click("#dataset-submit")
    expect(page.locator("#dataset-runs tbody tr")).to_have_count(2)
