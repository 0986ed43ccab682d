"""The run page's evidence views (issue 13): the conversation of every harness session, the run
at any event (`state/?at=N`), search inside a run and jumps to its first failure, and the
waterfall with its lazily expanded sub-runs. Each works for the run's members only (an outsider
gets 404) and takes as many queries for 10,000 events as for 100."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from ledger.canonical import digest
from ledger.log import append, artifacts
from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

RUN = "run_chat"
BASE = f"/w/acme/support/runs/{RUN}/"
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}
HTMX = {"HTTP_HX_REQUEST": "true"}
LONG = "\n".join(f"line {n} of a long tool result" for n in range(200))


def _session(step: str) -> dict[str, Any]:
    manifest = {"tools": ["lookup_order"], "systemPromptHash": "sha256:" + "ab" * 32}
    return ev(
        "harness.session.started",
        stepPath=step,
        role="worker.ai-generate",
        task={"kind": "execute_step"},
        manifest=manifest,
        manifestHash=digest(manifest),
    )


def _turn(
    step: str, turn: int, messages: list[dict[str, Any]], response: dict[str, Any], **extra: Any
) -> list[dict[str, Any]]:
    call_id = f"{step}:turn{turn}"
    return [
        ev(
            "harness.model.called",
            stepPath=step,
            turn=turn,
            callId=call_id,
            promptHash=f"sha256:{turn:064x}",
            request={"messages": messages},
            **extra,
        ),
        ev(
            "harness.model.responded",
            stepPath=step,
            turn=turn,
            callId=call_id,
            model=MINI,
            response={"usage": {"inputTokens": 1000 * turn, "cachedInputTokens": 500, "outputTokens": 40}, **response},
            **extra,
        ),
    ]


def _tool(
    step: str, call_id: str, name: str, args: Any, result: Any, *, turn: int = 1, failed: bool = False, **extra: Any
) -> list[dict[str, Any]]:
    started_event = ev(
        "harness.tool_call.started",
        stepPath=step,
        callId=call_id,
        caller="model",
        turn=turn,
        toolName=name,
        args=args,
        **extra,
    )
    if failed:
        return [
            started_event,
            ev("harness.tool_call.failed", stepPath=step, callId=call_id, error=result, durationMs=12, **extra),
        ]
    return [
        started_event,
        ev("harness.tool_call.succeeded", stepPath=step, callId=call_id, result=result, durationMs=42, **extra),
    ]


def _chat_run(workspace: Workspace, run_id: str = RUN) -> None:
    """What an external harness sends through the API: a session of two turns with a tool call
    between them, a failed tool call, a model call that failed and was retried, a long result
    and an artifact; then a second step that failed."""
    report = artifacts.store_bytes(workspace, b'{"report": true}')
    append(
        workspace=workspace,
        run_id=run_id,
        events=[
            started(label="chat"),
            ev("StepScheduled", stepPath="draft"),
            ev("StepAttemptStarted", stepPath="draft", attempt=1),
            _session("draft"),
            *_turn(
                "draft",
                1,
                [
                    {"role": "system", "content": "You answer tickets."},
                    {"role": "user", "content": "Where is order B-2?"},
                ],
                {"toolCalls": [{"id": "c1", "name": "lookup_order", "args": {"orderId": "B-2"}}]},
            ),
            *_tool("draft", "draft:c1", "lookup_order", {"orderId": "B-2"}, {"status": "delayed", "file": report.ref}),
            *_tool(
                "draft",
                "draft:c2",
                "fetch_invoice",
                {"orderId": "B-2"},
                {"message": "invoice service down"},
                failed=True,
            ),
            ev(
                "harness.model.called",
                stepPath="draft",
                turn=2,
                callId="draft:turn2-try1",
                promptHash="h",
                request={"messages": [{"role": "tool", "toolCallId": "c1", "result": {"status": "delayed"}}]},
            ),
            ev(
                "harness.model.failed",
                stepPath="draft",
                turn=2,
                callId="draft:turn2-try1",
                error={"message": "rate limited"},
            ),
            *_turn(
                "draft",
                2,
                [{"role": "tool", "toolCallId": "c1", "result": {"status": "delayed"}}],
                {"text": "Your order B-2 is delayed with UPS."},
            ),
            *_tool("draft", "draft:c3", "read_log", {}, LONG, turn=2),
            ev("harness.session.completed", stepPath="draft"),
            ev("StepCompleted", stepPath="draft", attempt=1, output="Your order B-2 is delayed with UPS."),
            ev("StepScheduled", stepPath="notify"),
            ev("StepAttemptStarted", stepPath="notify", attempt=1),
            ev("StepFailed", stepPath="notify", attempt=1, error={"message": "smtp down"}),
        ],
    )


@pytest.fixture
def chat_run(workspace: Workspace) -> str:
    _chat_run(workspace)
    return RUN


def _page(client: Client, url: str, **params: Any) -> str:
    response = client.get(url, params)
    assert response.status_code == 200, response.content[:500]
    return response.content.decode()


def _in_order(html: str, *needles: str) -> None:
    """Each needle found after the one before it."""
    position = 0
    for needle in needles:
        found = html.find(needle, position)
        assert found != -1, (needle, "not after", html[max(position - 200, 0) : position])
        position = found + len(needle)


# --- conversation -------------------------------------------------------------------------------


def test_the_conversation_reads_turns_tool_calls_and_results_in_order(browser: Client, chat_run: str) -> None:
    html = _page(browser, f"{BASE}conversation/")
    _in_order(
        html,
        "worker.ai-generate",
        "Turn 1",
        "Where is order B-2?",
        "lookup_order({&quot;orderId&quot;: &quot;B-2&quot;})",
        'id="call-draft:c1"',
        "&quot;delayed&quot;",
        'id="call-draft:c2"',
        "invoice service down",
        "Turn 2",
        "rate limited",
        "Turn 2",
        "Your order B-2 is delayed with UPS.",
        'id="call-draft:c3"',
    )
    # usage and cost per turn, the origin of each call, the system prompt by hash and expandable
    assert "1,000 in (500 cached) / 40 out" in html and "2,000 in (500 cached) / 40 out" in html
    assert re.search(r'class="cost">\$0\.0001', html)
    assert 'class="origin origin-live">live' in html
    assert 'system prompt <span class="mono"' in html and "You answer tickets." in html


def test_failures_and_retries_are_marked(browser: Client, chat_run: str) -> None:
    html = _page(browser, f"{BASE}conversation/")
    assert html.count("retried below") == 1
    assert "The model call failed" in html
    failed_tool = html[html.index('id="call-draft:c2"') : html.index('id="call-draft:c2"') + 1500]
    assert "failed" in failed_tool and ">error<" in failed_tool


def test_long_texts_fold_and_artifacts_link(browser: Client, chat_run: str) -> None:
    html = _page(browser, f"{BASE}conversation/")
    assert f"Show all {len(LONG):,} characters" in html
    assert "line 199 of a long tool result" in html  # all of it is there, behind "show all"
    assert re.search(
        r'<a class="artifact mono" href="/api/v1/artifacts/art_[0-9a-f]+/content\?workspace=acme/support"', html
    )


def test_a_run_of_the_runtime_reads_the_same_way(browser: Client, workspace: Workspace) -> None:
    """Our runtime records only the new messages of each turn (`messagesFrom`): said as such."""
    append(
        workspace=workspace,
        run_id="run_rt",
        events=[
            started(),
            ev("StepScheduled", stepPath="draft"),
            ev("StepAttemptStarted", stepPath="draft", attempt=1),
            _session("draft"),
            *_turn("draft", 1, [{"role": "user", "content": "hi"}], {"text": "hello"}),
            *_turn("draft", 2, [{"role": "user", "content": "again"}], {"text": "hello again"}, origin="recorded"),
        ],
    )
    html = _page(browser, "/w/acme/support/runs/run_rt/conversation/")
    _in_order(html, "Turn 1", "hello", "Turn 2", 'origin-recorded">recorded', "hello again")


def test_a_run_without_sessions_says_so(browser: Client, workspace: Workspace) -> None:
    append(workspace=workspace, run_id="run_plain", events=[started()])
    assert "No harness sessions, model calls or tool calls" in _page(
        browser, "/w/acme/support/runs/run_plain/conversation/"
    )


# --- the run at event N ---------------------------------------------------------------------------


def _sequence_of(client: Client, call_id: str, kind: str) -> int:
    html = _page(client, BASE, type=f"harness.tool_call.{kind}", q=call_id)
    return int(re.findall(r'data-sequence="(\d+)"', html)[0])


def test_the_state_before_a_tool_call_shows_it_not_started_and_after_it_open(browser: Client, chat_run: str) -> None:
    start = _sequence_of(browser, "draft:c1", "started")
    before = _page(browser, f"{BASE}state/", at=start - 1)
    row = re.search(r'<tr data-call="draft:c1".*?</tr>', before, re.S)
    assert row and "not started yet" in row.group(0)
    during = _page(browser, f"{BASE}state/", at=start)
    row = re.search(r'<tr data-call="draft:c1".*?</tr>', during, re.S)
    assert row and "started" in row.group(0) and "<strong>open</strong>" in row.group(0)
    assert 'id="at-replay-ready"' in during and "tool:draft:c1:result" in during  # the plan then
    after = _page(browser, f"{BASE}state/", at=start + 1)
    assert "succeeded" in re.search(r'<tr data-call="draft:c1".*?</tr>', after, re.S).group(0)  # type: ignore[union-attr]


def test_the_state_shows_statuses_and_cost_as_they_were(browser: Client, chat_run: str) -> None:
    first = _page(browser, f"{BASE}state/", at=1)
    assert 'id="at-status">running' in first and "No step yet." in first and 'id="at-cost">$0 ' in first
    last = _page(browser, f"{BASE}state/")
    assert 'id="at-status">running' in last and 'data-step="notify"' in last
    assert re.search(r'data-step="notify">.*?status-failed', last, re.S)
    assert 'name="at" min="1" max="21" value="21"' in last


@pytest.mark.parametrize("at", ["0", "22", "x", "-1"])
def test_an_event_outside_the_run_is_a_readable_400(browser: Client, chat_run: str, at: str) -> None:
    response = browser.get(f"{BASE}state/", {"at": at})
    assert response.status_code == 400 and b"at must be" in response.content


def test_the_state_tab_is_a_page_and_an_htmx_partial(browser: Client, chat_run: str) -> None:
    partial = browser.get(f"{BASE}state/", {"at": 5}, **HTMX).content.decode()
    assert 'id="run-at"' in partial and "<html" not in partial
    assert 'href="/w/acme/support/runs/run_chat/state/?at=4"' in partial
    assert 'href="/w/acme/support/runs/run_chat/state/?at=6"' in partial


def test_a_long_run_lists_the_steps_and_calls_nearest_the_event(
    browser: Client, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.pages.at.SHOWN", 3)
    _long_chat(workspace, "run_steps", 60)  # steps of eight events each: s4 starts at event 34
    html = _page(browser, "/w/acme/support/runs/run_steps/state/", at=35)
    assert re.findall(r'<tr data-step="(\w+)"', html) == ["s2", "s3", "s4"]
    assert "2 more steps, further from event 35, not listed." in html  # s0 and s1
    assert re.findall(r'<tr data-call="(\w+):c"', html) == ["s2", "s3", "s4"]


# --- search and jumps ---------------------------------------------------------------------------


def _found(client: Client, **params: str) -> list[str]:
    html = _page(client, BASE, **params)
    return re.findall(r'<td class="mono ev-type">([^<]+)</td>', html)


def test_search_finds_a_tool_by_name_with_its_outcome(browser: Client, chat_run: str) -> None:
    assert _found(browser, tool="lookup_order") == ["harness.tool_call.started", "harness.tool_call.succeeded"]
    assert _found(browser, tool="fetch_invoice") == ["harness.tool_call.started", "harness.tool_call.failed"]
    assert _found(browser, tool="no_such_tool") == []


def test_search_by_type_step_and_text(browser: Client, chat_run: str) -> None:
    assert _found(browser, type="harness.model.") == [
        "harness.model.called",
        "harness.model.responded",
        "harness.model.called",
        "harness.model.failed",
        "harness.model.called",
        "harness.model.responded",
    ]
    assert _found(browser, step="notify") == ["StepScheduled", "StepAttemptStarted", "StepFailed"]
    assert _found(browser, q="SMTP DOWN") == ["StepFailed"]
    assert _found(browser, step="draft", q="rate limited") == ["harness.model.failed"]


def test_a_search_page_is_not_live_and_keeps_its_terms(browser: Client, chat_run: str, workspace: Workspace) -> None:
    html = _page(browser, BASE, tool="lookup_order")
    assert 'data-live="0"' in html and 'value="lookup_order"' in html and 'id="search-clear"' in html

    def summary(html: str) -> str:
        found = re.search(r'<span class="muted" id="search-summary">(.*?)</span>', html)
        assert found is not None
        return found.group(1)

    assert summary(html) == "2 matching events (not live)"  # the run goes on; its results do not
    append(workspace=workspace, run_id=RUN, events=[ev("RunCompleted")])
    assert summary(_page(browser, BASE, tool="lookup_order")) == "2 matching events"  # nothing to follow


def test_search_pages_by_sequence(browser: Client, chat_run: str) -> None:
    html = _page(browser, BASE, type="harness.", limit="3")
    assert len(re.findall(r'<tr class="event"', html)) == 3
    newer = re.search(r'class="newer" href="([^"]+)"', html)
    assert newer
    rest = _page(browser, newer.group(1).replace("&amp;", "&"))
    assert "harness.tool_call" in rest and 'class="newest"' in rest


def test_jump_to_the_first_failure_and_to_the_first_in_doubt_call(
    browser: Client, chat_run: str, workspace: Workspace
) -> None:
    response = browser.get(BASE, {"first": "failure"})
    assert response.status_code == 302
    failure = int(response["Location"].rsplit("#event-", 1)[1])
    assert f"?after={failure - 1}&limit=200#event-{failure}" in response["Location"]
    assert _found(browser, type="harness.tool_call.failed") and failure == _sequence_of(browser, "draft:c2", "failed")
    missing = browser.get(BASE, {"first": "in_doubt"})
    assert missing.status_code == 400 and b"no in-doubt tool call" in missing.content
    assert browser.get(BASE, {"first": "nonsense"}).status_code == 400


def test_the_jumps_read_their_partial_indexes_not_the_whole_log(chat_run: str, workspace: Workspace) -> None:
    """The timeline offers each jump only where it lands (two lookups a page): each reads its
    partial index (ledger.models.Event.Meta) instead of every event of the run. SQLite matches no
    LIKE whose pattern is a bound parameter, so there only the in-doubt one does."""
    from ledger.replay import runlog

    run = workspace.runs.get(run_id=chat_run)
    indexes = {"failure": "event_failures", "in_doubt": "event_in_doubt"}
    if connection.vendor != "postgresql":
        del indexes["failure"]
    for kind, index in indexes.items():
        plan = runlog.jump_targets(run, kind).order_by("sequence").values_list("sequence")[:1].explain()  # type: ignore[arg-type]
        assert index in plan, (kind, plan)


def test_an_overlong_search_is_a_readable_400(browser: Client, chat_run: str) -> None:
    response = browser.get(BASE, {"q": "x" * 201})
    assert response.status_code == 400 and b"q is at most 200 characters" in response.content


# --- waterfall ------------------------------------------------------------------------------------


def _family(workspace: Workspace) -> None:
    _chat_run(workspace)
    append(
        workspace=workspace,
        run_id="run_kid",
        events=[
            started(parentRunId=RUN),
            ev("StepScheduled", stepPath="inner"),
            ev("StepAttemptStarted", stepPath="inner", attempt=1),
            ev("StepCompleted", stepPath="inner", attempt=1, output=1),
            ev("RunCompleted"),
        ],
    )
    append(workspace=workspace, run_id="run_grandkid", events=[started(parentRunId="run_kid")])


def test_the_waterfall_nests_steps_sessions_calls_and_sub_runs(browser: Client, workspace: Workspace) -> None:
    _family(workspace)
    html = _page(browser, f"{BASE}waterfall/")
    kinds = re.findall(r'data-kind="(\w+)"', html)
    assert kinds[:3] == ["step", "session", "model"] and {"tool", "subrun"} <= set(kinds)
    assert kinds.count("model") == 3 and kinds.count("tool") == 3 and kinds.count("subrun") == 1
    assert 'data-subrun="run_kid"' in html and "/w/acme/support/runs/run_kid/waterfall/rows/?from=" in html
    assert "critical" in html and "pattern-hatched" in html  # the failed step and calls
    assert 'href="/w/acme/support/runs/run_chat/conversation/#call-draft:c1"' in html


def test_a_sub_run_expands_in_place_on_the_parents_axis(browser: Client, workspace: Workspace) -> None:
    _family(workspace)
    html = _page(browser, f"{BASE}waterfall/")
    url = re.search(r'hx-get="(/w/acme/support/runs/run_kid/waterfall/rows/[^"]+)"', html)
    assert url
    rows = browser.get(url.group(1).replace("&amp;", "&"), **HTMX).content.decode()
    assert "<html" not in rows and 'data-kind="step"' in rows and "inner" in rows
    assert 'data-subrun="run_grandkid"' in rows and 'data-depth="1"' in rows


def test_a_waterfall_of_too_many_bars_says_how_many_it_left_out(
    browser: Client, chat_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.pages.waterfall.MAX_ROWS", 4)
    html = _page(browser, f"{BASE}waterfall/")
    assert len(re.findall(r'data-kind="', html)) == 4
    assert re.search(r"The first 4 bars of this page; \d+ more, later in it, are not drawn", html)


@pytest.mark.parametrize("query", ["", "?from=x&to=y", "?from=2026-01-02T00:00:00Z&to=2026-01-01T00:00:00Z"])
def test_bad_waterfall_rows_parameters_are_a_readable_400(browser: Client, chat_run: str, query: str) -> None:
    assert browser.get(f"{BASE}waterfall/rows/{query}").status_code == 400


# --- who may see them -------------------------------------------------------------------------------

NEW_URLS = (
    "conversation/",
    "waterfall/",
    "state/",
    "state/?at=3",
    "?tool=lookup_order",
    "?first=failure",
    "waterfall/rows/?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z",
)


@pytest.mark.parametrize("url", NEW_URLS)
def test_an_outsider_gets_404(client: Client, outsider: Any, chat_run: str, url: str) -> None:
    client.force_login(outsider)
    assert client.get(BASE + url).status_code == 404


@pytest.mark.parametrize("url", NEW_URLS)
def test_anonymous_is_sent_to_login(client: Client, chat_run: str, url: str) -> None:
    response = client.get(BASE + url)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize("url", NEW_URLS)
def test_a_viewer_may_read_them(client: Client, viewer: Any, chat_run: str, url: str) -> None:
    client.force_login(viewer)
    assert client.get(BASE + url).status_code in (200, 302)


# --- query counts -------------------------------------------------------------------------------


def _long_chat(workspace: Workspace, run_id: str, total: int) -> None:
    """A run of `total` events: sessions of a model turn and a tool call each, over many steps."""
    append(workspace=workspace, run_id=run_id, events=[started()])
    append(workspace=workspace, run_id=f"{run_id}_kid", events=[started(parentRunId=run_id)])
    block: list[dict[str, Any]] = []
    written, n = 1, 0
    while written < total:
        step = f"s{n}"
        events = [
            ev("StepScheduled", stepPath=step),
            ev("StepAttemptStarted", stepPath=step, attempt=1),
            _session(step),
            *_turn(step, 1, [{"role": "user", "content": "go"}], {"text": "ok"}),
            *_tool(step, f"{step}:c", "lookup_order", {"n": n}, {"ok": True}),
            ev("StepCompleted", stepPath=step, attempt=1, output=n),
        ]
        events = events[: total - written]
        block += events
        written += len(events)
        n += 1
        if len(block) >= 2000 or written >= total:
            append(workspace=workspace, run_id=run_id, events=block)
            block = []


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200, url
    return len(queries)


VIEWS = (
    "conversation/",
    "waterfall/",
    "state/",
    "state/?at=50",
    "?tool=lookup_order",
    "?q=lookup&type=harness.",
    "waterfall/rows/?from=2026-01-01T00:00:00Z&to=2099-01-01T00:00:00Z",
)


def test_every_new_view_takes_as_many_queries_for_10000_events_as_for_100(
    browser: Client, workspace: Workspace, django_assert_num_queries: Callable[..., Any]
) -> None:
    _long_chat(workspace, "run_short", 100)
    _long_chat(workspace, "run_long", 10_000)
    for view in VIEWS:
        # The first read of a run folds it (and of a long run stores its fold snapshots, one
        # insert per ledger.log.snapshots.EVERY events, once): the counts compared are of later reads.
        _queries(browser, f"/w/acme/support/runs/run_long/{view}")
        _queries(browser, f"/w/acme/support/runs/run_short/{view}")
        small = _queries(browser, f"/w/acme/support/runs/run_short/{view}")
        with django_assert_num_queries(small):
            response = browser.get(f"/w/acme/support/runs/run_long/{view}")
        assert response.status_code == 200, view
    long_state = browser.get("/w/acme/support/runs/run_long/state/?at=5000").content.decode()
    assert 'value="5000"' in long_state and 'max="10000"' in long_state


# --- one format ------------------------------------------------------------------------------------


def test_a_run_reads_the_same_on_the_list_its_page_and_the_usage_report(browser: Client, chat_run: str) -> None:
    listed = _page(browser, "/w/acme/support/")
    row = re.search(rf'<tr class="run" data-run-id="{RUN}".*?</tr>', listed, re.S)
    assert row
    cost = re.search(r'class="num cost[^"]*"[^>]*>(\$[0-9.]+)', row.group(0))
    started_at = re.search(r'<time datetime="[^"]+">([^<]+ UTC)</time>', row.group(0))
    assert cost and started_at
    page = _page(browser, BASE)
    assert f"<dt>Cost</dt><dd>{cost.group(1)} " in page
    assert f'">{started_at.group(1)}</time>' in page
    usage = _page(browser, "/w/acme/support/usage/")  # the run is the workspace's only spend
    assert re.search(rf'<td class="num cost">{re.escape(cost.group(1))}</td>', usage)
    # its one session holds every model call: the session's cost is the run's
    assert f"· {cost.group(1)}</span></h2>" in _page(browser, f"{BASE}conversation/")


def test_the_rating_form_comes_after_the_evidence(browser: Client, chat_run: str) -> None:
    page = _page(browser, f"{BASE}conversation/")
    _in_order(page, 'id="run-tabs"', 'id="tab-panel"', 'id="conversation"', 'id="feedback"', 'id="feedback-form"')
    assert 'href="#feedback">rate this run</a>' in page.split('id="run-tabs"')[0]  # the header links to it


def test_tool_calls_outside_any_session_and_turn_are_counted_as_such(browser: Client, workspace: Workspace) -> None:
    """A harness that records a tool call with no session and no model call around it: its group
    says what it holds, not "0 turns · n/a"."""
    append(
        workspace=workspace,
        run_id="run_loose",
        events=[
            started(),
            ev("harness.tool_call.started", callId="t1", caller="agent", toolName="lookup", args={"q": 1}),
            ev("harness.tool_call.succeeded", callId="t1", result={"ok": True}, durationMs=3),
        ],
    )
    html = _page(browser, "/w/acme/support/runs/run_loose/conversation/")
    assert "Outside a harness session" in html and "1 tool call, no model call" in html
    assert "0 turns" not in html
