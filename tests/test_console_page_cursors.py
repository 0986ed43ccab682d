"""A console list's "next page" link opens under the filters and order it was made under alone: its
cursor is sealed with them (console/pages/filters.page_query), as the API's are. Replayed under
others (a filter edited in the address, a sort changed with the cursor kept) it would show a page
of another list as if it were this one's; it is a 400 on the list's own page instead, the filters
asked kept, saying why and linking the first page of the list as filtered now
(docs/operations.md § Page links)."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from ledger import audit
from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

URL = "/w/acme/support/"
AUDIT = "/t/acme/audit/"


def _next(html: str) -> str:
    found = re.search(r'<a id="next-page" href="([^"]+)"', html)
    assert found, "the page has a next page"
    return unescape(found.group(1))


def _cursor(link: str) -> str:
    return re.search(r"[?&]cursor=([^&]+)", link).group(1)


def _row_ids(html: str) -> list[str]:
    return re.findall(r'<tr class="run" data-run-id="([^"]+)"', html)


@pytest.fixture
def many_runs(append) -> None:
    """120 runs, every other of workflow wf_odd, every third failed."""
    for i in range(120):
        append(f"run_{i:03d}", started("wf_odd" if i % 2 else "wf_even"), *([] if i % 3 else [_failed()]))


def _failed() -> dict[str, Any]:
    return ev("RunFailed", error={"name": "Boom", "message": "no"})


def test_a_runs_cursor_opens_under_its_own_filters_and_order(browser: Client, many_runs: None) -> None:
    first = browser.get(URL + "?workflow=wf_odd").content.decode()
    second = browser.get(URL + _next(first))
    assert second.status_code == 200
    assert _row_ids(second.content.decode()) == [f"run_{i:03d}" for i in reversed(range(1, 20, 2))]
    # The unfiltered list's cursors are those made before filters were sealed in: they still open.
    assert browser.get(URL + _next(browser.get(URL).content.decode())).status_code == 200


@pytest.mark.parametrize(
    "replayed_under",
    [
        "workflow=wf_even",  # another filter's value
        "",  # no filter at all
        "workflow=wf_odd&status=failed",  # a filter added
        "workflow=wf_odd&sort=cost",  # another sort
        "workflow=wf_odd&order=asc",  # the other order
        "workflow=wf_odd&subruns=flat",  # sub-runs shown otherwise
    ],
)
def test_a_runs_cursor_replayed_under_other_filters_is_a_400_that_links_their_first_page(
    browser: Client, many_runs: None, replayed_under: str
) -> None:
    cursor = _cursor(_next(browser.get(URL + "?workflow=wf_odd").content.decode()))
    response = browser.get(f"{URL}?{replayed_under}&cursor={cursor}".replace("?&", "?"))
    assert response.status_code == 400
    html = response.content.decode()
    assert "was made for other filters or another order" in html and 'role="alert"' in html
    assert _row_ids(html) == [], "no page of another list shown as this one's"
    first = re.search(r'<a id="first-page-of-filters" href="([^"]+)"', html).group(1)
    assert "cursor=" not in first
    opened = browser.get(unescape(first))
    assert opened.status_code == 200 and _row_ids(opened.content.decode())
    partial = browser.get(f"{URL}?{replayed_under}&cursor={cursor}".replace("?&", "?"), headers={"HX-Request": "true"})
    assert partial.status_code == 400 and "was made for other filters" in partial.content.decode()


def test_a_runs_cursor_of_another_workspace_is_refused_for_an_outsider_as_before(
    client: Client, many_runs: None, member: User, outsider: User
) -> None:
    client.force_login(member)
    cursor = _cursor(_next(client.get(URL + "?workflow=wf_odd").content.decode()))
    client.force_login(outsider)
    assert client.get(f"{URL}?workflow=wf_odd&cursor={cursor}").status_code == 404
    response = client.get(f"/w/globex/main/?workflow=wf_odd&cursor={cursor}")
    assert response.status_code == 400


@pytest.fixture
def many_entries(workspace: Workspace, admin: User) -> None:
    """120 audit entries: every other a key's creation, the rest a key's revocation."""
    with transaction.atomic():
        for i in range(120):
            audit.record(
                actor=admin,
                tenant=workspace.tenant,
                workspace=workspace,
                action=audit.Action.API_KEY_CREATED if i % 2 else audit.Action.API_KEY_REVOKED,
                target=f"key:{i:012x}",
            )


def test_an_audit_cursor_opens_under_its_own_filters_only(client: Client, admin: User, many_entries: None) -> None:
    client.force_login(admin)
    created = audit.Action.API_KEY_CREATED
    first = client.get(f"{AUDIT}?action={created}").content.decode()
    link = _next(first)
    assert f"action={created}" in link
    assert client.get(link).status_code == 200
    cursor = _cursor(link)
    for replayed_under in (f"action={audit.Action.API_KEY_REVOKED}", "", f"action={created}&actor=alice"):
        response = client.get(f"{AUDIT}?{replayed_under}&cursor={cursor}".replace("?&", "?"))
        assert response.status_code == 400, replayed_under
        html = response.content.decode()
        assert "was made for other filters or another order" in html
        assert '<td class="mono target">' not in html, "no entries of another list shown as this one's"
        first_page = unescape(re.search(r'<a id="first-page-of-filters" href="([^"]+)"', html).group(1))
        assert "cursor=" not in first_page and client.get(first_page).status_code == 200
