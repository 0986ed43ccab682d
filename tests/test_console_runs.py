"""The console's runs list: columns, filters in the URL, cursor pages, htmx rows, the switcher."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from html import unescape
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger.models import CostEntry, Run, Workspace
from ledger.replay.feedback import record_feedback
from ledger.tenancy.services import bootstrap, create_user
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

URL = "/w/acme/support/"


def responded(call: str, provider: str, model: str, *, inp: int = 1000, out: int = 100) -> dict[str, Any]:
    return ev(
        "harness.model.responded",
        turn=1,
        callId=call,
        model={"provider": provider, "modelId": model},
        response={"text": "ok", "usage": {"inputTokens": inp, "outputTokens": out}},
    )


def row_ids(html: bytes) -> list[str]:
    return re.findall(r'<tr class="run" data-run-id="([^"]+)"', html.decode())


def row_of(html: bytes, run_id: str) -> str:
    match = re.search(rf'<tr class="run" data-run-id="{run_id}".*?</tr>', html.decode(), re.S)
    assert match, f"no row for {run_id}"
    return match.group(0)


def set_created(run_id: str, when: datetime) -> None:
    Run.objects.filter(run_id=run_id).update(created_at=when)


@pytest.fixture
def runs(append, workspace: Workspace, member) -> None:
    """A small workspace: priced, unpriced, failed, failing-step, parent with a failed child, rated."""
    append(
        "run_priced",
        started("wf_summarize", label="nightly digest"),
        responded("c1", "openai", "gpt-4o-mini"),
        ev("RunCompleted", output="done"),
    )
    append("run_unpriced", started("wf_summarize"), responded("c1", "acme.chat", "house"))
    append("run_failed", started("wf_extract"), ev("RunFailed", error={"message": "boom"}))
    append(
        "run_stepfail",
        started("wf_extract"),
        ev("StepScheduled", stepPath="fetch"),
        ev("StepAttemptStarted", stepPath="fetch", attempt=1),
        ev("StepFailed", stepPath="fetch", attempt=1, error={"message": "timeout"}),
    )
    append("run_parent", started("wf_fanout"))
    append("run_child_ok", started("wf_leaf", parentRunId="run_parent"))
    append("run_child_bad", started("wf_leaf", parentRunId="run_parent"), ev("RunFailed", error="x"))
    append("run_grandchild", started("wf_leaf", parentRunId="run_child_ok"))
    record_feedback(run=Run.objects.get(run_id="run_priced"), rating=5, author=member)
    record_feedback(run=Run.objects.get(run_id="run_priced"), rating=4, author=member)
    record_feedback(run=Run.objects.get(run_id="run_failed"), rating=2, author=member)


# --- access --------------------------------------------------------------------------------


def test_anonymous_is_sent_to_login(client: Client, workspace: Workspace) -> None:
    response = client.get(URL + "?status=running")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/?next=")


def test_outsider_gets_404_with_and_without_filters(client: Client, outsider, runs: None) -> None:
    client.force_login(outsider)
    for url in (URL, URL + "?status=failed", URL + "?status=bogus", URL + "?cursor=zzz"):
        assert client.get(url).status_code == 404
        assert client.get(url, headers={"HX-Request": "true"}).status_code == 404


def test_viewer_can_read_the_list(client: Client, viewer: User, runs: None) -> None:
    client.force_login(viewer)
    assert "run_priced" in row_ids(client.get(URL).content)


# --- the page ------------------------------------------------------------------------------


def test_rows_show_status_workflow_cost_subruns_and_rating(browser: Client, runs: None) -> None:
    response = browser.get(URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert '<form id="run-filters" method="get"' in html and '<tbody id="runs-rows"' in html
    # Newest tree first, its sub-runs nested under it depth first, oldest first.
    assert row_ids(response.content)[:4] == ["run_parent", "run_child_ok", "run_grandchild", "run_child_bad"]
    priced = row_of(response.content, "run_priced")
    assert 'href="/w/acme/support/runs/run_priced/"' in priced and 'class="mono run-id"' in priced
    assert '<span class="status status-completed">completed</span>' in priced
    assert 'data-label="Tokens" title="1,000 in · 100 out">1,100<' in priced
    assert "wf_summarize" in priced and "nightly digest" in priced
    assert re.search(r"\$0\.00021\b", priced)  # 1000 in x 0.15 + 100 out x 0.6 per 1M tokens
    assert "4.5★" in priced and "(2)" in priced
    unpriced = row_of(response.content, "run_unpriced")
    assert 'class="num cost na"' in unpriced and ">n/a<" in unpriced and "$0" not in unpriced
    assert "running" in unpriced
    assert re.search(r'class="num children" data-label="Sub-runs">2<', row_of(response.content, "run_parent"))
    assert re.search(r'class="num children" data-label="Sub-runs">0<', row_of(response.content, "run_failed"))


def test_a_failed_run_says_its_error_once_and_a_cancelled_one_reads_cancelled(
    browser: Client, append, workspace: Workspace
) -> None:
    """The Error column carries how a run ended (the error, its step; a cancellation's reason), the
    Status cell the status word: one place each, not the same message twice."""
    from ledger.replay.cancellation import cancel_run

    append(
        "run_broke",
        started(),
        ev("RunFailed", error={"name": "ToolError", "message": "the ledger API timed out", "stepPath": "fetch"}),
    )
    append("run_stopped", started())
    cancel_run(workspace=workspace, run_id="run_stopped", reason="the customer withdrew", by="carol")
    page = browser.get(URL).content
    broke = row_of(page, "run_broke")
    assert broke.count("the ledger API timed out") == 2  # the cell's text and its title, nothing else
    assert '<span class="status status-failed">failed</span>' in broke
    assert 'data-ended="failed"' in broke and ">ToolError</b>" in broke and '<span class="mono">fetch</span>' in broke
    stopped = row_of(page, "run_stopped")
    assert '<span class="status status-cancelled">cancelled</span>' in stopped and ">failed<" not in stopped
    assert stopped.count("the customer withdrew") == 2 and 'data-label="Reason"' in stopped


def test_a_run_without_model_calls_costs_zero_not_na(browser: Client, append) -> None:
    append("run_plain", started(), ev("RunCompleted"))
    row = row_of(browser.get(URL).content, "run_plain")
    assert ">$0<" in row and "n/a" not in row


def test_htmx_gets_only_the_rows(browser: Client, runs: None) -> None:
    response = browser.get(URL, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200 and "<html" not in html and "<form" not in html
    assert html.lstrip().startswith("<tr") and len(row_ids(response.content)) == 8


def test_switcher_shows_only_the_members_workspaces_grouped_by_tenant(
    client: Client, member, outsider, workspace: Workspace, runs: None
) -> None:
    bootstrap(tenant="acme", workspace="research")
    bootstrap(tenant="initech", workspace="ops")
    create_user(username=member.get_username(), tenant="initech", role="viewer", password=None)
    client.force_login(member)
    html = client.get("/w/acme/research/").content.decode()
    nav = re.search(r'<nav class="switcher".*?</nav>', html, re.S).group(0)
    assert re.findall(r'data-workspace="([^"]+)"', nav) == ["acme/research", "acme/support", "initech/ops"]
    assert "globex" not in nav
    assert re.findall(r'<span class="tenant">(\w+)</span>', nav) == ["acme", "initech"]
    assert re.search(r'data-workspace="acme/research" aria-current="page"', nav)
    assert len(re.findall("aria-current", nav)) == 1
    assert 'id="nav-runs" href="/w/acme/research/" aria-current="page"' in html
    assert 'id="nav-usage" href="/w/acme/research/usage/"' in html


# --- filters -------------------------------------------------------------------------------


FILTER_CASES = [
    ("status=failed", {"run_failed", "run_child_bad"}),
    ("status=completed", {"run_priced"}),
    ("workflow=wf_extract", {"run_failed", "run_stepfail"}),
    ("q=digest", {"run_priced"}),  # the label
    ("q=RUN_CHILD", {"run_child_ok", "run_child_bad"}),  # the run id, case-insensitive
    ("q=fanout", {"run_parent"}),  # the workflow
    ("has_failures=1", {"run_failed", "run_stepfail", "run_child_bad", "run_parent"}),
    ("has_failures=on&workflow=wf_fanout", {"run_parent"}),
    ("cost_above=0", {"run_priced"}),  # unpriced (NULL) never matches
    ("cost_above=0.01", set()),
    ("rating=4", {"run_priced"}),
    ("rating=2", {"run_priced", "run_failed"}),
    ("model=openai/gpt-4o-mini", {"run_priced"}),
    ("model=acme.chat/house", {"run_unpriced"}),
    ("model=*", {"run_priced", "run_unpriced"}),
    ("status=running&q=run_child", {"run_child_ok"}),
]


def test_filters_select_the_runs(browser: Client, runs: None) -> None:
    for query, expected in FILTER_CASES:
        response = browser.get(f"{URL}?{query}&subruns=flat")
        assert response.status_code == 200, query
        assert set(row_ids(response.content)) == expected, query


def test_has_failures_reaches_any_run_below_a_root(browser: Client, append) -> None:
    append("run_root", started("wf_tree"))
    append("run_mid", started("wf_tree", parentRunId="run_root"))
    append("run_leaf", started("wf_tree", parentRunId="run_mid"), ev("RunFailed", error="deep"))
    ids = set(row_ids(browser.get(URL + "?has_failures=1").content))
    assert ids == {"run_leaf", "run_mid", "run_root"}


def test_filter_state_lives_in_the_url(browser: Client, runs: None) -> None:
    html = browser.get(URL + "?status=failed&q=child&has_failures=1&model=openai/gpt-4o").content.decode()
    form = re.search(r'<form id="run-filters".*?</form>', html, re.S).group(0)
    assert re.search(r'<select name="status"[^>]*>.*<option value="failed" selected>', form, re.S)
    assert 'name="q" value="child"' in form and 'name="model" value="openai/gpt-4o"' in form
    assert re.search(r'name="has_failures"[^>]*checked', form)


def test_a_submitted_filter_form_leaves_a_url_of_what_was_chosen(browser: Client, runs: None) -> None:
    """The form sends every field; the list redirects to the URL holding only what was chosen, the
    one to bookmark or send to a colleague."""
    sent = "?q=&status=failed&attention=&workflow=&from=&to=&model=&cost_above=&rating=&sort=&order=&subruns="
    response = browser.get(URL + sent)
    assert response.status_code == 302 and response["Location"] == URL + "?status=failed"
    assert set(row_ids(browser.get(response["Location"]).content)) == set(
        row_ids(browser.get(URL + "?status=failed").content)
    )
    everything_empty = browser.get(URL + "?q=&status=")
    assert everything_empty.status_code == 302 and everything_empty["Location"] == URL
    assert browser.get(URL + "?q=&status=failed", headers={"HX-Request": "true"}).status_code == 200  # htmx: as sent


def test_dates_select_runs_by_the_day_they_were_created(browser: Client, runs: None) -> None:
    set_created("run_failed", datetime(2026, 3, 1, 23, 59, tzinfo=UTC))
    set_created("run_stepfail", datetime(2026, 3, 2, 0, 0, tzinfo=UTC))
    assert set(row_ids(browser.get(URL + "?from=2026-03-01&to=2026-03-01").content)) == {"run_failed"}
    assert set(row_ids(browser.get(URL + "?from=2026-03-01&to=2026-03-02").content)) == {"run_failed", "run_stepfail"}
    assert "run_stepfail" not in row_ids(browser.get(URL + "?to=2026-03-01").content)
    assert "run_failed" not in row_ids(browser.get(URL + "?from=2026-03-02").content)


def test_with_a_model_dates_select_the_model_calls(browser: Client, runs: None) -> None:
    """The usage drill-down: runs behind a model's cost on a day, whenever the run started."""
    set_created("run_priced", datetime(2026, 3, 1, 23, 0, tzinfo=UTC))
    CostEntry.objects.filter(run__run_id="run_priced").update(recorded_at=datetime(2026, 3, 2, 0, 5, tzinfo=UTC))
    day = browser.get(URL + "?model=openai/gpt-4o-mini&from=2026-03-02&to=2026-03-02")
    assert row_ids(day.content) == ["run_priced"]
    assert row_ids(browser.get(URL + "?model=openai/gpt-4o-mini&from=2026-03-01&to=2026-03-01").content) == []
    assert row_ids(browser.get(URL + "?model=*&from=2026-03-02&to=2026-03-02").content) == ["run_priced"]


INVALID_CASES = [
    ("status=bogus", "Select a valid choice"),
    ("from=2026-13-01", "Enter a valid date"),
    ("to=yesterday", "Enter a valid date"),
    ("from=2026-03-02&to=2026-03-01", "From must not be after To"),
    ("cost_above=-1", "greater than or equal to 0"),
    ("cost_above=lots", "Enter a number"),
    ("rating=9", "Select a valid choice"),
    ("model=gpt-4o", "provider/modelId"),
    ("cursor=not-a-cursor", "page link is broken"),
    ("q=" + "x" * 201, "at most 200 characters"),
]


def test_invalid_filters_are_a_readable_400(browser: Client, runs: None) -> None:
    for query, message in INVALID_CASES:
        response = browser.get(f"{URL}?{query}")
        assert response.status_code == 400, query
        html = response.content.decode()
        assert message in html and 'role="alert"' in html and '<form id="run-filters"' in html, query
        assert row_ids(response.content) == [], query
        # A way back that keeps the filters refused would lead to this 400 again.
        newest = re.search(r'<a href="([^"]+)" id="first-page">', html)
        assert newest is None or browser.get(unescape(newest.group(1))).status_code == 200, query
        # So would the column headers' sort links: under such filters they are not links.
        assert 'class="sort-link"' not in html and '<th scope="col"' in html, query
        partial = browser.get(f"{URL}?{query}", headers={"HX-Request": "true"})
        assert partial.status_code == 400 and message in partial.content.decode(), query


# --- pages ---------------------------------------------------------------------------------


def test_cursor_pages_cover_every_run_once_newest_first(browser: Client, append) -> None:
    for i in range(120):
        append(f"run_{i:03d}", started("wf_page" if i % 2 else "wf_other"))
    seen: list[str] = []
    url: str | None = URL
    pages = 0
    while url:
        response = browser.get(url)
        assert response.status_code == 200
        seen += row_ids(response.content)
        found = re.search(r'<a id="next-page" href="([^"]+)"', response.content.decode())
        url = URL + found.group(1).replace("&amp;", "&") if found else None
        pages += 1
    assert pages == 3 and seen == [f"run_{i:03d}" for i in reversed(range(120))]

    first = browser.get(URL + "?workflow=wf_page").content.decode()
    link = re.search(r'<a id="next-page" href="([^"]+)"', first).group(1).replace("&amp;", "&")
    assert "workflow=wf_page" in link and "cursor=" in link
    second = browser.get(URL + link)
    assert row_ids(second.content) == [f"run_{i:03d}" for i in reversed(range(1, 20, 2))]
    assert 'id="next-page"' not in second.content.decode()
    assert '<a href="/w/acme/support/?workflow=wf_page" id="first-page">' in second.content.decode()


def test_htmx_next_page_replaces_the_link_row_with_rows_and_a_new_link(browser: Client, append) -> None:
    for i in range(60):
        append(f"run_{i:03d}", started())
    first = browser.get(URL).content.decode()
    assert re.search(
        r'<tr class="more"><td colspan="10"><a id="next-page" href="[^"]+" hx-get="[^"]+" '
        r'hx-target="closest tr" hx-swap="outerHTML" data-more>',
        first,
    )
    link = re.search(r'hx-get="([^"]+)"', first).group(1).replace("&amp;", "&")
    rest = browser.get(URL + link, headers={"HX-Request": "true"})
    assert row_ids(rest.content) == [f"run_{i:03d}" for i in reversed(range(10))]
    assert "<html" not in rest.content.decode() and "next-page" not in rest.content.decode()


def test_the_live_feed_is_wired_on_first_pages_filtered_or_not(
    browser: Client, runs: None, workspace: Workspace
) -> None:
    """One socket and the rows fetched again at the page's own address (its filters); an older
    page (a cursor) stays as it is."""
    _bulk_runs(workspace, 60, prefix="run_many")
    first = browser.get(URL).content.decode()
    assert 'id="live-status" data-state=' in first and "js/live.js" in first
    assert 'data-live-socket="/ws/workspaces/acme/support/runs/"' in first
    assert '<tbody id="runs-rows" data-live-src="" data-live-swap="innerHTML">' in first
    filtered = browser.get(URL + "?status=failed").content.decode()
    assert "js/live.js" in filtered and 'data-live-src=""' in filtered
    link = re.search(r'id="next-page" href="[^"]+" hx-get="([^"]+)"', first).group(1).replace("&amp;", "&")
    older = browser.get(URL + link).content.decode()
    assert "js/live.js" not in older and "data-live-src" not in older


# --- constant queries ----------------------------------------------------------------------


def _bulk_runs(workspace: Workspace, count: int, prefix: str = "run_bulk") -> None:
    """Run projection rows without their logs: appending 10,000 runs one by one takes about 25 s
    (2.5 ms each on SQLite, measured), too slow for this test; the page reads only these rows."""
    start = datetime(2025, 1, 1, tzinfo=UTC)
    Run.objects.bulk_create(
        [
            Run(
                workspace=workspace,
                run_id=f"{prefix}_{i:05d}",
                status="failed" if i % 7 == 0 else "completed",
                workflow_version_id=f"wf_{i % 5}",
                started_at=start + timedelta(seconds=i),
                finished_at=start + timedelta(seconds=i + 3),
                cost_usd=None if i % 3 == 0 else i / 1000,
                parent_run_id="run_priced" if i % 500 == 0 else "",
                last_sequence=1,
                event_count=1,
            )
            for i in range(count)
        ],
        batch_size=1000,
    )


QUERIES = (
    "",
    "?has_failures=1&rating=1&q=run",
    "?cost_above=0&status=completed",
    "?model=*&from=2020-01-01&to=2030-01-01",
)


def test_runs_list_queries_do_not_grow_with_the_workspace(
    browser: Client, runs: None, workspace: Workspace, django_assert_num_queries
) -> None:
    _bulk_runs(workspace, 92, prefix="run_few")  # 100 runs in all
    counts = {}
    for query in QUERIES:
        for headers in ({}, {"HX-Request": "true"}):
            with CaptureQueriesContext(connection) as captured:
                assert browser.get(URL + query, headers=headers).status_code == 200
            counts[query, bool(headers)] = len(captured)
    # session, user, workspace, switcher, page, runs nested below, sub-runs, ratings, re-executions
    # awaiting approval (attention; the rest of it only for unfinished runs), failed steps (failed
    # runs); the navigation: role, approval cards, tool calls waiting
    assert counts["", False] <= 15
    _bulk_runs(workspace, 9_900)
    assert Run.objects.filter(workspace=workspace).count() == 10_000
    for (query, htmx), count in counts.items():
        with django_assert_num_queries(count):
            response = browser.get(URL + query, headers={"HX-Request": "true"} if htmx else {})
        assert response.status_code == 200 and len(row_ids(response.content)) > 0


def test_a_runs_needs_link_to_where_it_is_done_only_for_a_role_that_may_do_it(
    workspace: Workspace, viewer: User, operator: User, approver: User
) -> None:
    """A viewer sent to reconcile, or an operator sent to decide on Approvals, found a page with
    nothing to press: they read who it waits for instead."""
    from ledger.reexecution import services
    from ledger.runtime.executor import start_run
    from tests.browser import data

    data.running_run(workspace, "run_doubt")
    data.in_doubt_call(workspace, "run_doubt")
    start_run(workspace=workspace, workflow="support.triage", input={"ticket": "Where?"}, run_id="run_asked")
    services.request_reexecution(workspace=workspace, run_id="run_asked", mode="rerun", reason="again", by=operator)
    reconcile = 'href="/w/acme/support/runs/run_doubt/evidence/">reconcile it</a>'
    decide = 'href="/w/acme/support/approvals/">decide on Approvals</a>'
    for user, may_reconcile, may_decide in ((viewer, False, False), (operator, True, False), (approver, True, True)):
        client = Client()
        client.force_login(user)
        listed = client.get(URL).content
        doubt, asked = row_of(listed, "run_doubt"), row_of(listed, "run_asked")
        header = client.get(f"{URL}runs/run_doubt/header/").content.decode()
        for html in (doubt, header):
            assert (reconcile in html) is may_reconcile, user
            assert ("waiting for an operator to reconcile it" in html) is not may_reconcile, user
        assert (decide in asked) is may_decide, user
        assert ("waiting for an approver" in asked) is not may_decide, user
