"""Issue 33, the run at a glance: the steps tab's output and error columns, the waterfall bars'
cost and tokens, and a bar's detail panel (`waterfall/detail/?kind=&id=`) loaded in place."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

from ledger.models import Workspace
from tests.test_console_evidence import BASE, HTMX, _chat_run, _page

pytestmark = pytest.mark.django_db

DETAIL = f"{BASE}waterfall/detail/"


@pytest.fixture
def chat_run(workspace: Workspace) -> None:
    _chat_run(workspace)


def _detail(client: Client, kind: str, key: str) -> str:
    response = client.get(DETAIL, {"kind": kind, "id": key}, **HTMX)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def test_the_steps_tab_shows_each_steps_output_and_error(browser: Client, chat_run: None) -> None:
    html = _page(browser, f"{BASE}steps/")
    assert "<th>Output</th><th>Error</th>" in html
    draft = html[html.index('data-step="draft"') : html.index('data-step="notify"')]
    assert '<td class="step-output"><span class="mono">Your order B-2 is delayed with UPS.</span>' in draft
    notify = html[html.index('data-step="notify"') :]
    assert '<td class="step-error"><span class="failure">smtp down</span>' in notify


def test_a_long_output_is_one_line_with_the_whole_value_behind_a_disclosure(
    browser: Client, workspace: Workspace
) -> None:
    from ledger.log import append
    from tests.conftest import ev, started

    output = {"answer": "x" * 200, "sources": [1, 2, 3]}
    append(
        workspace=workspace,
        run_id="run_long",
        events=[
            started(),
            ev("StepScheduled", stepPath="a"),
            ev("StepAttemptStarted", stepPath="a", attempt=1),
            ev("StepFailed", stepPath="a", attempt=1, error={"name": "TimeoutError", "message": "took too long"}),
            ev("StepScheduled", stepPath="b"),
            ev("StepAttemptStarted", stepPath="b", attempt=1),
            ev("StepCompleted", stepPath="b", attempt=1, output=output),
        ],
    )
    html = _page(browser, "/w/acme/support/runs/run_long/steps/")
    assert "TimeoutError: took too long" in html
    summary = re.search(r'<details><summary class="mono">([^<]*)</summary>', html)
    assert summary and summary.group(1).startswith("{&quot;answer&quot;: &quot;xxx")
    assert summary.group(1).endswith("…") and len(summary.group(1).replace("&quot;", '"')) == 80
    assert '"sources": [\n    1,' in html.replace("&quot;", '"')  # the whole value, indented, inside it


def test_waterfall_bars_show_cost_and_tokens_and_are_buttons_for_their_detail(browser: Client, chat_run: None) -> None:
    html = _page(browser, f"{BASE}waterfall/")
    assert re.search(r'<span class="wf-usage">[^<]*· 1,000 in / 40 out</span>', html)  # turn 1
    assert re.search(r'<span class="wf-usage">[^<]*· 3,000 in / 80 out</span>', html)  # the step: both turns
    buttons = re.findall(
        r'<button type="button" class="wf-bar wf-expand" aria-expanded="false" aria-controls="([^"]+)"', html
    )
    assert len(buttons) == 2 + 3 + 3  # two steps, three model calls, three tool calls
    for panel in buttons:
        assert f'<div class="wf-children wf-detail" id="{panel}" role="listitem"' in html
    assert f'hx-get="{DETAIL}?kind=tool&amp;id=draft%3Ac1"' in html


def test_a_tool_calls_detail_has_its_arguments_result_and_duration(browser: Client, chat_run: None) -> None:
    html = _detail(browser, "tool", "draft:c1")
    assert "<html" not in html and 'data-detail-kind="tool"' in html
    assert "lookup_order" in html and "&quot;orderId&quot;: &quot;B-2&quot;" in html
    assert "&quot;status&quot;: &quot;delayed&quot;" in html and ">result<" in html


def test_a_failed_calls_detail_has_its_error(browser: Client, chat_run: None) -> None:
    html = _detail(browser, "tool", "draft:c2")
    assert ">error<" in html and 'class="wf-error">invoice service down<' in html


def test_a_model_calls_detail_has_request_response_model_tokens_and_cost(browser: Client, chat_run: None) -> None:
    page = _page(browser, f"{BASE}waterfall/")
    url = re.search(r'hx-get="([^"]*kind=model[^"]*)"', page)
    assert url
    html = browser.get(url.group(1).replace("&amp;", "&"), **HTMX).content.decode()
    assert "openai/gpt-4o-mini" in html and "1,000 in / 40 out tokens" in html and "cost " in html
    assert "Where is order B-2?" in html and ">request<" in html and ">response<" in html


def test_a_steps_detail_has_its_output_and_usage(browser: Client, chat_run: None) -> None:
    html = _detail(browser, "step", "draft")
    assert "Your order B-2 is delayed with UPS." in html and "3,000 in / 80 out tokens" in html
    failed = _detail(browser, "step", "notify")
    assert 'class="wf-error">smtp down<' in failed


@pytest.mark.parametrize(
    ("kind", "key"), [("step", "nope"), ("tool", "draft:c9"), ("model", "9999"), ("model", "abc"), ("model", "1")]
)
def test_a_bad_id_is_404(browser: Client, chat_run: None, kind: str, key: str) -> None:
    assert browser.get(DETAIL, {"kind": kind, "id": key}).status_code == 404


@pytest.mark.parametrize("query", [{}, {"kind": "session", "id": "1"}, {"kind": "tool"}])
def test_a_bad_kind_or_no_id_is_a_readable_400(browser: Client, chat_run: None, query: dict[str, Any]) -> None:
    response = browser.get(DETAIL, query)
    assert response.status_code == 400 and b"kind must be step, model or tool" in response.content


def test_an_outsider_gets_404(client: Client, outsider: Any, chat_run: None) -> None:
    client.force_login(outsider)
    assert client.get(DETAIL, {"kind": "tool", "id": "draft:c1"}).status_code == 404
    assert (
        client.get("/w/globex/main/runs/run_chat/waterfall/detail/", {"kind": "tool", "id": "draft:c1"}).status_code
        == 404
    )


def test_anonymous_is_sent_to_login(client: Client, chat_run: None) -> None:
    response = client.get(DETAIL, {"kind": "tool", "id": "draft:c1"})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
