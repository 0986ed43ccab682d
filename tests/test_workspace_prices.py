"""The Prices screen of a workspace's Settings (admins only): the shipped price table with the
workspace's overrides laid over it; an override set, changed and removed, checked as the fold
checks them (PriceTable.with_overrides, under our rules and Little Workflow's) with each reason
next to its field, audited `price_overrides.changed`; and the page says that recorded costs wait
for `ledger reprice`."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from ledger.fold.pricing import load_default_prices
from ledger.models import AuditEntry, Run, Workspace
from tests.browser import data

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/prices/"
SET = PAGE + "set/"
REMOVE = PAGE + "remove/"


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _overrides() -> dict[str, Any]:
    return Workspace.objects.get(tenant__slug="acme", slug="support").price_overrides


def test_an_admin_sees_the_shipped_rates_in_force(admin: Any) -> None:
    html = as_user(admin).get(PAGE).content.decode()
    shipped = load_default_prices()
    for key in shipped.rates:
        assert f'<tr class="price" data-model="{key}">' in html
    row = html.split('data-model="openai/gpt-4o">')[1].split("</tr>")[0]
    assert ">2.5<" in row and ">1.25<" in row and ">10<" in row and "the table" in row
    assert 'id="no-overrides"' in html and shipped.version in html
    assert 'id="settings-nav-prices" href="/w/acme/support/settings/prices/" aria-current="page"' in html


def test_the_screen_is_for_admins_and_a_404_for_another_tenant(
    admin: Any, approver: Any, viewer: Any, outsider: Any, client: Client
) -> None:
    override = {"key": "openai/gpt-4o", "output": "5"}
    for member in (approver, viewer):
        c = as_user(member)
        refused = c.get(PAGE)
        assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.content.decode()
        assert c.post(SET, override).status_code == 403
        assert c.post(REMOVE, {"key": "openai/gpt-4o"}).status_code == 403
    c = as_user(outsider)
    assert c.get(PAGE).status_code == 404
    assert c.post(SET, override).status_code == 404
    assert c.post(REMOVE, {"key": "openai/gpt-4o"}).status_code == 404
    assert client.get(PAGE).status_code == 302
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()


def test_an_override_is_saved_audited_and_the_page_says_what_reprices_the_past(admin: Any) -> None:
    c = as_user(admin)
    saved = c.post(SET, {"key": " OpenAI/GPT-4o ", "output": "5", "reason": "our negotiated rate"})
    assert saved.status_code == 302
    assert saved["Location"] == PAGE + "?saved=openai%2Fgpt-4o#prices-changed"
    assert _overrides() == {"openai/gpt-4o": {"output": 5}}
    entry = AuditEntry.objects.get(action="price_overrides.changed")
    assert (entry.actor, entry.target, entry.reason, entry.details) == (
        "alice",
        "workspace:acme/support",
        "our negotiated rate",
        {"model": "openai/gpt-4o", "before": None, "after": {"output": 5}},
    )
    html = c.get(saved["Location"]).content.decode()
    assert 'id="prices-changed"' in html and "manage.py ledger reprice" in html
    row = html.split('<tr class="price" data-model="openai/gpt-4o" data-overridden="1">')[1].split("</tr>")[0]
    assert ">2.5<" in row and ">1.25<" in row and ">5<" in row and "overridden here" in row
    assert "+ws." in html.split('id="price-table-version">')[1].split("<")[0]

    # Edit: the form comes back filled with the override as stored; a new rate replaces it.
    edit = c.get(PAGE + "?model=openai/gpt-4o").content.decode()
    assert 'name="key" value="openai/gpt-4o"' in edit and 'name="output" value="5"' in edit
    c.post(SET, {"key": "openai/gpt-4o", "output": "4.5", "no_cache_rate": "1"})
    assert _overrides() == {"openai/gpt-4o": {"output": 4.5, "cachedInput": None}}
    # The same again changes and audits nothing.
    c.post(SET, {"key": "openai/gpt-4o", "output": "4.50", "no_cache_rate": "1"})
    assert AuditEntry.objects.filter(action="price_overrides.changed").count() == 2

    removed = c.post(REMOVE, {"key": "openai/gpt-4o"})
    assert removed.status_code == 302 and "removed=openai%2Fgpt-4o" in removed["Location"]
    assert _overrides() == {}
    last = AuditEntry.objects.filter(action="price_overrides.changed").order_by("-at", "-pk").first()
    assert last is not None and last.details["after"] is None
    assert "was removed" in c.get(removed["Location"]).content.decode()


def test_a_model_the_table_does_not_know_is_priced_from_then_on(admin: Any, workspace: Workspace) -> None:
    data.priced_run(workspace, "run_before", "acme", "house-model")
    assert Run.objects.get(run_id="run_before").cost_usd is None
    c = as_user(admin)
    assert c.post(SET, {"key": "acme/house-model", "input": "1", "output": "2"}).status_code == 302
    workspace.refresh_from_db()  # as the next request reads it
    data.priced_run(workspace, "run_after", "acme", "house-model")
    assert Run.objects.get(run_id="run_after").cost_usd == Decimal("0.0018")  # 1,200 in at $1/M, 300 out at $2/M
    assert Run.objects.get(run_id="run_before").cost_usd is None  # until ledger reprice
    html = c.get(PAGE).content.decode()
    assert "this workspace only" in html and "not priced by the table" in html


@pytest.mark.parametrize(
    "form, field, message",
    [
        ({"key": "gpt-4o", "input": "1", "output": "1"}, "key", "is not &#x27;provider/modelId&#x27;"),
        ({"key": "", "output": "1"}, "key", "Name the model as provider/modelId"),
        ({"key": "acme/new", "input": "1"}, "output", "adds a model, so needs input and output"),
        ({"key": "openai/gpt-4o", "input": "cheap"}, "input", "must be a number, got &#x27;cheap&#x27;"),
        ({"key": "openai/gpt-4o", "output": "-1"}, "output", "must be finite and not negative"),
        ({"key": "openai/gpt-4o", "input": "1e999"}, "input", "must be finite and not negative"),
        ({"key": "openai/gpt-4o", "cachedInput": "1", "no_cache_rate": "1"}, "cachedInput", "not both"),
        ({"key": "openai/gpt-4o"}, "entry", "give at least one rate"),
        # Known to our table, not to Little Workflow's registry, which prices this workspace's imported runs.
        ({"key": "openai/gpt-4o-2024-05-13", "output": "20"}, "input", "not in Little Workflow&#x27;s registry"),
    ],
)
def test_a_refused_override_says_why_next_to_its_field_and_keeps_what_was_typed(
    admin: Any, form: dict[str, str], field: str, message: str
) -> None:
    answer = as_user(admin).post(SET, {**form, "reason": "trying"})
    assert answer.status_code == 400
    html = answer.content.decode()
    error_id = "price-entry-error" if field == "entry" else f"price-{field}-error"
    assert message in html.split(f'id="{error_id}">')[1].split("</")[0]
    assert 'name="reason" value="trying"' in html
    for name, value in form.items():
        if name != "no_cache_rate":
            assert f'name="{name}" value="{value}"' in html
    assert _overrides() == {} and not AuditEntry.objects.filter(action="price_overrides.changed").exists()


def test_overrides_stored_before_they_were_checked_are_shown_and_can_be_removed(
    admin: Any, workspace: Workspace
) -> None:
    Workspace.objects.filter(pk=workspace.pk).update(price_overrides={"openai/gpt-x": {"inputPerMillion": "1.5"}})
    c = as_user(admin)
    page = c.get(PAGE)
    assert page.status_code == 200 and 'id="prices-problem"' in page.content.decode()
    assert c.post(REMOVE, {"key": "openai/gpt-x"}).status_code == 302
    assert _overrides() == {}
    assert 'id="prices-problem"' not in c.get(PAGE).content.decode()
