"""A console list's "next page" link opens under the filters and order it was made under alone: its
cursor is sealed with them (console/pages/filters.page_query), as the API's are. Replayed under
others (a filter edited in the address, a sort changed with the cursor kept) it would show a page
of another list as if it were this one's; it is a 400 on the list's own page instead, the filters
asked kept, saying why and linking the first page of the list as filtered now
(docs/operations.md § Page links)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import transaction
from django.test import Client

from ledger import audit
from ledger.models import Run, Workspace
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


# --- the outer loops list: From/To select the loops, and its page links keep and seal them ---------

LOOPS = "/w/acme/support/loops/"
MARCH_1 = datetime(2026, 3, 1, tzinfo=UTC)


def _loop_ids(html: str) -> list[str]:
    return re.findall(r'data-loop-id="([^"]+)"', html)


@pytest.fixture
def many_loops(append) -> None:
    """120 loops (their record runs): ol_000 to ol_059 started on 2026-03-01, ol_060 to ol_119 on
    2026-03-02, a minute apart; and a run of another workflow on 2026-03-01, which is no loop."""
    for i in range(120):
        append(f"run_ol_{i:03d}", started(f"outer_loop:refine@{i}"))
        at = MARCH_1 + timedelta(days=i // 60, minutes=i)
        Run.objects.filter(run_id=f"run_ol_{i:03d}").update(created_at=at)
    append("run_plain", started("wf_plain"))
    Run.objects.filter(run_id="run_plain").update(created_at=MARCH_1 + timedelta(hours=12))


def _ids(numbers: range) -> list[str]:
    return [f"ol_{i:03d}" for i in reversed(numbers)]


def test_the_loops_list_keeps_the_loops_of_its_days_and_its_next_link_keeps_the_days(
    browser: Client, many_loops: None
) -> None:
    first = browser.get(LOOPS + "?from=2026-03-01&to=2026-03-01")
    assert first.status_code == 200
    html = first.content.decode()
    assert _loop_ids(html) == _ids(range(10, 60))
    assert re.search(r'<input type="date" name="from" value="2026-03-01"', html), "the form shows the days asked"
    link = _next(html)
    assert link.startswith("?from=2026-03-01&to=2026-03-01&cursor=")
    second = browser.get(LOOPS + link)
    assert second.status_code == 200
    html = second.content.decode()
    assert _loop_ids(html) == _ids(range(10)) and 'id="next-page"' not in html
    newest = unescape(re.search(r'<a id="first-page" href="([^"]+)"', html).group(1))
    assert newest == LOOPS + "?from=2026-03-01&to=2026-03-01"

    later = browser.get(LOOPS + "?from=2026-03-02").content.decode()
    assert _loop_ids(later) == _ids(range(70, 120))
    assert _loop_ids(browser.get(LOOPS + _next(later)).content.decode()) == _ids(range(60, 70))
    none = browser.get(LOOPS + "?to=2026-02-28")
    assert none.status_code == 200 and _loop_ids(none.content.decode()) == []
    assert "No outer loops started on these days." in none.content.decode()
    # Unfiltered, every loop, newest first, as before.
    everything = browser.get(LOOPS).content.decode()
    assert _loop_ids(everything) == _ids(range(70, 120)) and _next(everything).startswith("?cursor=")


@pytest.mark.parametrize(
    "replayed_under",
    [
        "",  # no days at all
        "from=2026-03-01",  # `to` dropped
        "from=2026-03-01&to=2026-03-02",  # widened
        "from=2026-03-02&to=2026-03-02",  # other days
    ],
)
def test_a_loops_cursor_replayed_under_other_days_is_a_400_that_links_their_first_page(
    browser: Client, many_loops: None, replayed_under: str
) -> None:
    cursor = _cursor(_next(browser.get(LOOPS + "?from=2026-03-01&to=2026-03-01").content.decode()))
    response = browser.get(f"{LOOPS}?{replayed_under}&cursor={cursor}".replace("?&", "?"))
    assert response.status_code == 400
    html = response.content.decode()
    assert "was made for other filters or another order" in html and 'role="alert"' in html
    assert _loop_ids(html) == [], "no page of another list shown as this one's"
    first = unescape(re.search(r'<a id="first-page-of-filters" href="([^"]+)"', html).group(1))
    assert "cursor=" not in first
    opened = browser.get(first)
    assert opened.status_code == 200 and _loop_ids(opened.content.decode())


def test_bad_days_in_the_loops_list_are_a_400_with_the_form(browser: Client, many_loops: None) -> None:
    for query in ("?from=2026-13-01", "?from=2026-03-02&to=2026-03-01"):
        response = browser.get(LOOPS + query)
        assert response.status_code == 400, query
        html = response.content.decode()
        assert 'role="alert"' in html and _loop_ids(html) == [], query


def test_a_loops_cursor_is_refused_for_an_outsider(
    client: Client, many_loops: None, member: User, outsider: User
) -> None:
    client.force_login(member)
    link = _next(client.get(LOOPS + "?from=2026-03-01&to=2026-03-01").content.decode())
    client.force_login(outsider)
    assert client.get(LOOPS + link).status_code == 404
    assert client.get(LOOPS + "?from=2026-03-01&to=2026-03-01").status_code == 404
    # In the outsider's own workspace the cursor is not theirs: the broken link's 400, no rows.
    theirs = client.get("/w/globex/main/loops/" + link)
    assert theirs.status_code == 400 and _loop_ids(theirs.content.decode()) == []
