"""A method an address does not take: the console's 405 page in its layout with a way back and the
`Allow` header (console/pages/errors.py `MethodNotAllowedMiddleware`), never Django's empty answer;
the share pages' own 405 in their layout; the API's error body `method_not_allowed` with `Allow`.
Every route the URL configuration holds is crawled with every method it does not take
(tests/isolation_sweep.py ROUTES says which it takes), and none answers 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.http import HttpResponse
from django.test import Client

from ledger.tenancy import sharing
from tests.conftest import started, without_csrf_tokens
from tests.isolation_sweep import ROUTES, fill, http_routes

pytestmark = pytest.mark.django_db

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")

# The routes the sweep calls public, with the methods each takes (Django's own views for the
# accounts, drf-spectacular's for the schema and its docs).
PUBLIC = {
    "api/schema/": {"GET"},
    "api/docs/": {"GET"},
    "accounts/login/": {"GET", "POST"},
    "accounts/logout/": {"POST"},
    "accounts/password/": {"GET", "POST"},
    "accounts/password/done/": {"GET"},
    "concepts/": {"GET"},
}

VALUES = {
    "tenant": "acme",
    "workspace": "support",
    "run_id": "run_crawled",
    "call_id": "crawl:turn1:c1",
    "artifact_id": "art_" + "0" * 64,
    "reexecution_id": "rx_" + "0" * 16,
    "batch_id": "rxb_" + "0" * 16,
    "link_id": "shl_" + "0" * 16,
    "prefix": "0" * 12,
    "tab": "timeline",
    "rest": "anything",
    "name": "crawled",
    "policy_id": "evp_" + "0" * 16,
    "evaluation_id": "ev_" + "0" * 16,
    "outer_loop_id": "ol_" + "0" * 16,
    "token": "tok_" + "x" * 40,
}


def _takes(route: str) -> set[str]:
    declared = PUBLIC.get(route)
    methods = set(declared if declared is not None else ROUTES[route].methods)
    return methods | {"HEAD"} if "GET" in methods else methods


def console_405(response: HttpResponse, allowed: set[str], method: str) -> str:
    """The console's 405 page (its body, but for HEAD, which has none)."""
    assert response.status_code == 405
    assert set(m.strip() for m in response["Allow"].split(",")) - {"OPTIONS"} == allowed
    html = response.content.decode()
    if method == "HEAD":
        assert html == ""
        return html
    assert response["Content-Type"].startswith("text/html")
    assert '<header class="top">' in html and '<main id="main"' in html and 'class="site-footer"' in html
    assert 'data-status="405"' in html and '<h1 id="error-title">Method not allowed</h1>' in html
    assert '<a id="error-home" href="/">Home</a>' in html
    return html


def api_405(response: HttpResponse, method: str) -> None:
    assert response.status_code == 405 and response["Allow"]
    if method == "HEAD":
        return
    assert response["Content-Type"].startswith("application/json")
    assert json.loads(response.content)["error"]["code"] == "method_not_allowed"


@pytest.mark.backend_independent  # a method is refused before any read; about 17 s, the SQLite pass runs it
def test_every_route_answers_a_method_it_does_not_take_with_its_405(admin: User) -> None:
    """As the tenant's admin (no role is missing), on every route: the styled page, the share
    layout or the API's error body, each with `Allow`; OPTIONS may instead be answered (Django's
    and DRF's class views describe themselves) but never with an empty page of the wrong kind."""
    client = Client()  # an exception in a view fails the test: no route may answer 500
    client.force_login(admin)
    routes = http_routes()
    assert set(routes) == set(ROUTES)  # the table holds every route, as the isolation sweep checks
    crawled = 0
    for route in routes:
        takes = _takes(route)
        url = fill(route, VALUES)
        for method in METHODS:
            if method in takes:
                continue
            response = client.generic(method, url)
            crawled += 1
            where = f"{method} {url}"
            assert response.status_code < 500, where
            if method == "OPTIONS" and response.status_code == 200:
                assert "OPTIONS" in response["Allow"], where
                continue
            if route == "s/<str:token>/<path:rest>":
                assert response.status_code == 404 and 'id="refused-title">Not found<' in response.content.decode()
            elif route.startswith("api/"):
                api_405(response, method)
            elif route.startswith("s/") and route.endswith("evidence.json"):
                api_405(response, method)
                assert response["Cache-Control"] == "no-store", where
            elif route.startswith("s/"):
                assert response.status_code == 405 and response["Allow"] == "GET, HEAD", where
                assert response["Cache-Control"] == "no-store" and response["Referrer-Policy"] == "no-referrer"
                if method != "HEAD":
                    html = response.content.decode()
                    assert 'id="refused-title">Method not allowed<' in html and 'class="shared"' in html, where
                    assert '<header class="top">' in html and "/accounts/" not in html, where
            else:
                console_405(response, takes, method)
    assert crawled > 400


def test_an_actions_address_opened_as_a_page_leads_back_to_the_form(admin: User) -> None:
    client = Client()
    client.force_login(admin)
    members = "http://testserver/w/acme/support/settings/members/"
    response = client.get("/w/acme/support/settings/members/add/", headers={"Referer": members})
    html = console_405(response, {"POST"}, "GET")
    assert "This address is where a console form is sent, not a page to open." in html
    assert f'<a id="error-back" href="{members}">Back to the page</a>' in html
    assert 'id="nav-runs" href="/w/acme/support/"' in html  # the workspace's navigation
    # From another site, or with no Referer: the workspace's runs, never the other site.
    elsewhere = client.get("/w/acme/support/settings/members/add/", headers={"Referer": "https://evil.example/x"})
    html = console_405(elsewhere, {"POST"}, "GET")
    assert "evil.example" not in html
    assert '<a id="error-back" href="/w/acme/support/">Runs of acme/support</a>' in html


def test_a_post_to_a_read_only_page_names_the_methods_it_takes(admin: User) -> None:
    client = Client()
    client.force_login(admin)
    html = console_405(client.post("/w/acme/support/usage/"), {"GET", "HEAD"}, "POST")
    assert "This address does not take a POST request; it takes GET, HEAD." in html


def test_an_htmx_fragment_sent_the_wrong_method_leads_back_to_the_page_it_is_part_of(admin: User, append) -> None:
    append("run_frag", started())
    client = Client()
    client.force_login(admin)
    page = "/w/acme/support/runs/run_frag/"
    headers = {"HX-Request": "true", "HX-Current-URL": f"http://testserver{page}"}
    for fragment in ("header/", "timeline/rows/", "waterfall/rows/"):
        html = console_405(client.post(page + fragment, headers=headers), {"GET", "HEAD"}, "POST")
        assert f'<a id="error-back" href="{page}">Back to the page</a>' in html


def test_another_tenants_405_names_nothing_of_the_tenant(outsider: User, admin: User, append) -> None:
    append("run_secret", started())
    client = Client()
    client.force_login(outsider)
    for method, url in (
        ("POST", "/w/acme/support/runs/run_secret/"),
        ("GET", "/w/acme/support/settings/members/add/"),
    ):
        response = client.generic(method, url)
        html = console_405(response, _takes_url(url), method)
        shown = without_csrf_tokens(html)
        assert "acme" not in shown and "run_secret" not in shown
        assert 'data-workspace="globex/main"' in html  # their own workspaces, to go back to work


def _takes_url(url: str) -> set[str]:
    return {"GET", "HEAD"} if url.endswith("run_secret/") else {"POST"}


def test_the_login_and_logout_pages_answer_the_styled_405(client: Client, admin: User) -> None:
    html = console_405(client.put("/accounts/login/"), {"GET", "POST", "HEAD"}, "PUT")
    assert "This address does not take a PUT request" in html
    assert client.get("/accounts/login/").status_code == 200
    client.force_login(admin)
    html = console_405(client.get("/accounts/logout/"), {"POST"}, "GET")
    assert "not a page to open" in html
    html = console_405(client.put("/accounts/password/"), {"GET", "POST", "HEAD"}, "PUT")
    assert '<h1 id="error-title">Method not allowed</h1>' in html


def test_the_share_page_answers_its_own_405_before_looking_at_the_token(client: Client, admin: User, append) -> None:
    from ledger.models import Run

    append("run_shared", started())
    run = Run.objects.get(run_id="run_shared")
    _, token = sharing.create_link(workspace=run.workspace, run=run, by=admin, expires_in_hours=1)
    opens: list[Any] = []
    for url in (f"/s/{token}/", "/s/tok_" + "y" * 40 + "/"):
        response = client.post(url)
        assert response.status_code == 405 and response["Allow"] == "GET, HEAD"
        html = response.content.decode()
        assert 'id="refused-title">Method not allowed<' in html
        assert "A shared run is read only: this address does not take a POST request." in html
        assert f'<a id="refused-back" href="{url}">Back to the shared run</a>' in html
        assert "Ask whoever gave you this link" not in html
        opens.append(sharing.find_link(token).open_count)
    assert opens == [0, 0]  # a refused method does not count as an open
    evidence = client.delete(f"/s/{token}/evidence.json")
    assert evidence.status_code == 405 and evidence["Allow"] == "GET, HEAD"
    assert evidence.json()["error"]["code"] == "method_not_allowed"
    assert client.get(f"/s/{token}/").status_code == 200


def test_the_api_keeps_its_error_body_with_allow(client: Client, admin: User) -> None:
    client.force_login(admin)
    for method, url, allowed in (
        ("GET", "/api/v1/runs/run_x/cancel", "POST"),
        ("PUT", "/api/v1/runs", "GET"),
        ("PUT", "/api/schema/", "GET"),  # not DRF's own answer: console/api/errors.py writes the body
        ("OPTIONS", "/api/docs/", "GET"),  # a page whose renderer cannot describe itself: was a 500
    ):
        response = client.generic(method, url)
        api_405(response, method)
        assert allowed in response["Allow"], (method, url, response["Allow"])
