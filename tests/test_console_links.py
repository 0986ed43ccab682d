"""Every link the console offers a member opens for them: a crawl of the demo from the home page
as its viewer (dave), the least role, following each link of every page he reaches, finds no
page that answers 403 (or anything but a page). Actions are offered only where they can work;
so are links (the concepts page sent a viewer to the re-execution form and the audit log)."""

from __future__ import annotations

import re
from collections import deque
from urllib.parse import parse_qsl, urlsplit

import pytest
from django.contrib.auth.models import User
from django.test import Client

from console.pages.guard import PAGE_ROLES
from ledger.demo import load_demo
from ledger.models import ROLE_RANK, Role
from tests.conftest import started

pytestmark = pytest.mark.django_db

HREF = re.compile(r'<a\b[^>]*?\bhref="([^"#]*)')
# Not pages of the console: static files, and the API (its docs page is a link of every page;
# what a role may do there is the API's own tests').
NOT_PAGES = ("/static/", "/api/", "//")


def _crawl(client: Client) -> dict[str, tuple[int, str]]:
    """{link: (status, the page it was found on)} for the links that did not open, from "/".
    A link is followed once per path and set of query parameters (`?at=17` stands for every
    `?at=N`): the views decide who may open them by path, not by the parameters' values."""
    queue: deque[tuple[str, str]] = deque([("/", "")])
    seen: set[tuple[str, tuple[str, ...]]] = set()
    refused = {}
    while queue:
        link, found_on = queue.popleft()
        response = client.get(link, follow=True)
        if response.status_code != 200:
            refused[link] = (response.status_code, found_on)
            continue
        if not response["Content-Type"].startswith("text/html"):
            continue
        for href in HREF.findall(response.content.decode()):
            href = href.replace("&amp;", "&")
            if not href.startswith("/") or href.startswith(NOT_PAGES):
                continue
            parts = urlsplit(href)
            kind = (parts.path, tuple(sorted({key for key, _ in parse_qsl(parts.query)})))
            if kind not in seen:
                seen.add(kind)
                queue.append((href, link))
    assert len(seen) > 300, "the crawl reached the demo's runs and their tabs"
    return refused


@pytest.mark.backend_independent  # what a page links is its template's and view's; about 20 s
def test_every_link_a_viewer_is_offered_opens(client: Client) -> None:
    load_demo(history_runs=0)
    client.force_login(User.objects.get(username="dave"))
    assert _crawl(client) == {}


# A page of each entry of PAGE_ROLES, in the `workspace` fixture's workspace.
GATED_PAGES = {
    "run-reexecute": "/w/acme/support/runs/run_gated/reexecute/",
    "run-share-links": "/w/acme/support/runs/run_gated/share-links/",
    "tenant-audit": "/t/acme/audit/",
    "workspace-settings": "/w/acme/support/settings/",
    "workspace-members": "/w/acme/support/settings/members/",
    "workspace-prices": "/w/acme/support/settings/prices/",
}


def test_the_roles_the_links_are_offered_by_are_the_pages_own(
    append, admin: User, approver: User, operator: User, viewer: User
) -> None:
    """PAGE_ROLES (console/pages/guard.py) says which role a page needs; each page's view checks
    it itself. A member of that role opens it, one role below gets 403."""
    assert set(GATED_PAGES) == set(PAGE_ROLES)
    append("run_gated", started())
    members = {Role.VIEWER: viewer, Role.OPERATOR: operator, Role.APPROVER: approver, Role.ADMIN: admin}
    ranked = sorted(members, key=lambda role: ROLE_RANK[role])
    for name, path in GATED_PAGES.items():
        needed = Role(PAGE_ROLES[name])
        below = ranked[ranked.index(needed) - 1]
        for role, status in ((needed, 200), (below, 403)):
            client = Client()
            client.force_login(members[role])
            assert client.get(path).status_code == status, (path, role)
