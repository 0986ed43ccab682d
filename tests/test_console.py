"""Console pages: they work for members, refuse anonymous users and 404 for outsiders."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.conftest import started

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_url(append) -> str:
    append("run_page", started())
    return "/w/acme/support/runs/run_page/"


def test_login_page_renders(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200 and b'name="username"' in response.content


def test_anonymous_users_are_sent_to_login(client: Client, run_url: str) -> None:
    for url in ("/", "/w/acme/support/", run_url):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_member_sees_runs_and_the_run_page(client: Client, member, run_url: str) -> None:
    client.force_login(member)
    assert client.get("/")["Location"] == "/w/acme/support/"
    listing = client.get("/w/acme/support/")
    assert listing.status_code == 200 and b"run_page" in listing.content
    page = client.get(run_url)
    assert page.status_code == 200 and b"RunStarted" in page.content


def test_outsider_gets_404_for_another_tenants_pages(client: Client, outsider, run_url: str) -> None:
    client.force_login(outsider)
    assert client.get("/w/acme/support/").status_code == 404
    assert client.get(run_url).status_code == 404
    assert client.get("/w/globex/main/").status_code == 200


def test_member_gets_404_for_an_unknown_run(client: Client, member, run_url: str) -> None:
    client.force_login(member)
    assert client.get("/w/acme/support/runs/run_nope/").status_code == 404
