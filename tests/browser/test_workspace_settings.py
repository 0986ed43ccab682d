"""The workspace settings page in a real browser: an admin reaches it from the navigation, sets a
retention with htmx (a refusal shows in place), and revokes an API key with htmx; changes
members and prices, and has the worker reprice the workspace's recorded costs."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from playwright.sync_api import Page, expect

from ledger.models import ApiKey, AuditEntry, Membership, Run, Workspace
from ledger.tenancy.services import authenticate_key, create_key
from tests.browser import data
from tests.browser.conftest import Daphne, Worker, log_in

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


def test_an_admin_changes_a_role_and_removes_a_member_in_place(
    page: Page, production: Daphne, workspace: Workspace, admin: User, operator: User, viewer: User
) -> None:
    """On the production settings (DEBUG off, the CSP): the Members screen from Settings' own
    navigation, a role changed and a member removed with htmx (after a confirmation), and the
    last admin's refusal in place."""
    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/")
    page.locator("a#settings-nav-members").click()
    page.wait_for_url(f"{production.url}/w/acme/support/settings/members/")
    page.evaluate("window.membersMarker = 'same page'")

    dave = page.locator('tr.member[data-username="dave"]')
    dave.locator("select[name=role]").select_option("approver")
    dave.locator("button.change-role").click()
    expect(page.locator("#members-done")).to_have_text("dave is approver now.")
    expect(page.locator('tr.member[data-username="dave"]')).to_have_attribute("data-role", "approver")

    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('tr.member[data-username="carol"] button.remove-member').click()
    expect(page.locator('tr.member[data-username="carol"]')).to_have_count(0)
    expect(page.locator("#members-count")).to_have_text("2")

    # alice is the only admin: nothing offered on her row. Posted anyway (another tab's form
    # from before), the refusal says why in place.
    expect(page.locator('tr.member[data-username="alice"] .last-admin')).to_be_visible()
    dave = page.locator('tr.member[data-username="dave"]')
    dave.locator("input[name=username]").first.evaluate("input => input.value = 'alice'")
    dave.locator("button.change-role").click()
    expect(page.locator("#members-refused")).to_contain_text("alice is the last admin of acme")
    assert page.evaluate("window.membersMarker") == "same page"
    assert Membership.objects.get(user=admin).role == "admin"
    assert Membership.objects.get(user=viewer).role == "approver"
    assert not Membership.objects.filter(user=operator).exists()
    assert AuditEntry.objects.filter(action__in=["member.changed", "member.removed"], actor="alice").count() == 2


def test_an_admin_adds_a_new_user_who_signs_in_with_the_password_shown_once(
    page: Page, open_context: Any, production: Daphne, workspace: Workspace, admin: User, outsider: User
) -> None:
    """On the production settings (DEBUG off, the CSP): a refusal by the field with what was typed
    kept, a new user made with the password shown once, who signs in with it in another browser,
    and an existing user (another tenant's admin) added keeping their own password."""
    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/members/")
    form = page.locator("form#member-add-form")
    form.locator("[name=username]").fill("olga")  # a user already: not a new one
    form.locator("[name=role]").select_option("operator")
    form.locator("button#member-add").click()
    expect(page.locator("#member-username-error")).to_contain_text("A user called olga exists already")
    expect(page.locator("#member-username")).to_have_value("olga")
    expect(page.locator("#member-role")).to_have_value("operator")

    page.locator("#member-username").fill("erin")
    page.locator("button#member-add").click()
    expect(page.locator("#new-member")).to_contain_text("erin made and added as operator.")
    expect(page.locator("#new-member")).to_contain_text("it is not stored and will not be shown again")
    expect(page.locator('tr.member[data-username="erin"]')).to_have_attribute("data-role", "operator")
    password = page.locator("#new-member-password").input_value()
    page.goto(f"{production.url}/w/acme/support/settings/members/")
    expect(page.locator("#new-member")).to_have_count(0)  # shown once

    erin = open_context().new_page()
    erin.goto(f"{production.url}/accounts/login/")
    erin.fill("input[name=username]", "erin")
    erin.fill("input[name=password]", password)
    erin.click("form:has(input[name=password]) [type=submit]")
    erin.wait_for_url(f"{production.url}/w/acme/support/")

    page.locator("#member-username").fill("olga")
    page.locator("input[name=account][value=existing]").check()
    page.locator("button#member-add").click()
    expect(page.locator("#new-member")).to_contain_text("olga added as viewer. They sign in with their own password.")
    expect(page.locator("#new-member-password")).to_have_count(0)
    assert Membership.objects.get(user=outsider, tenant=workspace.tenant).role == "viewer"
    assert list(
        AuditEntry.objects.filter(action="member.added", actor="alice").order_by("pk").values_list("target", "details")
    ) == [("user:erin", {"role": "operator"}), ("user:olga", {"role": "viewer"})]


def test_an_admin_resets_a_members_password_in_place_and_their_browser_is_signed_out(
    page: Page, open_context: Any, production: Daphne, workspace: Workspace, admin: User, viewer: User
) -> None:
    """On the production settings (DEBUG off, the CSP): dave is signed in in his own browser; alice
    resets his password (after a confirmation) and the new one shows in place, once; dave's next
    page is the login, where the new password lets him in."""
    dave = open_context().new_page()
    log_in(dave, production, viewer)
    dave.goto(f"{production.url}/w/acme/support/")
    expect(dave.locator("#nav-runs")).to_be_visible()

    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/members/")
    page.evaluate("window.membersMarker = 'same page'")
    expect(page.locator('tr.member[data-username="alice"] .member-password a')).to_have_text("Change your password")
    page.once("dialog", lambda dialog: dialog.accept())
    page.locator('tr.member[data-username="dave"] button.reset-password').click()
    expect(page.locator("#password-reset")).to_contain_text("dave has a new password.")
    expect(page.locator("#password-reset")).to_contain_text("1 session ended")
    password = page.locator("#reset-password-value").input_value()
    assert page.evaluate("window.membersMarker") == "same page"

    dave.goto(f"{production.url}/w/acme/support/")
    dave.wait_for_url(f"{production.url}/accounts/login/?next=/w/acme/support/")
    dave.fill("input[name=username]", "dave")
    dave.fill("input[name=password]", password)
    dave.click("form:has(input[name=password]) [type=submit]")
    dave.wait_for_url(f"{production.url}/w/acme/support/")
    assert AuditEntry.objects.filter(action="member.password_reset", actor="alice", target="user:dave").count() == 1


def test_an_action_address_opened_as_a_page_is_the_405_page_with_a_way_back(
    page: Page, production: Daphne, workspace: Workspace, admin: User
) -> None:
    """A form's address typed in the address bar (DEBUG off, the CSP): the console's page saying
    what it is, whose way back leads to the workspace."""
    log_in(page, production, admin)
    response = page.goto(f"{production.url}/w/acme/support/settings/members/add/")
    assert response is not None and response.status == 405 and response.headers["allow"] == "POST"
    expect(page.locator("h1#error-title")).to_have_text("Method not allowed")
    expect(page.locator("#error-message")).to_contain_text("not a page to open")
    page.locator("a#error-back").click()
    page.wait_for_url(f"{production.url}/w/acme/support/")


def test_an_admin_overrides_a_price_with_the_reason_next_to_the_field(
    page: Page, production: Daphne, workspace: Workspace, admin: User
) -> None:
    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/")
    page.locator("a#settings-nav-prices").click()
    page.wait_for_url(f"{production.url}/w/acme/support/settings/prices/")

    form = page.locator("form#price-override-form")
    form.locator("[name=key]").fill("acme/house-model")
    form.locator("[name=input]").fill("0.8")
    form.locator("[name=reason]").fill("our own model")
    form.locator("#price-save").click()
    expect(page.locator("#price-output-error")).to_contain_text("adds a model, so needs input and output")
    expect(page.locator("#price-output")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#price-input")).to_have_value("0.8")

    page.locator("#price-output").fill("3.2")
    page.locator("#price-save").click()
    expect(page.locator("#prices-changed")).to_contain_text("reprice this workspace's recorded costs")
    expect(page.locator('tr.price-override[data-model="acme/house-model"]')).to_contain_text("3.2")
    assert Workspace.objects.get(pk=workspace.pk).price_overrides == {"acme/house-model": {"input": 0.8, "output": 3.2}}


def test_an_admin_edits_a_price_and_the_worker_reprices_the_recorded_costs(
    page: Page, production: Daphne, workspace: Workspace, admin: User, worker: list[Worker], tmp_path: Path
) -> None:
    """On the production settings (DEBUG off, the CSP): an override saved, *Reprice this
    workspace's recorded costs* clicked, the real worker process (as `make run` starts it) reprices
    the run, and the page, reloaded, says it is done and the run's cost is the new one."""
    data.priced_run(workspace, "run_priced", "openai", "gpt-4o")  # 1,200 in, 300 out
    assert Run.objects.get(run_id="run_priced").cost_usd == Decimal("0.006")
    log_in(page, production, admin)
    page.goto(f"{production.url}/w/acme/support/settings/prices/")
    form = page.locator("form#price-override-form")
    form.locator("[name=key]").fill("openai/gpt-4o")
    form.locator("[name=input]").fill("1")
    form.locator("[name=output]").fill("1")
    form.locator("[name=reason]").fill("negotiated")
    form.locator("#price-save").click()
    expect(page.locator("#prices-changed")).to_be_visible()

    page.locator("#reprice-button").click()
    expect(page.locator("#reprice-state")).to_contain_text("Reprice queued")
    expect(page.locator("#reprice-button")).to_have_count(0)
    worker.append(Worker(tmp_path / "worker.log"))
    for _ in range(150):  # a reload until the worker is done
        if page.locator('#reprice-state[data-status="done"]').count():
            break
        page.wait_for_timeout(200)
        page.reload()
    expect(page.locator("#reprice-counts")).to_have_text("1 run, 1 with new prices, 1 cost entry changed")
    assert Run.objects.get(run_id="run_priced").cost_usd == Decimal("0.0015")
    page.goto(f"{production.url}/w/acme/support/runs/run_priced/")
    expect(page.locator("body")).to_contain_text("$0.0015")
    assert AuditEntry.objects.filter(action="prices.repriced", details__entriesChanged=1).exists()
