"""The Members screen of a workspace's Settings (admins only): the tenant's members with their role
and when they were added; a role changed and a member removed through the command line's own
services (ledger/tenancy/services.py), audited alike; the tenant's last admin neither removed nor
demoted, here or on the command line."""

from __future__ import annotations

import io
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.models import AuditEntry, Membership
from ledger.tenancy.services import LastAdmin, change_role, remove_member

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/members/"
ROLE = PAGE + "role/"
REMOVE = PAGE + "remove/"
HTMX = {"HTTP_HX_REQUEST": "true"}


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _role(username: str) -> str | None:
    return (
        Membership.objects.filter(user__username=username, tenant__slug="acme").values_list("role", flat=True).first()
    )


def test_an_admin_sees_the_tenants_members_with_role_and_when_they_were_added(
    admin: Any, approver: Any, operator: Any, viewer: Any, outsider: Any
) -> None:
    page = as_user(admin).get(PAGE)
    assert page.status_code == 200
    html = page.content.decode()
    for user, role in ((admin, "admin"), (approver, "approver"), (operator, "operator"), (viewer, "viewer")):
        assert f'data-username="{user.username}" data-role="{role}"' in html
    assert 'data-username="olga"' not in html  # another tenant's member
    added = AuditEntry.objects.get(action="member.added", target="user:dave").at
    assert f'datetime="{added.strftime("%Y-%m-%dT%H:%M:%S")}' in html  # from the member.added entry
    assert 'id="settings-nav-members" href="/w/acme/support/settings/members/" aria-current="page"' in html
    assert 'id="nav-settings"' in html and "ledger create-user NAME --tenant acme" in html
    # alice is the only admin: her row offers neither a role change nor a removal.
    alice = html.split('data-username="alice"')[1].split("</tr>")[0]
    assert "The only admin" in alice and "change-role" not in alice and "remove-member" not in alice
    assert "change-role" in html.split('data-username="dave"')[1].split("</tr>")[0]


def test_the_screen_is_for_admins_and_a_404_for_another_tenant(
    admin: Any, approver: Any, viewer: Any, outsider: Any, client: Client
) -> None:
    for member in (approver, viewer):
        c = as_user(member)
        refused = c.get(PAGE)
        assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.content.decode()
        assert c.post(ROLE, {"username": "dave", "role": "admin"}).status_code == 403
        assert c.post(REMOVE, {"username": "alice"}).status_code == 403
        assert "settings/members/" not in c.get("/w/acme/support/").content.decode()
    c = as_user(outsider)
    assert c.get(PAGE).status_code == 404
    assert c.post(ROLE, {"username": "dave", "role": "viewer"}).status_code == 404
    assert c.post(REMOVE, {"username": "dave"}).status_code == 404
    # An admin naming another tenant's member: not found, like a name nobody has.
    assert as_user(admin).post(REMOVE, {"username": "olga"}).status_code == 404
    assert client.get(PAGE).status_code == 302  # anonymous: to the login page
    assert (_role("dave"), _role("alice"), _role("bob")) == ("viewer", "admin", "approver")
    assert not AuditEntry.objects.filter(action__in=["member.changed", "member.removed"]).exists()


def test_changing_a_role_with_htmx_answers_the_section_and_audits_as_the_command_line(admin: Any, viewer: Any) -> None:
    c = as_user(admin)
    done = c.post(ROLE, {"username": "dave", "role": "operator"}, **HTMX)
    assert done.status_code == 200
    html = done.content.decode()
    assert html.lstrip().startswith('<section id="members"') and "<html" not in html
    assert "dave is operator now." in html and 'data-username="dave" data-role="operator"' in html
    assert _role("dave") == "operator"
    entry = AuditEntry.objects.get(action="member.changed")
    assert (entry.actor, entry.actor_user_id, entry.target, entry.details) == (
        "alice",
        admin.pk,
        "user:dave",
        {"role": "operator", "previousRole": "viewer"},
    )
    # The same role again changes and audits nothing; without htmx the form redirects back.
    again = c.post(ROLE, {"username": "dave", "role": "operator"})
    assert again.status_code == 302 and again["Location"] == PAGE + "?saved=1"
    assert AuditEntry.objects.filter(action="member.changed").count() == 1
    assert c.post(ROLE, {"username": "dave", "role": "owner"}, **HTMX).status_code == 422
    assert _role("dave") == "operator"


def test_removing_a_member_audits_and_ends_their_access(admin: Any, operator: Any) -> None:
    c = as_user(admin)
    assert c.post(REMOVE, {"username": "carol"}).status_code == 302
    assert _role("carol") is None
    entry = AuditEntry.objects.get(action="member.removed")
    assert (entry.actor, entry.target, entry.details) == ("alice", "user:carol", {"role": "operator"})
    assert as_user(operator).get("/w/acme/support/").status_code == 404
    assert 'data-username="carol"' not in c.get(PAGE).content.decode()


def test_the_command_line_removes_a_member_as_the_screen_does(admin: Any, operator: Any, outsider: Any) -> None:
    out = io.StringIO()
    call_command("ledger", "remove-member", "carol", "--tenant", "acme", stdout=out)
    assert out.getvalue().strip() == "carol is no longer a member of acme" and _role("carol") is None
    entry = AuditEntry.objects.get(action="member.removed")
    assert (entry.actor, entry.target, entry.details) == ("system:cli", "user:carol", {"role": "operator"})
    assert as_user(operator).get("/w/acme/support/").status_code == 404
    for name in ("carol", "olga", "nobody"):  # no longer, another tenant's, no one: alike
        with pytest.raises(CommandError, match=f"{name} is not a member of acme"):
            call_command("ledger", "remove-member", name, "--tenant", "acme", stdout=io.StringIO())


def test_the_last_admin_is_neither_removed_nor_demoted_here_or_on_the_command_line(admin: Any, approver: Any) -> None:
    c = as_user(admin)
    for url, data in ((ROLE, {"username": "alice", "role": "approver"}), (REMOVE, {"username": "alice"})):
        refused = c.post(url, data, **HTMX)
        assert refused.status_code == 422
        assert "alice is the last admin of acme" in refused.content.decode()
        page = c.post(url, data)
        assert page.status_code == 409 and 'id="members-refused"' in page.content.decode()
    with pytest.raises(LastAdmin):
        change_role(username="alice", tenant="acme", role="viewer")
    with pytest.raises(LastAdmin):
        remove_member(username="alice", tenant="acme")
    with pytest.raises(CommandError, match="last admin"):
        call_command("ledger", "create-user", "alice", "--tenant", "acme", "--role", "viewer", stdout=io.StringIO())
    with pytest.raises(CommandError, match="last admin"):
        call_command("ledger", "remove-member", "alice", "--tenant", "acme", stdout=io.StringIO())
    assert _role("alice") == "admin"
    assert not AuditEntry.objects.filter(action__in=["member.changed", "member.removed"]).exists()

    # With a second admin, the first may step down: this page is then no longer hers.
    change_role(username="bob", tenant="acme", role="admin")
    away = c.post(ROLE, {"username": "alice", "role": "operator"}, **HTMX)
    assert away.status_code == 200 and away["HX-Redirect"] == "/w/acme/support/"
    assert _role("alice") == "operator"
    assert c.get(PAGE).status_code == 403
