"""The workspace settings page (admins only): retention and API keys, listed by prefix, revocable,
their last use noted at most once a minute; `ledger keys list|revoke` on the command line."""

from __future__ import annotations

import io
import re
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger import audit
from ledger.models import ApiKey, AuditEntry, Workspace
from ledger.tenancy.services import authenticate_key, create_key
from tests.conftest import FakeClock

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/"
RETENTION = PAGE + "retention/"


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def keys(workspace: Workspace, other_workspace: Workspace) -> dict[str, tuple[ApiKey, str]]:
    return {
        "ci": create_key(workspace=workspace, scopes=["ingest", "read"], name="ci"),
        "old": create_key(workspace=workspace, scopes=["read"], name="old"),
        "globex": create_key(workspace=other_workspace, scopes=["read"], name="theirs"),
    }


def test_admins_see_keys_by_prefix_never_their_secrets(admin: Any, keys: dict[str, tuple[ApiKey, str]]) -> None:
    page = as_user(admin).get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    for name in ("ci", "old"):
        key, secret = keys[name]
        assert f'data-prefix="{key.prefix}"' in html
        assert secret not in html and key.secret_hash not in html
    assert keys["globex"][0].prefix not in html  # another workspace's key is not listed
    assert "ingest, read" in html and "never" in html
    assert 'id="nav-settings"' in html


def test_the_page_is_for_admins_and_a_404_for_another_tenant(
    admin: Any, approver: Any, viewer: Any, outsider: Any, keys: Any, client: Client
) -> None:
    ci = keys["ci"][0]
    revoke = f"{PAGE}keys/{ci.prefix}/revoke/"
    for member in (approver, viewer):
        c = as_user(member)
        assert c.get(PAGE).status_code == 403
        assert c.post(RETENTION, {"days": "7", "reason": "x"}).status_code == 403
        assert c.post(revoke).status_code == 403
        assert 'id="nav-settings"' not in c.get("/w/acme/support/").content.decode()
    c = as_user(outsider)
    assert c.get(PAGE).status_code == 404
    assert c.post(RETENTION, {"days": "7", "reason": "x"}).status_code == 404
    assert c.post(revoke).status_code == 404
    assert client.get(PAGE).status_code == 302  # anonymous: to the login page
    ci.refresh_from_db()
    assert ci.revoked_at is None and Workspace.objects.get(slug="support").retention_days is None


def test_setting_retention_with_htmx_answers_the_fragment_and_audits(admin: Any, workspace: Workspace) -> None:
    c = as_user(admin)
    done = c.post(RETENTION, {"days": "30", "reason": "a month is enough"}, HTTP_HX_REQUEST="true")
    assert done.status_code == 200
    html = done.content.decode()
    assert html.lstrip().startswith('<section id="retention"') and "<html" not in html
    assert "30 days" in html and "Saved" in html
    workspace.refresh_from_db()
    assert workspace.retention_days == 30
    entry = AuditEntry.objects.get(action="retention.changed")
    assert (entry.actor, entry.reason, entry.details) == (
        "alice",
        "a month is enough",
        {"oldDays": None, "newDays": 30},
    )

    # Emptying it keeps runs forever again; without htmx the form redirects back to the page.
    back = c.post(RETENTION, {"days": "", "reason": "keep everything"})
    assert back.status_code == 302 and back["Location"].endswith(PAGE + "#retention")
    workspace.refresh_from_db()
    assert workspace.retention_days is None
    assert "kept forever" in c.get(PAGE).content.decode()


@pytest.mark.parametrize(
    "days, reason, message",
    [
        ("0", "r", "1 to 36500 days"),
        ("-3", "r", "whole number of days"),
        ("ten", "r", "whole number of days"),
        ("99999999999999999999", "r", "1 to 36500 days"),
        ("²", "r", "whole number of days"),
        ("7", "", "say why"),
    ],
)
def test_bad_retention_is_a_400_with_the_form_and_nothing_changes(
    admin: Any, workspace: Workspace, days: str, reason: str, message: str
) -> None:
    c = as_user(admin)
    for extra, status in (({}, 400), ({"HTTP_HX_REQUEST": "true"}, 422)):
        answer = c.post(RETENTION, {"days": days, "reason": reason}, **extra)
        assert answer.status_code == status
        assert message in answer.content.decode()
    workspace.refresh_from_db()
    assert workspace.retention_days is None
    assert not AuditEntry.objects.filter(action="retention.changed").exists()


def test_an_admin_revokes_a_key_and_it_stops_working(admin: Any, keys: dict[str, tuple[ApiKey, str]]) -> None:
    key, secret = keys["ci"]
    assert authenticate_key(secret) is not None
    row = as_user(admin).post(f"{PAGE}keys/{key.prefix}/revoke/", HTTP_HX_REQUEST="true")
    assert row.status_code == 200
    html = row.content.decode()
    assert html.startswith("<tr") and "revoked" in html and "Revoke</button>" not in html
    assert authenticate_key(secret) is None
    entry = AuditEntry.objects.get(action="api_key.revoked")
    assert (entry.actor, entry.target) == ("alice", f"key:{key.prefix}")
    # Again: nothing changes and nothing more is audited.
    assert as_user(admin).post(f"{PAGE}keys/{key.prefix}/revoke/").status_code == 302
    assert AuditEntry.objects.filter(action="api_key.revoked").count() == 1


def test_an_admin_cannot_revoke_another_workspaces_key_through_their_own(admin: Any, keys: Any) -> None:
    theirs = keys["globex"][0]
    assert as_user(admin).post(f"{PAGE}keys/{theirs.prefix}/revoke/").status_code == 404
    assert as_user(admin).post(f"{PAGE}keys/nope/revoke/").status_code == 404
    theirs.refresh_from_db()
    assert theirs.revoked_at is None


def test_last_use_is_written_at_most_once_a_minute(keys: dict[str, tuple[ApiKey, str]], clock: FakeClock) -> None:
    key, secret = keys["ci"]
    with CaptureQueriesContext(connection) as first:
        authenticate_key(secret)
    stamped = ApiKey.objects.get(pk=key.pk).last_used_at
    assert stamped == clock.moment
    assert any(q["sql"].startswith("UPDATE") for q in first.captured_queries)

    clock.advance(30)
    with CaptureQueriesContext(connection) as within:
        for _ in range(5):
            assert authenticate_key(secret) is not None
    assert not any(q["sql"].startswith("UPDATE") for q in within.captured_queries)
    assert ApiKey.objects.get(pk=key.pk).last_used_at == stamped

    clock.advance(31)
    authenticate_key(secret)
    assert ApiKey.objects.get(pk=key.pk).last_used_at == stamped + timedelta(seconds=61)


def test_an_api_request_notes_the_keys_last_use(keys: dict[str, tuple[ApiKey, str]], client: Client) -> None:
    key, secret = keys["ci"]
    answer = client.get("/api/v1/runs", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert answer.status_code == 200
    assert ApiKey.objects.get(pk=key.pk).last_used_at is not None
    assert ApiKey.objects.get(pk=keys["old"][0].pk).last_used_at is None


def cli(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger", *args, stdout=out)
    return out.getvalue()


def test_keys_list_and_revoke_on_the_command_line(keys: dict[str, tuple[ApiKey, str]]) -> None:
    ci, secret = keys["ci"]
    listing = cli("keys", "list", "--workspace", "acme/support")
    lines = listing.splitlines()
    assert lines[0].startswith("PREFIX\tWORKSPACE\tNAME")
    assert {line.split("\t")[0] for line in lines[1:]} == {ci.prefix, keys["old"][0].prefix}
    assert secret not in listing
    assert f"{ci.prefix}\tacme/support\tci\tingest,read\t" in listing

    assert cli("keys", "revoke", ci.prefix, "--reason", "leaked in a log") == f"revoked {ci.prefix} (acme/support)\n"
    assert authenticate_key(secret) is None
    entry = audit.entries(tenant=ci.workspace.tenant, action="api_key.revoked").get()
    assert (entry.actor, entry.reason) == ("system:cli", "leaked in a log")
    assert "already revoked" in cli("keys", "revoke", ci.prefix)
    assert ci.prefix not in cli("keys", "list")
    assert ci.prefix in cli("keys", "list", "--all")
    with pytest.raises(CommandError, match="no API key"):
        cli("keys", "revoke", "nope")


# --- making keys in the console -----------------------------------------------------------------

CREATE = PAGE + "keys/"


def test_an_admin_makes_a_key_sees_the_secret_once_and_it_works(admin: Any, workspace: Workspace) -> None:
    c = as_user(admin)
    response = c.post(CREATE, {"name": "nightly", "scopes": ["read", "ingest"]})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    html = response.content.decode()
    secret = re.search(r'id="new-key-secret" class="mono secret" readonly value="([^"]+)"', html).group(1)
    key = authenticate_key(secret)
    assert key is not None and key.workspace == workspace and key.name == "nightly"
    assert key.scopes == ["ingest", "read"]
    assert f'data-prefix="{key.prefix}"' in html  # listed at once
    assert secret not in c.get(PAGE).content.decode()  # and never shown again
    entry = AuditEntry.objects.get(action=audit.Action.API_KEY_CREATED)
    assert entry.actor == admin.get_username() and entry.details == {"name": "nightly", "scopes": ["ingest", "read"]}
    # The key reads through the API.
    api = Client(headers={"Authorization": f"Bearer {secret}"})
    assert api.get("/api/v1/runs").status_code == 200


def test_a_key_without_a_scope_is_refused_keeping_what_was_typed(admin: Any) -> None:
    response = as_user(admin).post(CREATE, {"name": "typed-name"})
    assert response.status_code == 400
    html = response.content.decode()
    form = re.search(r'<form id="key-form".*?</form>', html, re.S).group(0)
    assert 'name="name" value="typed-name"' in form
    assert re.search(r'class="field field-scopes invalid".*Tick at least one scope', form, re.S)
    assert 'aria-describedby="key-scopes-error"' in form
    assert ApiKey.objects.count() == 0 and not AuditEntry.objects.filter(action=audit.Action.API_KEY_CREATED).exists()
    too_long = as_user(admin).post(CREATE, {"name": "x" * 201, "scopes": ["read"]})
    assert too_long.status_code == 400 and "at most 200 characters" in too_long.content.decode()
    assert ApiKey.objects.count() == 0


@pytest.mark.parametrize(
    "name", ["invoice\u202egpj.exe", "ci\u2066night\u2069", "zero\u200bwidth", "tab\tbed", "bell\x07"]
)
def test_a_key_name_with_control_or_bidi_characters_is_refused_by_its_field(
    admin: Any, workspace: Workspace, name: str
) -> None:
    """A bidi override makes "invoice<U+202E>gpj.exe" read "invoiceexe.jpg" in the keys table: such
    a name is refused where keys are made, the console's form (by its field) and the command line."""
    response = as_user(admin).post(CREATE, {"name": name, "scopes": ["read"]})
    assert response.status_code == 400
    form = re.search(r'<form id="key-form".*?</form>', response.content.decode(), re.S).group(0)
    error = re.search(r'class="field field-key-name invalid".*?id="key-name-error">([^<]*)<', form, re.S)
    assert error and "control or invisible formatting characters (U+" in error.group(1)
    assert ApiKey.objects.count() == 0 and not AuditEntry.objects.filter(action=audit.Action.API_KEY_CREATED).exists()
    with pytest.raises(CommandError, match="control or invisible formatting characters"):
        call_command("ledger", "create-key", "--workspace", "acme/support", "--scopes", "read", "--name", name)
    assert ApiKey.objects.count() == 0


def test_a_key_name_stored_before_the_check_shows_its_hidden_characters(
    admin: Any, keys: dict[str, tuple[ApiKey, str]]
) -> None:
    ApiKey.objects.filter(pk=keys["ci"][0].pk).update(name="invoice\u202egpj.exe")
    html = as_user(admin).get(PAGE).content.decode()
    assert "\u202e" not in html
    assert 'invoice<span class="hidden-char">U+202E</span>gpj.exe' in html


def test_making_keys_is_for_admins_and_a_404_for_another_tenant(
    approver: Any, viewer: Any, outsider: Any, client: Client
) -> None:
    for member in (approver, viewer):
        refused = as_user(member).post(CREATE, {"name": "mine", "scopes": ["read"]})
        assert refused.status_code == 403 and 'class="error-page"' in refused.content.decode()
    assert as_user(outsider).post(CREATE, {"name": "mine", "scopes": ["read"]}).status_code == 404
    assert client.post(CREATE, {"name": "mine", "scopes": ["read"]}).status_code == 302
    assert ApiKey.objects.count() == 0
