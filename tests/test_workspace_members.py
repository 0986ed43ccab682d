"""The Members screen of a workspace's Settings (admins only): the tenant's members with their role
and when they were added; a member added (a new user with a one-time password shown once, or an
existing user), a role changed and a member removed through the command line's own services
(ledger/tenancy/services.py), audited alike; the tenant's last admin neither removed nor demoted,
here or on the command line."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.models import AuditEntry, Membership
from ledger.tenancy.services import LastAdmin, change_role, remove_member

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/members/"
ROLE = PAGE + "role/"
REMOVE = PAGE + "remove/"
ADD = PAGE + "add/"
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
    assert 'id="nav-settings"' in html and 'id="member-add-form"' in html
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
        added = c.post(ADD, {"username": "mallory", "role": "admin", "account": "new"})
        assert added.status_code == 403 and 'id="error-title">Not allowed<' in added.content.decode()
        assert "settings/members/" not in c.get("/w/acme/support/").content.decode()
    c = as_user(outsider)
    assert c.get(PAGE).status_code == 404
    assert c.post(ADD, {"username": "mallory", "role": "admin", "account": "new"}).status_code == 404
    assert c.post(ADD, {"username": "olga", "role": "admin", "account": "existing"}).status_code == 404
    assert c.post(ROLE, {"username": "dave", "role": "viewer"}).status_code == 404
    assert c.post(REMOVE, {"username": "dave"}).status_code == 404
    # An admin naming another tenant's member: not found, like a name nobody has.
    assert as_user(admin).post(REMOVE, {"username": "olga"}).status_code == 404
    assert client.get(PAGE).status_code == 302  # anonymous: to the login page
    assert client.post(ADD, {"username": "mallory", "role": "admin", "account": "new"}).status_code == 302
    assert (_role("dave"), _role("alice"), _role("bob"), _role("olga")) == ("viewer", "admin", "approver", None)
    assert not AuditEntry.objects.filter(action__in=["member.changed", "member.removed"]).exists()
    assert not User.objects.filter(username="mallory").exists()


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


def test_an_admin_whose_account_is_disabled_does_not_count(admin: Any, approver: Any) -> None:
    """bob is an admin too, but his account is disabled (`ledger disable-user`): he cannot sign in,
    so alice is the last admin who can, and is kept as the last admin is, in the console, the
    services and the commands (docs/operations.md § Members). bob himself is kept too once no
    admin of acme has an enabled account."""
    change_role(username="bob", tenant="acme", role="admin")
    call_command("ledger", "disable-user", "bob", stdout=io.StringIO())
    c = as_user(admin)
    html = c.get(PAGE).content.decode()
    alice = html.split('data-username="alice"')[1].split("</tr>")[0]
    assert "The only admin with an enabled account" in alice and "change-role" not in alice
    bob = html.split('data-username="bob"')[1].split("</tr>")[0]
    assert "change-role" in bob and "remove-member" in bob
    for url, data in ((ROLE, {"username": "alice", "role": "approver"}), (REMOVE, {"username": "alice"})):
        refused = c.post(url, data, **HTMX)
        assert refused.status_code == 422
        assert "alice is the last admin of acme with an enabled account" in refused.content.decode()
    with pytest.raises(LastAdmin):
        change_role(username="alice", tenant="acme", role="viewer")
    with pytest.raises(LastAdmin):
        remove_member(username="alice", tenant="acme")
    with pytest.raises(CommandError, match="last admin of acme with an enabled account"):
        call_command("ledger", "create-user", "alice", "--tenant", "acme", "--role", "viewer", stdout=io.StringIO())
    with pytest.raises(CommandError, match="last admin of acme with an enabled account"):
        call_command("ledger", "remove-member", "alice", "--tenant", "acme", stdout=io.StringIO())
    assert (_role("alice"), _role("bob")) == ("admin", "admin")
    assert not AuditEntry.objects.filter(action__in=["member.changed", "member.removed"], target="user:alice")

    # alice disabled too (forced): neither admin can sign in, and neither stops being one.
    call_command("ledger", "disable-user", "alice", "--force", stdout=io.StringIO(), stderr=io.StringIO())
    with pytest.raises(LastAdmin, match="bob's account is disabled and acme has no admin with an enabled account"):
        remove_member(username="bob", tenant="acme")
    assert _role("bob") == "admin"

    # bob enabled again: alice, disabled, may now be demoted.
    call_command("ledger", "enable-user", "bob", stdout=io.StringIO(), stderr=io.StringIO())
    assert change_role(username="alice", tenant="acme", role="viewer")
    assert _role("alice") == "viewer"


def _password(html: str) -> str:
    found = re.search(r'<input id="new-member-password"[^>]*\bvalue="([^"]+)"', html)
    assert found, html
    return found.group(1)


def _signs_in(username: str, password: str) -> bool:
    """Through the real login form (django-axes and all), as the new member would."""
    return Client().post("/accounts/login/", {"username": username, "password": password}).status_code == 302


def test_a_new_user_is_made_with_a_one_time_password_shown_once(admin: Any, viewer: Any) -> None:
    c = as_user(admin)
    done = c.post(ADD, {"username": " erin ", "role": "operator", "account": "new"})
    assert done.status_code == 201 and done["Cache-Control"] == "no-store"
    html = done.content.decode()
    password = _password(html)
    assert re.fullmatch(r"([a-z2-9]{5}-){4}[a-z2-9]{5}", password)
    assert "erin made and added as operator." in html and "it is not stored and will not be shown again" in html
    assert 'data-username="erin" data-role="operator"' in html  # in the list at once
    erin = User.objects.get(username="erin")
    assert erin.check_password(password) and password not in erin.password  # only its hash is stored
    entry = AuditEntry.objects.get(action="member.added", target="user:erin")
    assert (entry.actor, entry.actor_user_id, entry.details) == ("alice", admin.pk, {"role": "operator"})
    assert password not in str(AuditEntry.objects.values_list("details", "reason"))
    # Shown once: the page does not show it again; erin signs in with it and reads the workspace.
    again = c.get(PAGE).content.decode()
    assert password not in again and 'id="new-member"' not in again
    assert _signs_in("erin", password)
    assert as_user(erin).get("/w/acme/support/").status_code == 200
    # Another new user gets another password.
    other = _password(c.post(ADD, {"username": "frank", "role": "viewer", "account": "new"}).content.decode())
    assert other != password


def test_an_existing_user_is_added_and_keeps_their_password(admin: Any, outsider: Any) -> None:
    c = as_user(admin)
    hashed = outsider.password
    done = c.post(ADD, {"username": "olga", "role": "viewer", "account": "existing"})
    assert done.status_code == 201
    html = done.content.decode()
    assert "olga added as viewer." in html and 'id="new-member-password"' not in html
    assert "no-store" not in done.get("Cache-Control", "")
    outsider.refresh_from_db()
    assert outsider.password == hashed and _role("olga") == "viewer"
    assert Membership.objects.get(user=outsider, tenant__slug="globex").role == "admin"  # her own tenant's: as was
    entry = AuditEntry.objects.get(action="member.added", target="user:olga", tenant__slug="acme")
    assert (entry.actor, entry.details) == ("alice", {"role": "viewer"})
    assert as_user(outsider).get("/w/acme/support/").status_code == 200


def test_a_refused_addition_says_why_by_the_field_and_keeps_what_was_typed(
    admin: Any, viewer: Any, outsider: Any
) -> None:
    c = as_user(admin)
    refusals = [
        # (form, status, the field whose error it is, what it says)
        ({"username": "", "role": "viewer", "account": "new"}, 400, "username", "Name the user to add."),
        ({"username": "x" * 151, "role": "viewer", "account": "new"}, 400, "username", "at most 150 characters"),
        ({"username": "erin smith", "role": "viewer", "account": "new"}, 400, "username", "Username refused"),
        ({"username": "erin", "role": "owner", "account": "new"}, 400, "role", "Choose one of viewer"),
        ({"username": "erin", "role": "viewer", "account": "both"}, 400, "account", "new or has an account"),
        (
            {"username": "dave", "role": "admin", "account": "existing"},
            409,
            "username",
            "dave is a member of acme already (viewer)",
        ),
        (
            {"username": "dave", "role": "admin", "account": "new"},
            409,
            "username",
            "A user called dave exists already",
        ),
        (
            {"username": "olga", "role": "admin", "account": "new"},
            409,
            "username",
            "A user called olga exists already",
        ),
        ({"username": "nobody", "role": "admin", "account": "existing"}, 404, "username", "No user is called nobody"),
    ]
    for form, status, field, says in refusals:
        refused = c.post(ADD, form)
        html = refused.content.decode()
        assert refused.status_code == status, (form, html)
        error = re.search(rf'<span class="field-error" id="member-{field}-error">([^<]*)</span>', html)
        assert error and says in error.group(1), (form, error and error.group(1))
        assert f'aria-describedby="member-{field}-error"' in html
        assert f'id="member-username" name="username" value="{form["username"][:151]}"' in html
        if form["role"] in ("viewer", "admin"):
            assert f'<option value="{form["role"]}" selected>' in html
        if form["account"] in ("new", "existing"):
            assert f'value="{form["account"]}" checked' in html
        assert 'id="new-member"' not in html
    assert _role("dave") == "viewer" and _role("olga") is None
    assert not User.objects.filter(username__in=["erin", "nobody", "erin smith"]).exists()
    assert AuditEntry.objects.filter(action="member.added", tenant__slug="acme").count() == 2  # the fixtures'


def test_the_command_line_adds_a_member_as_the_screen_does(admin: Any, viewer: Any, outsider: Any) -> None:
    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", "add-member", "olga", "--tenant", "acme", "--role", "operator", stdout=out, stderr=err)
    assert out.getvalue().strip() == "olga is operator of acme" and _role("olga") == "operator"
    entry = AuditEntry.objects.get(action="member.added", target="user:olga", tenant__slug="acme")
    assert (entry.actor, entry.details) == ("system:cli", {"role": "operator"})

    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", "add-member", "gus", "--tenant", "acme", "--role", "viewer", "--new", stdout=out, stderr=err)
    password = out.getvalue().strip()  # alone on its line
    assert re.fullmatch(r"([a-z2-9]{5}-){4}[a-z2-9]{5}", password) and "shown once" in err.getvalue()
    assert _signs_in("gus", password) and _role("gus") == "viewer"

    for args, says in (
        (("dave", "--role", "admin"), "dave is a member of acme already"),
        (("dave", "--role", "admin", "--new"), "A user called dave exists already"),
        (("nobody", "--role", "admin"), "No user is called nobody"),
    ):
        with pytest.raises(CommandError, match=re.escape(says)):
            call_command("ledger", "add-member", *args, "--tenant", "acme", stdout=io.StringIO(), stderr=io.StringIO())
    assert _role("dave") == "viewer" and not User.objects.filter(username="nobody").exists()


def test_a_disabled_account_is_not_added_and_the_form_says_so_as_typed(admin: Any, outsider: Any) -> None:
    """olga's account is disabled (she cannot sign in): adding her would make a member nobody
    notices until the account is enabled again. Refused by the field, the form kept, nothing written."""
    User.objects.filter(username="olga").update(is_active=False)
    refused = as_user(admin).post(ADD, {"username": "olga", "role": "approver", "account": "existing"})
    assert refused.status_code == 409
    html = refused.content.decode()
    error = re.search(r'<span class="field-error" id="member-username-error">([^<]*)</span>', html)
    assert error and error.group(1) == (
        "The account of olga is disabled, so they cannot sign in: they are not added. "
        "The deployment&#x27;s operator can enable it again (manage.py ledger enable-user olga)."
    )
    assert 'id="member-username" name="username" value="olga"' in html
    assert '<option value="approver" selected>' in html and 'value="existing" checked' in html
    assert _role("olga") is None and not AuditEntry.objects.filter(action="member.added", target="user:olga").exclude(
        tenant__slug="globex"
    )
    # Enabled again, she is added as usual.
    User.objects.filter(username="olga").update(is_active=True)
    assert as_user(admin).post(ADD, {"username": "olga", "role": "approver", "account": "existing"}).status_code == 201


@pytest.mark.django_db(transaction=True)
def test_the_command_line_refuses_a_disabled_account_with_one_line_and_exit_1(admin: Any, outsider: Any) -> None:
    """As an operator runs it: `manage.py ledger add-member …` in its own process."""
    from tests.servers import REPO_ROOT, database_url

    User.objects.filter(username="olga").update(is_active=False)
    done = subprocess.run(
        [sys.executable, "manage.py", "ledger", "add-member", "olga", "--tenant", "acme", "--role", "viewer"],
        cwd=REPO_ROOT,
        env={**os.environ, "DATABASE_URL": database_url()},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "CommandError: The account of olga is disabled, so they cannot sign in: they are not added. "
        "The deployment's operator can enable it again (manage.py ledger enable-user olga)"
    ]
    assert _role("olga") is None
