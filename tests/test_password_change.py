"""A signed-in user changes their own password (console/urls.py: Django's views in the console's
layout): a member added with a one-time password chooses their own, through the real login form
and the real HTTP client."""

from __future__ import annotations

import re

import httpx
import pytest
from django.contrib.auth.models import User

from tests.conftest import IN_PROCESS, PASSWORD, http_client, log_in

pytestmark = pytest.mark.django_db(transaction=True)

NEW = "a-new-passphrase-of-mine-42"
RUNS = "/w/acme/support/"


def _token(page: httpx.Response) -> str:
    found = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def _change(client: httpx.Client, old: str, new1: str, new2: str) -> httpx.Response:
    form = client.get("/accounts/password/")
    assert form.status_code == 200 and "Change your password" in form.text
    return client.post(
        "/accounts/password/",
        data={"old_password": old, "new_password1": new1, "new_password2": new2, "csrfmiddlewaretoken": _token(form)},
    )


def _signs_in(username: str, password: str) -> bool:
    client = http_client(IN_PROCESS)
    page = client.get("/accounts/login/")
    done = client.post(
        "/accounts/login/", data={"username": username, "password": password, "csrfmiddlewaretoken": _token(page)}
    )
    return done.status_code == 302


def test_a_member_changes_their_password_and_signs_in_with_the_new_one(viewer: User) -> None:
    client = log_in(IN_PROCESS, viewer)
    other_session = log_in(IN_PROCESS, viewer)
    runs = client.get(RUNS)
    assert 'id="nav-password" href="/accounts/password/"' in runs.text

    done = _change(client, PASSWORD, NEW, NEW)
    assert done.status_code == 302 and done.headers["location"] == "/accounts/password/done/"
    assert "Password changed" in client.get("/accounts/password/done/").text
    assert client.get(RUNS).status_code == 200  # this browser stays signed in
    ended = other_session.get(RUNS)  # the other session ended
    assert ended.status_code == 302 and ended.headers["location"].startswith("/accounts/login/")
    assert _signs_in(viewer.username, NEW) and not _signs_in(viewer.username, PASSWORD)


@pytest.mark.parametrize(
    "old, new1, new2, message",
    [
        ("wrong-password", NEW, NEW, "Your old password was entered incorrectly"),
        (PASSWORD, NEW, NEW + "x", "The two password fields didn"),
        (PASSWORD, "short", "short", "This password is too short"),
    ],
)
def test_a_refused_change_says_why_next_to_the_field_and_changes_nothing(
    viewer: User, old: str, new1: str, new2: str, message: str
) -> None:
    client = log_in(IN_PROCESS, viewer)
    refused = _change(client, old, new1, new2)
    assert refused.status_code == 200 and message in refused.text.replace("&#x27;", "'")
    assert 'role="alert"' in refused.text and 'aria-invalid="true"' in refused.text
    assert _signs_in(viewer.username, PASSWORD)


def test_signed_out_the_page_asks_to_sign_in() -> None:
    response = http_client(IN_PROCESS).get("/accounts/password/")
    assert response.status_code == 302 and response.headers["location"].startswith("/accounts/login/")
