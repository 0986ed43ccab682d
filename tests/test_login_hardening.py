"""Login throttling (django-axes) and password validation at `ledger create-user`."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.auth.password_validation import validate_password
from django.core.management import CommandError, call_command
from django.test import Client

from ledger.demo import DEMO_PASSWORD
from ledger.models import Membership
from tests.conftest import PASSWORD
from tests.servers import REPO_ROOT

pytestmark = pytest.mark.django_db

LOGIN = "/accounts/login/"


def _attempt(client: Client, username: str, password: str) -> Any:
    return client.post(LOGIN, {"username": username, "password": password})


def test_a_user_is_locked_out_after_the_failure_limit_from_one_address(settings: Any, viewer: User) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    client = Client(REMOTE_ADDR="203.0.113.7")
    for _ in range(2):
        response = _attempt(client, viewer.username, "wrong-password")
        assert response.status_code == 200 and b"didn't match" in response.content
    locked = _attempt(client, viewer.username, "wrong-password")
    assert locked.status_code == 429
    page = locked.content.decode()
    assert 'id="locked-out"' in page and "Too many failed logins" in page and viewer.username in page
    assert '<form method="post"' in page  # still the login page
    # Locked: even the right password is refused from that address now.
    right = _attempt(client, viewer.username, PASSWORD)
    assert right.status_code == 429 and "_auth_user_id" not in client.session

    # Another address is not locked for this user, and another user is not locked from that address.
    elsewhere = Client(REMOTE_ADDR="198.51.100.9")
    assert _attempt(elsewhere, viewer.username, PASSWORD).status_code == 302
    other = User.objects.create_user("zoe", password=PASSWORD)
    assert _attempt(Client(REMOTE_ADDR="203.0.113.7"), other.username, PASSWORD).status_code == 302


def test_a_success_before_the_limit_clears_the_failures(settings: Any, viewer: User) -> None:
    settings.AXES_FAILURE_LIMIT = 3
    client = Client(REMOTE_ADDR="203.0.113.8")
    for _ in range(2):
        _attempt(client, viewer.username, "wrong-password")
    assert _attempt(client, viewer.username, PASSWORD).status_code == 302
    client.logout()
    for _ in range(2):
        assert _attempt(client, viewer.username, "wrong-password").status_code == 200
    assert _attempt(client, viewer.username, PASSWORD).status_code == 302


def test_behind_trusted_proxies_the_address_comes_from_x_forwarded_for(settings: Any, viewer: User) -> None:
    settings.AXES_FAILURE_LIMIT = 2
    settings.RUNLEDGER_TRUSTED_PROXIES = 1
    proxy = "10.0.0.2"
    attacker = Client(REMOTE_ADDR=proxy)
    for _ in range(2):  # a forged left-hand entry does not make each attempt a new address
        response = attacker.post(
            LOGIN, {"username": viewer.username, "password": "nope"}, HTTP_X_FORWARDED_FOR=f"192.0.2.{_}, 203.0.113.50"
        )
    assert response.status_code == 429
    colleague = Client(REMOTE_ADDR=proxy)  # same proxy, another client address
    answer = colleague.post(
        LOGIN, {"username": viewer.username, "password": PASSWORD}, HTTP_X_FORWARDED_FOR="203.0.113.51"
    )
    assert answer.status_code == 302


def _create_user(*args: str) -> str:
    out = io.StringIO()
    call_command("ledger", "create-user", *args, stdout=out)
    return out.getvalue()


@pytest.mark.parametrize(
    "password, reason",
    [
        ("a", "too short"),
        ("password123", "too common"),
        ("8234917650", "entirely numeric"),
        ("carolcarol1", "too similar"),
    ],
)
def test_create_user_refuses_a_weak_password_and_writes_nothing(workspace: Any, password: str, reason: str) -> None:
    with pytest.raises(CommandError, match=f"password refused: .*{reason}"):
        _create_user("carolcarol", "--tenant", "acme", "--role", "viewer", "--password", password)
    assert not User.objects.filter(username="carolcarol").exists()
    assert not Membership.objects.filter(user__username="carolcarol").exists()


@pytest.mark.django_db(transaction=True)
def test_create_user_at_the_command_line_exits_nonzero_with_the_reason(workspace: Any) -> None:
    from tests.servers import database_url

    env = {**os.environ, "DATABASE_URL": database_url()}
    done = subprocess.run(
        [
            sys.executable,
            "manage.py",
            "ledger",
            "create-user",
            "weak",
            "--tenant",
            "acme",
            "--role",
            "viewer",
            "--password",
            "a",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "password refused" in done.stderr and "too short" in done.stderr


def test_a_good_password_and_the_demo_password_pass_validation(workspace: Any) -> None:
    validate_password(DEMO_PASSWORD, user=User(username="alice"))
    _create_user("carol", "--tenant", "acme", "--role", "viewer", "--password", "correct horse battery")
    assert User.objects.get(username="carol").check_password("correct horse battery")
