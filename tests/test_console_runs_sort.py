"""The runs list to triage from: sorted by start, duration, cost or tokens on keyset pages, sub-runs
nested under their parent with the tree's cost and tokens, the workflow found by name, and every
choice kept in the URL."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from console import cursors
from console.pages.runs import CURSOR_KIND
from ledger.models import Run, Workspace
from tests.conftest import ev, started
from tests.test_console_runs import URL, responded, row_ids, row_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def trees(append) -> None:
    """An orchestrator cheap on its own and dear with its sub-runs, beside a single run that costs
    more than the orchestrator alone and less than its tree, and an unpriced run."""
    append("run_orch", started("wfver_support.orchestrate_0a1b2c3d4e5f"), responded("c1", "openai", "gpt-4o-mini"))
    append(
        "run_sub_a",
        started("wfver_support.triage_111111111111", parentRunId="run_orch"),
        responded("c1", "openai", "gpt-4o-mini", inp=10_000, out=1_000),
        ev("RunCompleted", output="a"),
    )
    append(
        "run_sub_a1",
        started("wfver_support.lookup_222222222222", parentRunId="run_sub_a"),
        responded("c1", "openai", "gpt-4o-mini", inp=10_000, out=1_000),
        ev("RunFailed", error={"name": "LookupError", "message": "order 42 not found"}),
    )
    append(
        "run_sub_b",
        started("wfver_support.triage_111111111111", parentRunId="run_orch"),
        responded("c1", "openai", "gpt-4o-mini", inp=10_000, out=1_000),
    )
    append(
        "run_solo",
        started("wfver_support.summarize_333333333333"),
        responded("c1", "openai", "gpt-4o-mini", inp=20_000, out=1_000),
        ev("RunCompleted", output="s"),
    )
    append("run_unpriced", started("wfver_support.house_444444444444"), responded("c1", "acme.chat", "house"))


def links(html: str, anchor_id: str) -> str:
    found = re.search(rf'<a (?:class="[^"]*" )?id="{anchor_id}" href="([^"]+)"', html)
    assert found, anchor_id
    return found.group(1).replace("&amp;", "&")


def test_cost_sort_puts_the_dearest_tree_first_with_its_sub_runs_nested(browser: Client, trees: None) -> None:
    response = browser.get(URL + "?sort=cost")
    assert response.status_code == 200
    assert row_ids(response.content) == ["run_orch", "run_sub_a", "run_sub_a1", "run_sub_b", "run_solo", "run_unpriced"]
    orch = row_of(response.content, "run_orch")
    # 1000 in, 100 out: $0.00021 alone; three sub-runs of 10,000 in, 1,000 out: $0.0021 each.
    assert ">$0.00651 <small" in orch and 'data-label="Cost (tree)"' in orch and "this run alone $0.00021" in orch
    assert 'data-tree="3"' in orch and ">34,100<" in orch  # tokens of the tree
    sub = row_of(response.content, "run_sub_a1")
    assert 'data-depth="2"' in sub and 'data-parent="run_sub_a"' in sub and ">$0.0021<" in sub
    assert "LookupError: order 42 not found" in sub  # the error column
    assert ">$0.0036<" in row_of(response.content, "run_solo")
    html = response.content.decode()
    assert re.search(r'aria-sort="descending"><a class="sort-link" id="sort-cost"', html)


def test_flat_lists_every_run_with_its_own_figures(browser: Client, trees: None) -> None:
    response = browser.get(URL + "?sort=cost&subruns=flat")
    ids = row_ids(response.content)
    assert ids[0] == "run_solo" and ids[-2:] == ["run_orch", "run_unpriced"]
    assert set(ids[1:4]) == {"run_sub_a", "run_sub_a1", "run_sub_b"}
    orch = row_of(response.content, "run_orch")
    assert ">$0.00021<" in orch and "data-tree" not in orch


def test_ascending_keeps_runs_without_a_value_last(browser: Client, trees: None) -> None:
    assert row_ids(browser.get(URL + "?sort=cost&order=asc").content)[-1] == "run_unpriced"
    ids = row_ids(browser.get(URL + "?sort=cost&order=asc&subruns=flat").content)
    assert ids[0] == "run_orch" and ids[-1] == "run_unpriced"


def test_tokens_sort_counts_the_tree(browser: Client, trees: None) -> None:
    ids = row_ids(browser.get(URL + "?sort=tokens").content)
    assert ids[0] == "run_orch" and ids.index("run_solo") > ids.index("run_sub_b")
    flat = row_ids(browser.get(URL + "?sort=tokens&subruns=flat").content)
    assert flat[0] == "run_solo"


def test_duration_sort_puts_runs_still_going_last(browser: Client, trees: None) -> None:
    start = datetime(2026, 3, 1, tzinfo=UTC)
    Run.objects.filter(run_id="run_solo").update(started_at=start, finished_at=start + timedelta(minutes=5))
    Run.objects.filter(run_id="run_orch").update(started_at=start, finished_at=start + timedelta(seconds=3))
    Run.objects.filter(run_id="run_unpriced").update(started_at=start, finished_at=None)
    assert row_ids(browser.get(URL + "?sort=duration&subruns=flat").content)[:2] == ["run_solo", "run_orch"]
    ids = row_ids(browser.get(URL + "?sort=duration&order=asc&subruns=flat").content)
    assert ids[-1] == "run_unpriced" or Run.objects.get(run_id=ids[-1]).finished_at is None


def test_workflow_is_found_by_part_of_its_name(browser: Client, trees: None) -> None:
    for typed in ("triage", "TRIAGE", "support.triage", "wfver_support.triage_111111111111"):
        assert set(row_ids(browser.get(f"{URL}?workflow={typed}&subruns=flat").content)) == {
            "run_sub_a",
            "run_sub_b",
        }, typed
    assert row_ids(browser.get(URL + "?workflow=orchestrate").content)[0] == "run_orch"
    assert "No runs match" in browser.get(URL + "?workflow=nothing-like-it").content.decode()


def test_sort_and_filters_are_kept_in_the_url(browser: Client, trees: None) -> None:
    html = browser.get(URL + "?sort=cost&q=run&subruns=flat").content.decode()
    form = re.search(r'<form id="run-filters".*?</form>', html, re.S).group(0)
    assert re.search(r'<select name="sort"[^>]*>.*<option value="cost" selected>', form, re.S)
    assert re.search(r'<select name="subruns"[^>]*>.*<option value="flat" selected>', form, re.S)
    # A header keeps the filters: the current column flips the order, another starts descending.
    assert links(html, "sort-cost") == "/w/acme/support/?q=run&sort=cost&order=asc&subruns=flat"
    assert links(html, "sort-tokens") == "/w/acme/support/?q=run&sort=tokens&subruns=flat"
    assert links(html, "sort-started") == "/w/acme/support/?q=run&subruns=flat"


@pytest.mark.parametrize(
    "api, own",
    [
        ("sort=-cost", "sort=cost"),
        ("sort=cost&order=desc", "sort=cost"),
        ("order=desc", ""),
        ("sort=-started", ""),
        ("sort=started&order=asc", "order=asc"),
        ("q=run&sort=-tokens&subruns=flat", "q=run&sort=tokens&subruns=flat"),
    ],
)
def test_the_api_s_spelling_of_sort_and_order_opens_the_same_view(
    browser: Client, trees: None, api: str, own: str
) -> None:
    """docs/api.md's `sort=-cost` and `order=desc` are links too: they lead to the view the
    console's own spelling shows, at its address; the console's own links stay as they were."""
    answer = browser.get(f"{URL}?{api}")
    assert answer.status_code == 302, answer.content[:200]
    assert answer["Location"] == URL + (f"?{own}" if own else "")
    assert row_ids(browser.get(answer["Location"]).content) == row_ids(browser.get(f"{URL}?{own}").content)
    assert browser.get(f"{URL}?{own}").status_code == 200  # the console's own spelling is not moved
    assert browser.get(f"{URL}?{api}", headers={"HX-Request": "true"}).status_code == 302


def test_a_descending_key_with_an_ascending_order_is_a_readable_400(browser: Client, trees: None) -> None:
    """As the API's 400: `sort=-cost&order=asc` asks for both directions."""
    response = browser.get(f"{URL}?sort=-cost&order=asc")
    assert response.status_code == 400 and 'role="alert"' in response.content.decode()


def _bulk(workspace: Workspace, count: int) -> None:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    Run.objects.bulk_create(
        [
            Run(
                workspace=workspace,
                run_id=f"run_k{i:04d}",
                status="completed",
                workflow_version_id="wfver_bulk_000000000000",
                started_at=start + timedelta(seconds=i),
                finished_at=None if i % 11 == 0 else start + timedelta(seconds=i + (i % 9)),
                cost_usd=None if i % 7 == 0 else Decimal(i % 13) / 1000,
                priced_calls=0 if i % 7 == 0 else 1,
                unpriced_calls=1 if i % 7 == 0 else 0,
                input_tokens=(i % 17) * 100,
                output_tokens=i % 5,
                last_sequence=1,
                event_count=1,
            )
            for i in range(count)
        ]
    )


@pytest.mark.parametrize(
    "query", ["sort=cost", "sort=cost&order=asc", "sort=tokens", "sort=duration", "sort=duration&order=asc", ""]
)
def test_keyset_pages_cover_every_run_once_in_order_without_offset(
    browser: Client, workspace: Workspace, query: str
) -> None:
    _bulk(workspace, 130)  # ties on every key, NULLs (unpriced, still going) among them
    key, descending = {
        "sort=cost": ("cost_usd", True),
        "sort=cost&order=asc": ("cost_usd", False),
        "sort=tokens": ("tokens", True),
        "sort=duration": ("duration", True),
        "sort=duration&order=asc": ("duration", False),
        "": ("created_at", True),
    }[query]

    def value(run: Run) -> object:
        if key == "tokens":
            return run.input_tokens + run.output_tokens
        if key == "duration":
            return None if run.finished_at is None else run.finished_at - run.started_at
        return getattr(run, key)

    every = list(Run.objects.filter(workspace=workspace))
    with_value = sorted((r for r in every if value(r) is not None), key=lambda r: (value(r), r.pk), reverse=descending)
    without = sorted((r for r in every if value(r) is None), key=lambda r: r.pk, reverse=descending)
    expected = [r.run_id for r in with_value + without]

    seen: list[str] = []
    url: str | None = f"{URL}?{query}"
    with CaptureQueriesContext(connection) as captured:
        while url:
            response = browser.get(url)
            assert response.status_code == 200
            seen += row_ids(response.content)
            found = re.search(r'<a id="next-page" href="([^"]+)"', response.content.decode())
            url = URL + found.group(1).replace("&amp;", "&") if found else None
            if url and query:
                assert query.split("&")[0] in url  # the sort rides along
    assert seen == expected
    assert not any("OFFSET" in q["sql"].upper() for q in captured.captured_queries)


def _cursor(workspace: Workspace, position: object) -> str:
    """A cursor sealed for this list (console/cursors.py), so that what it holds is what is refused."""
    return cursors.seal(json.dumps(position).encode(), kind=CURSOR_KIND, scope=workspace)


@pytest.mark.parametrize(
    ("query", "position"),
    [
        ("sort=cost", {"k": "tokens", "v": 1, "id": 1}),  # another sort's link
        ("sort=cost", {"k": "cost", "v": "NaN", "id": 1}),
        ("sort=cost", {"k": "cost", "v": 1.5, "id": 1}),
        ("sort=tokens", {"k": "tokens", "v": -1, "id": 1}),
        ("sort=tokens", {"k": "tokens", "v": 2**70, "id": 1}),
        ("sort=duration", {"k": "duration", "v": "1h", "id": 1}),
        ("sort=cost", {"k": "cost", "v": "1", "id": True}),
        ("sort=cost", [1, 2]),
        ("sort=cost&cursor=eyJrIjoiY29zdCIsInYiOiIxIiwiaWQiOjF9", None),  # unsealed, as before console/cursors.py
        ("sort=bogus", None),
        ("order=sideways", None),
        ("subruns=hidden", None),
    ],
)
def test_forged_cursors_and_unknown_sorts_are_a_readable_400(
    browser: Client, trees: None, workspace: Workspace, query: str, position: object
) -> None:
    if position is not None:
        query += "&cursor=" + _cursor(workspace, position)
    response = browser.get(f"{URL}?{query}")
    assert response.status_code == 400
    html = response.content.decode()
    assert 'role="alert"' in html and row_ids(response.content) == []
    assert browser.get(f"{URL}?{query}", headers={"HX-Request": "true"}).status_code == 400


def test_a_big_tree_shows_its_first_sub_runs_and_links_the_rest(browser: Client, append) -> None:
    append("run_big", started())
    for i in range(13):
        append(f"run_leaf{i:02d}", started(parentRunId="run_big"))
    response = browser.get(URL)
    assert row_ids(response.content) == ["run_big"] + [f"run_leaf{i:02d}" for i in range(10)]
    html = response.content.decode()
    assert '<a href="/w/acme/support/runs/run_big/subruns/">3 more sub-runs in this tree →</a>' in html


def test_outsider_gets_404_whatever_the_sort(client: Client, outsider, trees: None) -> None:
    client.force_login(outsider)
    for query in ("?sort=cost", "?sort=tokens&subruns=flat", "?sort=bogus"):
        assert client.get(URL + query).status_code == 404
