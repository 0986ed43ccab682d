"""User accounts on the command line (docs/operations.md § Members and prices on the Settings
pages): `ledger disable-user` and `ledger enable-user`, audited `member.account_disabled` and
`member.account_enabled` in each tenant of the user; `ledger create-user` saying what it did and
refusing, with nothing written, a new user without a password and a disabled account; and the
account commands' refusals (a user nobody is, a tenant that does not exist, a role that is not
one): one line on stderr, a non-zero exit, no traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.models import AuditEntry, Membership
from ledger.tenancy.services import create_user
from tests.conftest import PASSWORD, named_user
from tests.servers import REPO_ROOT, database_url

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"
RUNS = "/w/acme/support/"


def ledger(*args: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command("ledger", *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


def signs_in(username: str, password: str = PASSWORD) -> bool:
    return Client().post(LOGIN, {"username": username, "password": password}).status_code == 302


def entries(action: str) -> list[tuple[str, str, str, str, dict[str, Any]]]:
    rows = AuditEntry.objects.filter(action=action).order_by("tenant__slug", "pk")
    return [(e.tenant.slug, e.actor, e.target, e.reason, e.details) for e in rows]


def _role(username: str, tenant: str = "acme") -> str | None:
    m = Membership.objects.filter(user__username=username, tenant__slug=tenant).first()
    return None if m is None else str(m.role)


# --- disable-user and enable-user -----------------------------------------------------------------


def test_a_disabled_account_cannot_sign_in_and_its_sessions_end(admin: Any, viewer: Any, other_workspace: Any) -> None:
    named_user("dave", "operator", tenant="globex")  # dave is a member of two tenants
    open_session = Client()
    open_session.force_login(User.objects.get(username="dave"))  # as the password is now
    assert open_session.get(RUNS).status_code == 200

    out, err = ledger("disable-user", "dave", "--reason", "left the team")

    assert out == "the account of dave is disabled: 1 session(s) ended; audited in acme, globex\n" and err == ""
    assert not User.objects.get(username="dave").is_active
    assert not signs_in("dave")
    page = open_session.get(RUNS)
    assert page.status_code == 302 and page["Location"].startswith(LOGIN)
    assert entries("member.account_disabled") == [
        ("acme", "system:cli", "user:dave", "left the team", {"sessionsEnded": 1}),
        ("globex", "system:cli", "user:dave", "left the team", {"sessionsEnded": 1}),
    ]
    assert _role("dave") == "viewer" and _role("dave", "globex") == "operator"  # memberships stay


def test_disabling_a_disabled_account_changes_nothing(viewer: Any) -> None:
    ledger("disable-user", "dave")
    out, _ = ledger("disable-user", "dave")
    assert out == "the account of dave is disabled already: nothing changed\n"
    assert len(entries("member.account_disabled")) == 1


def test_an_enabled_account_signs_in_again_with_its_password_and_roles(viewer: Any, other_workspace: Any) -> None:
    named_user("dave", "approver", tenant="globex")
    ledger("disable-user", "dave")
    assert not signs_in("dave")

    out, err = ledger("enable-user", "dave", "--reason", "back from leave")

    assert out == "the account of dave is enabled; audited in acme, globex\n" and err == ""
    assert signs_in("dave")
    assert _role("dave") == "viewer" and _role("dave", "globex") == "approver"
    assert entries("member.account_enabled") == [
        ("acme", "system:cli", "user:dave", "back from leave", {}),
        ("globex", "system:cli", "user:dave", "back from leave", {}),
    ]
    again, _ = ledger("enable-user", "dave")
    assert again == "the account of dave is enabled already: nothing changed\n"
    assert len(entries("member.account_enabled")) == 2


def test_an_enabled_account_is_added_and_reset_as_any_other(admin: Any, viewer: Any, other_workspace: Any) -> None:
    """The refusals `account_disabled` names `ledger enable-user`, and after it they pass."""
    ledger("disable-user", "dave")
    with pytest.raises(CommandError, match=r"can enable it again \(manage.py ledger enable-user dave\)$"):
        ledger("add-member", "dave", "--tenant", "globex", "--role", "viewer")
    with pytest.raises(CommandError, match="ledger enable-user dave"):
        ledger("reset-password", "dave")
    ledger("enable-user", "dave")
    assert ledger("add-member", "dave", "--tenant", "globex", "--role", "viewer")[0] == "dave is viewer of globex\n"
    assert ledger("reset-password", "dave")[0].strip()


def test_disabling_the_last_enabled_admin_is_refused_without_force(admin: Any, viewer: Any) -> None:
    """Refused, nothing changed: the tenant would have no admin who can sign in (docs/operations.md
    § Members). With --force it is done, and stderr names the tenant left so."""
    with pytest.raises(CommandError, match="alice is the last admin with an enabled account of acme") as refused:
        ledger("disable-user", "alice")
    assert "ledger disable-user alice --force" in str(refused.value)
    assert User.objects.get(username="alice").is_active and signs_in("alice")
    assert not AuditEntry.objects.filter(action="member.account_disabled").exists()
    out, err = ledger("disable-user", "alice", "--force")
    assert out.startswith("the account of alice is disabled")
    assert err == (
        "acme has no admin with an enabled account now: nobody but you can manage its members, keys or settings "
        "until one is (ledger enable-user alice, or ledger create-user NAME --tenant acme --role admin)\n"
    )
    # With another admin enabled, nothing to say.
    ledger("enable-user", "alice")
    ledger("create-user", "dave", "--tenant", "acme", "--role", "admin")
    assert ledger("disable-user", "alice")[1] == ""


def test_an_account_of_no_tenant_is_disabled_and_enabled_unaudited_and_said_so(db: None) -> None:
    User.objects.create_user("zoe", password=PASSWORD)
    out, _ = ledger("disable-user", "zoe")
    assert out == (
        "the account of zoe is disabled: 0 session(s) ended; they are a member of no tenant, so no tenant's "
        "audit log records it\n"
    )
    assert ledger("enable-user", "zoe")[0].startswith("the account of zoe is enabled; they are a member of no tenant")
    assert signs_in("zoe")


def test_enabling_an_account_without_a_password_says_how_to_give_it_one(db: None) -> None:
    zoe = User.objects.create(username="zoe", is_active=False)  # made without one, as `User.objects.create` does
    out, err = ledger("enable-user", "zoe")
    assert out.startswith("the account of zoe is enabled")
    assert err == "zoe has no password to sign in with: ledger reset-password zoe gives them one\n"
    zoe.set_unusable_password()
    zoe.save()
    assert ledger("enable-user", "zoe")[1] == err


# --- create-user ----------------------------------------------------------------------------------


def test_create_user_says_what_it_did(workspace: Any, other_workspace: Any) -> None:
    assert ledger("create-user", "erin", "--tenant", "acme", "--role", "admin", "--password", "pw-erin-1234x") == (
        "erin is a new user, admin of acme, with the password given\n",
        "",
    )
    assert ledger("create-user", "erin", "--tenant", "globex", "--role", "viewer")[0] == (
        "erin is viewer of globex (an existing user, now a member)\n"
    )
    assert ledger("create-user", "erin", "--tenant", "globex", "--role", "operator")[0] == (
        "erin is operator of globex (was viewer)\n"
    )
    assert ledger("create-user", "erin", "--tenant", "globex", "--role", "operator")[0] == (
        "erin was operator of globex already: nothing changed\n"
    )
    assert not entries("member.password_reset")  # a new user's password is in their member.added
    signed_in = Client()
    assert signed_in.post(LOGIN, {"username": "erin", "password": "pw-erin-1234x"}).status_code == 302
    assert ledger("create-user", "erin", "--tenant", "globex", "--role", "operator", "--password", "pw-erin-5678y")[
        0
    ] == ("erin was operator of globex already; their password is the one given (1 session(s) ended)\n")
    assert signs_in("erin", "pw-erin-5678y") and not signs_in("erin", "pw-erin-1234x")
    assert signed_in.get(RUNS).status_code == 302  # to the sign-in page
    # Audited as `ledger reset-password` is, in each of erin's tenants, without the password.
    assert entries("member.password_reset") == [
        ("acme", "system:cli", "user:erin", "", {"sessionsEnded": 1, "oneTime": False}),
        ("globex", "system:cli", "user:erin", "", {"sessionsEnded": 1, "oneTime": False}),
    ]
    assert not [e for e in AuditEntry.objects.all() if "pw-erin" in json.dumps(e.details) + e.reason]
    assert [e[:3] for e in entries("member.added")] == [
        ("acme", "system:cli", "user:erin"),
        ("globex", "system:cli", "user:erin"),
    ]
    assert len(entries("member.changed")) == 1


def test_create_user_refuses_a_new_user_without_a_password(workspace: Any) -> None:
    """Before, it made a user whose password was empty: a member who could never sign in, and said
    only that they were one."""
    with pytest.raises(CommandError) as refused:
        ledger("create-user", "erin", "--tenant", "acme", "--role", "viewer")
    assert str(refused.value) == (
        "erin is a new user and would have no password to sign in with: give one with --password, or add them "
        "with ledger add-member erin --tenant acme --role viewer --new for a one-time password. Nothing was written"
    )
    assert not User.objects.filter(username="erin").exists()
    assert not AuditEntry.objects.exists()


def test_create_user_refuses_a_disabled_account_and_changes_nothing(admin: Any, viewer: Any) -> None:
    """Before, it made the disabled account a member (or changed its role, or its password) and
    said `dave is … of acme` as for anyone."""
    create_user(username="erin", tenant="acme", role="viewer", password="pw-erin-1234x")
    User.objects.filter(username__in=["dave", "erin"]).update(is_active=False)
    before = User.objects.get(username="erin").password
    for args in (
        ["dave", "--tenant", "acme", "--role", "approver"],
        ["erin", "--tenant", "acme", "--role", "viewer", "--password", "pw-erin-5678y"],
    ):
        with pytest.raises(CommandError) as refused:
            ledger("create-user", *args)
        assert str(refused.value) == (
            f"The account of {args[0]} is disabled, so they cannot sign in: nothing changed. "
            f"Enable it first with ledger enable-user {args[0]}"
        )
    assert _role("dave") == "viewer" and User.objects.get(username="erin").password == before
    assert not AuditEntry.objects.filter(action="member.changed").exists()


def test_create_user_says_when_an_existing_user_has_no_password(workspace: Any, other_workspace: Any) -> None:
    User.objects.create(username="zoe")  # no password: made before create-user required one
    out, err = ledger("create-user", "zoe", "--tenant", "acme", "--role", "viewer")
    assert out == "zoe is viewer of acme (an existing user, now a member)\n"
    assert err == "zoe has no password to sign in with: ledger reset-password zoe gives them one\n"


@pytest.mark.parametrize(
    "name, says",
    [
        ("bad name!", "Username refused: Enter a valid username."),
        ("", "Username refused: This field cannot be blank."),
        ("x" * 151, "Username refused: Ensure this value has at most 150 characters (it has 151)."),
    ],
)
def test_create_user_refuses_a_name_that_is_not_a_username(workspace: Any, name: str, says: str) -> None:
    with pytest.raises(CommandError) as refused:
        ledger("create-user", name, "--tenant", "acme", "--role", "viewer", "--password", "pw-a-long-one-1")
    assert str(refused.value).startswith(says)
    assert not User.objects.exists()


# --- the refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, says",
    [
        (["disable-user", "ghost"], "No user is called ghost"),
        (["enable-user", "ghost"], "No user is called ghost"),
        (["disable-user", " "], "Name the user"),
        (["reset-password", "ghost"], "No user is called ghost"),
        (["add-member", "ghost", "--tenant", "acme", "--role", "viewer"], "No user is called ghost: check the name"),
        (["remove-member", "ghost", "--tenant", "acme"], "ghost is not a member of acme"),
        (["remove-member", "dave", "--tenant", "nope"], "tenant nope not found (create it with ledger bootstrap)"),
        (["create-user", "dave", "--tenant", "nope", "--role", "viewer"], "tenant nope not found"),
        (["add-member", "dave", "--tenant", "nope", "--role", "viewer"], "tenant nope not found"),
        (["create-key", "--workspace", "acme/nope", "--scopes", "read"], "workspace acme/nope not found"),
        (
            ["create-key", "--workspace", "acme/support", "--scopes", "read", "--owner", "ghost"],
            "ghost is not a member",
        ),
        (
            ["create-user", "dave", "--tenant", "acme", "--role", "boss"],
            "Error: argument --role: invalid choice: 'boss'",
        ),
        (
            ["add-member", "dave", "--tenant", "acme", "--role", "boss"],
            "Error: argument --role: invalid choice: 'boss'",
        ),
        (["disable-user", "dave", "--reason", "x" * 2001], "the reason is at most 2000 characters"),
    ],
)
def test_account_commands_refuse_with_a_clear_message(viewer: Any, args: list[str], says: str) -> None:
    with pytest.raises(CommandError) as refused:
        ledger(*args)
    assert str(refused.value).startswith(says)
    assert User.objects.get(username="dave").is_active and not AuditEntry.objects.exclude(action="member.added")


@pytest.mark.django_db(transaction=True)
@pytest.mark.backend_independent  # refused before any write: the command's output and exit; about 11 s
def test_the_refusals_are_one_line_and_a_nonzero_exit_in_a_shell(viewer: Any) -> None:
    """As an operator meets them: `manage.py ledger …` in its own process."""
    for args, status, says in [
        (["disable-user", "ghost"], 1, "CommandError: No user is called ghost"),
        (["enable-user", "x" * 300], 1, "CommandError: No user is called " + "x" * 300),
        (["remove-member", "dave", "--tenant", "nope"], 1, "CommandError: tenant nope not found"),
        (["create-user", "erin", "--tenant", "acme", "--role", "viewer"], 1, "CommandError: erin is a new user"),
        (["create-user", "dave", "--tenant", "acme", "--role", "boss"], 2, "argument --role: invalid choice: 'boss'"),
    ]:
        done = subprocess.run(
            [sys.executable, "manage.py", "ledger", *args],
            cwd=REPO_ROOT,
            env={**os.environ, "DATABASE_URL": database_url()},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == status, (args, done.stderr)
        assert done.stdout == "" and "Traceback" not in done.stderr
        assert says in done.stderr.strip().splitlines()[-1]
    assert not User.objects.filter(username="erin").exists()
