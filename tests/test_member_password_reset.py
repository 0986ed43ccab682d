"""A lost password, reset by a tenant's admin on Settings → Members (or by the operator with
`ledger reset-password`): a new one-time password shown once, the member's sessions ended, their
failed logins forgotten, audited `member.password_reset`; never the admin's own account, an
operator's, a disabled one, or a member of a tenant the admin does not administer
(ledger/tenancy/services.py `reset_password`, docs/security.md § Roles)."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.sessions.models import Session
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.models import AuditEntry
from ledger.tenancy.services import create_user
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db

PAGE = "/w/acme/support/settings/members/"
RESET = PAGE + "password/"
HTMX = {"HTTP_HX_REQUEST": "true"}
ONE_TIME = r"([a-z2-9]{5}-){4}[a-z2-9]{5}"


def as_user(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def signed_in(username: str, password: str, address: str = "192.0.2.10") -> Client:
    """Through the real login form (django-axes and all), as the member would; a Client signed in."""
    client = Client(REMOTE_ADDR=address)
    response = client.post("/accounts/login/", {"username": username, "password": password})
    assert response.status_code == 302, response.status_code
    return client


def _password(html: str) -> str:
    found = re.search(r'<input id="reset-password-value"[^>]*\bvalue="([^"]+)"', html)
    assert found, html
    return found.group(1)


def _row(html: str, username: str) -> str:
    return html.split(f'data-username="{username}"')[1].split("</tr>")[0]


def _resets() -> list[tuple[str, str, str, dict[str, Any]]]:
    rows = AuditEntry.objects.filter(action="member.password_reset").order_by("tenant__slug")
    return [(e.tenant.slug, e.actor, e.target, e.details) for e in rows]


def test_an_admin_resets_a_password_shown_once_and_the_members_sessions_end(admin: Any, viewer: Any) -> None:
    at_work = signed_in("dave", PASSWORD)
    on_the_phone = signed_in("dave", PASSWORD, "192.0.2.11")
    assert at_work.get("/w/acme/support/").status_code == 200
    hashed = viewer.password

    c = as_user(admin)
    page = c.get(PAGE).content.decode()
    assert 'class="reset-password">Reset password</button>' in _row(page, "dave")
    assert "Give dave a new password?" in _row(page, "dave")  # asked first (hx-confirm)
    done = c.post(RESET, {"username": "dave"}, **HTMX)
    assert done.status_code == 200 and done["Cache-Control"] == "no-store"
    html = done.content.decode()
    assert html.lstrip().startswith('<section id="members"')  # the section, in place
    password = _password(html)
    assert re.fullmatch(ONE_TIME, password)
    assert "dave has a new password." in html and "it is not stored and will not be shown again" in html
    assert "signed out everywhere (2 sessions ended)" in html

    viewer.refresh_from_db()
    assert viewer.password != hashed and viewer.check_password(password) and password not in viewer.password
    # Both sessions are gone (rows deleted), and each client is sent to log in.
    assert not [s for s in Session.objects.all() if s.get_decoded().get("_auth_user_id") == str(viewer.pk)]
    for client in (at_work, on_the_phone):
        gone = client.get("/w/acme/support/")
        assert gone.status_code == 302 and gone["Location"].startswith("/accounts/login/")
    # The admin's own session stays; the old password no longer works, the new one does.
    assert c.get(PAGE).status_code == 200
    assert Client().post("/accounts/login/", {"username": "dave", "password": PASSWORD}).status_code == 200
    assert signed_in("dave", password).get("/w/acme/support/").status_code == 200

    assert _resets() == [("acme", "alice", "user:dave", {"sessionsEnded": 2})]
    assert AuditEntry.objects.get(action="member.password_reset").actor_user_id == admin.pk
    assert password not in str(AuditEntry.objects.values_list("details", "reason"))
    # Shown once: the page does not show it again.
    again = c.get(PAGE).content.decode()
    assert password not in again and 'id="password-reset"' not in again


def test_without_javascript_the_reset_answers_the_page_with_the_password(admin: Any, operator: Any) -> None:
    done = as_user(admin).post(RESET, {"username": "carol"})
    assert done.status_code == 200 and done["Cache-Control"] == "no-store"
    html = done.content.decode()
    assert "<html" in html and 'id="member-add-form"' in html
    password = _password(html)
    assert "(they were signed in nowhere)" in html
    assert signed_in("carol", password).get("/w/acme/support/").status_code == 200


def test_a_member_locked_out_by_failed_logins_signs_in_after_a_reset(settings: Any, admin: Any, viewer: Any) -> None:
    """They lost their password and tried: the lockout would keep the new one out too."""
    settings.AXES_FAILURE_LIMIT = 3
    client = Client(REMOTE_ADDR="203.0.113.20")
    for _ in range(3):
        client.post("/accounts/login/", {"username": "dave", "password": "not-it-either"})
    assert client.post("/accounts/login/", {"username": "dave", "password": PASSWORD}).status_code == 429
    password = _password(as_user(admin).post(RESET, {"username": "dave"}).content.decode())
    assert client.post("/accounts/login/", {"username": "dave", "password": password}).status_code == 302


def test_an_admin_may_not_reset_a_member_of_a_tenant_they_do_not_administer(admin: Any, outsider: Any) -> None:
    """olga is globex's admin and also a viewer of acme: acme's admin resetting her password would
    take over her account at globex. Refused, naming no other tenant; the list says so up front."""
    create_user(username="olga", tenant="acme", role="viewer", password=None)
    hashed = User.objects.get(username="olga").password
    c = as_user(admin)
    row = _row(c.get(PAGE).content.decode(), "olga")
    assert 'class="reset-password"' not in row and "Reset by the deployment's operator only" in row
    for extra, status in (({}, 403), (HTMX, 422)):
        refused = c.post(RESET, {"username": "olga"}, **extra)
        assert refused.status_code == status
        html = refused.content.decode()
        assert 'id="members-refused"' in html
        assert "olga is also a member of another tenant, one you do not administer" in html
        assert "manage.py ledger reset-password olga" in html
        assert "globex" not in html and 'id="password-reset"' not in html
    assert User.objects.get(username="olga").password == hashed and _resets() == []


def test_an_admin_of_every_tenant_of_the_member_may_reset_and_each_tenant_audits_it(admin: Any, outsider: Any) -> None:
    create_user(username="olga", tenant="acme", role="viewer", password=None)
    create_user(username="alice", tenant="globex", role="admin", password=None)
    c = as_user(admin)
    assert 'class="reset-password"' in _row(c.get(PAGE).content.decode(), "olga")
    password = _password(c.post(RESET, {"username": "olga"}).content.decode())
    assert User.objects.get(username="olga").check_password(password)
    assert _resets() == [
        ("acme", "alice", "user:olga", {"sessionsEnded": 0}),
        ("globex", "alice", "user:olga", {"sessionsEnded": 0}),
    ]


def test_own_operator_and_disabled_accounts_are_refused_with_the_reason(admin: Any, approver: Any, viewer: Any) -> None:
    c = as_user(admin)
    page = c.get(PAGE).content.decode()
    assert '<a href="/accounts/password/">Change your password</a>' in _row(page, "alice")
    assert 'class="reset-password"' not in _row(page, "alice")
    User.objects.filter(username="bob").update(is_staff=True)
    User.objects.filter(username="dave").update(is_active=False)
    page = c.get(PAGE).content.decode()
    assert 'class="reset-password"' not in _row(page, "bob") and 'class="reset-password"' not in _row(page, "dave")
    assert "(account disabled)" in _row(page, "dave") and "(account disabled)" not in _row(page, "bob")
    hashes = dict(User.objects.values_list("username", "password"))
    for username, status, says in (
        ("alice", 403, "This is your own account: change your password under your name"),
        ("bob", 403, "bob is an account of the deployment&#x27;s operators: only they set its password"),
        ("dave", 409, "The account of dave is disabled, so they cannot sign in: a new password would not let"),
    ):
        refused = c.post(RESET, {"username": username})
        assert refused.status_code == status, username
        assert says in refused.content.decode(), username
        assert c.post(RESET, {"username": username}, **HTMX).status_code == 422
    assert dict(User.objects.values_list("username", "password")) == hashes and _resets() == []
    assert c.get(PAGE).status_code == 200  # the admin was not signed out by refusing herself


def test_only_admins_reset_and_another_tenant_gets_404(
    admin: Any, approver: Any, viewer: Any, outsider: Any, client: Client
) -> None:
    hashes = dict(User.objects.values_list("username", "password"))
    for member in (approver, viewer):
        refused = as_user(member).post(RESET, {"username": "dave"})
        assert refused.status_code == 403 and 'id="error-title">Not allowed<' in refused.content.decode()
    assert as_user(outsider).post(RESET, {"username": "dave"}).status_code == 404
    # An admin naming someone who is not a member here (another tenant's, or nobody): alike, 404.
    for name in ("olga", "nobody", ""):
        assert as_user(admin).post(RESET, {"username": name}).status_code == 404
    anonymous = client.post(RESET, {"username": "dave"})
    assert anonymous.status_code == 302 and anonymous["Location"].startswith("/accounts/login/")
    assert dict(User.objects.values_list("username", "password")) == hashes and _resets() == []


def test_the_command_line_resets_any_users_password(admin: Any, viewer: Any, outsider: Any) -> None:
    create_user(username="olga", tenant="acme", role="viewer", password=None)
    at_work = signed_in("olga", PASSWORD)
    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", "reset-password", "olga", stdout=out, stderr=err)
    password = out.getvalue().strip()  # alone on its line
    assert re.fullmatch(ONE_TIME, password)
    assert "olga has a new one-time password, shown once (1 session(s) ended)" in err.getvalue()
    assert at_work.get("/w/acme/support/").status_code == 302
    assert signed_in("olga", password).get("/w/globex/main/").status_code == 200
    assert _resets() == [
        ("acme", "system:cli", "user:olga", {"sessionsEnded": 1}),
        ("globex", "system:cli", "user:olga", {"sessionsEnded": 1}),
    ]
    User.objects.filter(username="dave").update(is_active=False)
    for name, says in (("nobody", "No user is called nobody"), ("dave", "The account of dave is disabled")):
        with pytest.raises(CommandError, match=says):
            call_command("ledger", "reset-password", name, stdout=io.StringIO(), stderr=io.StringIO())
    assert len(_resets()) == 2
