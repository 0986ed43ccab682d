"""The run page's htmx forms when the server refuses, in headless Chromium on a Daphne with DEBUG
off (hashed static files, the CSP): a refused form is swapped in with its message next to the
field and what was typed kept, instead of htmx dropping the 4xx answer."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import Workspace
from tests.browser import data
from tests.browser.conftest import log_in
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
