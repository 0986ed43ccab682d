"""The workspace settings page in a real browser: an admin reaches it from the navigation, sets a
retention with htmx (a refusal shows in place), and revokes an API key with htmx."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import ApiKey, AuditEntry, Workspace
from ledger.tenancy.services import authenticate_key, create_key
from tests.browser.conftest import Daphne, log_in

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_admin_sets_retention_and_revokes_a_key_with_htmx(
    page: Page, server: Daphne, workspace: Workspace, admin: User
) -> None:
    key, secret = create_key(workspace=workspace, scopes=["read"], name="ci")
    log_in(page, server, admin)
    page.goto(f"{server.url}/w/acme/support/")
    page.locator("a#nav-settings").click()
    page.wait_for_url(f"{server.url}/w/acme/support/settings/")
    page.evaluate("window.settingsMarker = 'same page'")

    form = page.locator("form#retention-form")
    # Forever is already what is set: the server refuses (422) and the form says so in place.
    form.locator("[name=days]").fill("")
    form.locator("[name=reason]").fill("no change")
    form.locator("button[type=submit]").click()
    expect(page.locator("#retention .error-box")).to_contain_text("nothing changed")

    form = page.locator("form#retention-form")
    form.locator("[name=days]").fill("30")
    form.locator("[name=reason]").fill("a month is enough")
    form.locator("button[type=submit]").click()
    expect(page.locator("#retention")).to_contain_text("30 days")
    expect(page.locator("#retention .saved")).to_be_visible()
    assert Workspace.objects.get(pk=workspace.pk).retention_days == 30

    row = page.locator(f"tr#key-{key.prefix}")
    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.revoke").click()
    expect(page.locator(f"tr#key-{key.prefix}")).to_contain_text("revoked")
    expect(page.locator(f"tr#key-{key.prefix} button.revoke")).to_have_count(0)
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None and authenticate_key(secret) is None
    assert set(AuditEntry.objects.values_list("action", flat=True)) >= {"retention.changed", "api_key.revoked"}
    # All of it in place: the page was never reloaded.
    assert page.evaluate("window.settingsMarker") == "same page"
