"""Console pages: they work for members, refuse anonymous users and 404 for outsiders."""

from __future__ import annotations

import re
from urllib.parse import quote

import pytest
from django.test import Client

from tests.conftest import started

pytestmark = pytest.mark.django_db


@pytest.fixture
def run_url(append) -> str:
    append("run_page", started())
    return "/w/acme/support/runs/run_page/"


def test_home_lands_in_the_workspace_with_the_newest_run(client: Client, member, append) -> None:
    from ledger import log
    from ledger.tenancy.services import bootstrap

    research = bootstrap(tenant="acme", workspace="research")
    client.force_login(member)
    assert client.get("/")["Location"] == "/w/acme/research/"  # no runs anywhere: by name
    append("run_old", started())
    assert client.get("/")["Location"] == "/w/acme/support/"
    log.append(workspace=research, run_id="run_new", events=[started()])
    assert client.get("/")["Location"] == "/w/acme/research/"


def test_login_page_renders(client: Client) -> None:
    response = client.get("/accounts/login/")
    assert response.status_code == 200 and b'name="username"' in response.content


def test_anonymous_users_are_sent_to_login(client: Client, run_url: str) -> None:
    for url in ("/", "/w/acme/support/", run_url):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


HTMX_REQUESTS = [
    ("get", "/w/acme/support/"),
    ("get", "/w/acme/support/runs/run_page/evidence/"),
    ("get", "/w/acme/support/runs/run_page/header/"),
    ("get", "/w/acme/support/approvals/?fragment=list"),
    ("post", "/w/acme/support/runs/run_page/feedback/"),
    ("post", "/w/acme/support/runs/run_page/cancel/"),
    ("post", "/w/acme/support/runs/run_page/share-links/"),
    ("post", "/w/acme/support/settings/retention/"),
]


@pytest.mark.parametrize("method, url", HTMX_REQUESTS)
def test_a_signed_out_htmx_request_is_sent_to_login_from_its_page(
    client: Client, run_url: str, method: str, url: str
) -> None:
    """Not a 302 htmx would follow and swap the login page into the page: HX-Redirect, so the
    whole window goes to the login, and back to the page shown (not the fragment) after it."""
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{run_url}evidence/?at=2"}
    response = getattr(client, method)(url, headers=headers)
    assert response.status_code == 401 and response.content == b""
    page = quote(f"{run_url}evidence/?at=2", safe="")
    assert response["HX-Redirect"] == f"/accounts/login/?next={page}"


def test_a_signed_out_htmx_request_from_another_origin_page_gets_no_next(client: Client, run_url: str) -> None:
    headers = {"HX-Request": "true", "HX-Current-URL": "https://elsewhere.example/w/acme/support/"}
    response = client.get(f"{run_url}header/", headers=headers)
    assert response.status_code == 401 and response["HX-Redirect"] == "/accounts/login/"


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


def test_outsider_gets_404_where_their_own_workspace_has_the_same_slug(client: Client, outsider, run_url: str) -> None:
    """A page finds its workspace among the member's own (read with their memberships, once):
    globex/support being theirs opens acme/support to no one of globex."""
    from ledger.tenancy.services import bootstrap

    bootstrap(tenant="globex", workspace="support")
    client.force_login(outsider)
    for url in ("/w/acme/support/", run_url, f"{run_url}conversation/", f"{run_url}header/", "/w/acme/support/usage/"):
        assert client.get(url).status_code == 404, url
        assert client.head(url).status_code == 404, url
    assert client.get("/w/globex/support/").status_code == 200


def test_member_gets_404_for_an_unknown_run(client: Client, member, run_url: str) -> None:
    client.force_login(member)
    assert client.get("/w/acme/support/runs/run_nope/").status_code == 404


def test_a_user_without_membership_is_told_so(client: Client, workspace) -> None:
    from django.contrib.auth.models import User

    client.force_login(User.objects.create_user("newbie"))
    response = client.get("/")
    assert response.status_code == 200 and b"not a member of any workspace" in response.content
    assert client.get("/w/acme/support/").status_code == 404


def test_every_page_offers_the_workspace_sections(client: Client, member, run_url: str) -> None:
    client.force_login(member)
    for url, current in (("/w/acme/support/", "nav-runs"), ("/w/acme/support/usage/", "nav-usage"), (run_url, None)):
        html = client.get(url).content.decode()
        assert (
            'id="nav-runs" href="/w/acme/support/"' in html and 'id="nav-usage" href="/w/acme/support/usage/"' in html
        )
        assert 'class="switcher"' in html and 'data-workspace="acme/support" aria-current="page"' in html
        if current:
            assert re.search(f'id="{current}" href="[^"]+" aria-current="page"', html)
            assert html.count('aria-current="page"') == 2  # the workspace and the section
