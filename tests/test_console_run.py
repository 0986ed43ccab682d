"""The run page: its header, five tabs (each a plain page and an htmx partial), the timeline's
paging and rows fragment, reconcile and feedback forms, and query counts that do not grow with
the run."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from html import unescape
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.canonical import digest
from ledger.log import append, artifacts
from ledger.models import CostEntry, Event, Feedback, Run, ToolGatewayClaim, Workspace
from ledger.replay import gateway
from ledger.replay.feedback import record_feedback
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

RUN = "run_page"
BASE = f"/w/acme/support/runs/{RUN}/"
TABS = ("timeline", "steps", "subruns", "evidence", "costs")
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}
UNPRICED = {"provider": "acme-labs", "modelId": "house-model"}
HTMX = {"HTTP_HX_REQUEST": "true"}


def _model_events(
    step: str, turn: int, model: dict[str, str], *, inp: int = 100, out: int = 20
) -> list[dict[str, Any]]:
    call_id = f"{step}-m{turn}"
    return [
        ev("harness.model.called", stepPath=step, turn=turn, callId=call_id, promptHash="h", request={}),
        ev(
            "harness.model.responded",
            stepPath=step,
            turn=turn,
            callId=call_id,
            model=model,
            response={"text": "ok", "usage": {"inputTokens": inp, "outputTokens": out}},
        ),
    ]


def _session(step: str) -> dict[str, Any]:
    manifest = {"tools": ["search"], "stepPath": step}
    return ev(
        "harness.session.started",
        stepPath=step,
        role="worker",
        task={"kind": "execute_step"},
        manifest=manifest,
        manifestHash=digest(manifest),
    )


def _rich_run(workspace: Workspace, run_id: str = RUN, *, extra_steps: int = 0) -> None:
    """A run with a completed step (priced model call, artifact), a running step (unpriced call,
    an unanswered model call), a simulated event and `extra_steps` more completed steps."""
    blob = artifacts.store_bytes(workspace, b'{"big": true}')
    events = [
        started(label="demo"),
        ev("StepScheduled", stepPath="extract"),
        ev("StepAttemptStarted", stepPath="extract", attempt=1),
        _session("extract"),
        *_model_events("extract", 1, MINI),
        ev("StepCompleted", stepPath="extract", attempt=1, output={"name": "Ada"}, outputRef=blob.ref),
        ev("StepScheduled", stepPath="score"),
        ev("StepAttemptStarted", stepPath="score", attempt=1),
        _session("score"),
        *_model_events("score", 1, UNPRICED),
        ev(
            "harness.model.called",
            stepPath="score",
            turn=2,
            callId="score-m2",
            promptHash="h",
            request={},
            origin="simulated",
        ),
    ]
    for n in range(extra_steps):
        path = f"extra{n}"
        events += [
            ev("StepScheduled", stepPath=path),
            ev("StepAttemptStarted", stepPath=path, attempt=1),
            _session(path),
            *_model_events(path, 1, MINI),
            ev("StepCompleted", stepPath=path, attempt=1, output=n),
        ]
    append(workspace=workspace, run_id=run_id, events=events)


@pytest.fixture
def rich_run(workspace: Workspace) -> str:
    _rich_run(workspace)
    return RUN


def _sequences(html: bytes) -> list[int]:
    return [int(n) for n in re.findall(rb'<tr class="event" id="event-\d+" data-sequence="(\d+)"', html)]


def _tab_url(tab: str) -> str:
    return BASE if tab == "timeline" else f"{BASE}{tab}/"


# --- every tab, both ways, for the right people ----------------------------------------------


@pytest.mark.parametrize("tab", TABS)
def test_each_tab_is_a_full_page_and_an_htmx_partial(client: Client, member: Any, rich_run: str, tab: str) -> None:
    client.force_login(member)
    page = client.get(f"{BASE}{tab}/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<html" in html and 'id="feedback-form"' in html and 'id="tab-panel"' in html
    assert re.search(rf'<a data-tab="{tab}" href="{BASE}{tab}/"[^>]*aria-current="page"', html)
    for other in TABS:
        assert (
            f'data-tab="{other}" href="{BASE}{other}/" hx-get="{BASE}{other}/" hx-target="#tab-panel" hx-push-url="true"'
            in html
        )

    partial = client.get(f"{BASE}{tab}/", **HTMX)
    assert partial.status_code == 200
    body = partial.content.decode()
    assert "<html" not in body and 'id="feedback-form"' not in body
    # The tab bar comes along out of band, so the current tab is marked after an htmx swap too.
    assert 'id="run-tabs" class="tabs" aria-label="Run sections" hx-swap-oob="true"' in body
    assert re.search(rf'<a data-tab="{tab}"[^>]*aria-current="page"', body)


def test_an_htmx_history_restore_gets_the_whole_page(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    page = client.get(f"{BASE}steps/", HTTP_HX_REQUEST="true", HTTP_HX_HISTORY_RESTORE_REQUEST="true")
    assert page.status_code == 200 and b"<html" in page.content


def test_the_run_page_opens_on_the_timeline(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    default, timeline = client.get(BASE), client.get(f"{BASE}timeline/")
    assert _sequences(default.content) == _sequences(timeline.content) == list(range(1, 14))
    assert b'<tbody id="timeline-rows">' in default.content


@pytest.mark.parametrize("tab", TABS)
def test_anonymous_is_sent_to_login(client: Client, rich_run: str, tab: str) -> None:
    response = client.get(f"{BASE}{tab}/")
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


@pytest.mark.parametrize(
    "url", [*(f"{BASE}{t}/" for t in TABS), f"{BASE}timeline/rows/?after=0", f"{BASE}timeline/caption/"]
)
def test_outsider_gets_404(client: Client, outsider: Any, rich_run: str, url: str) -> None:
    client.force_login(outsider)
    assert client.get(url).status_code == 404
    assert client.get(url, **HTMX).status_code == 404


@pytest.mark.parametrize(
    "url",
    [
        "/w/acme/support/runs/run_nope/",
        "/w/acme/support/runs/run_nope/steps/",
        f"{BASE}nonsense/",
        "/w/acme/support/runs/run_nope/timeline/rows/",
        "/w/acme/support/runs/run_nope/timeline/caption/",
    ],
)
def test_unknown_run_or_tab_is_404(client: Client, member: Any, rich_run: str, url: str) -> None:
    client.force_login(member)
    assert client.get(url).status_code == 404


# --- header ----------------------------------------------------------------------------------


def test_header_shows_status_workflow_cost_and_parent(
    client: Client, member: Any, workspace: Workspace, rich_run: str
) -> None:
    append(workspace=workspace, run_id="run_child", events=[started("wf_child", parentRunId=RUN)])
    client.force_login(member)
    html = client.get(BASE).content.decode()
    assert '<span class="mono run-id">run_page</span>' in html
    assert 'id="run-status" class="status status-running" data-status="running">running</span>' in html
    assert "wfver_test" in html
    assert "1/2 priced (50%)" in html  # one priced model call, one unpriced
    assert "Parent run</dt><dd>none" in html

    child = client.get("/w/acme/support/runs/run_child/").content.decode()
    assert f'href="{BASE}">run_page</a>' in child
    assert 'Cost</dt><dd>$0 <span class="muted">no model calls' in child


def test_an_unpriced_run_costs_n_a(client: Client, member: Any, workspace: Workspace) -> None:
    append(
        workspace=workspace,
        run_id="run_unpriced",
        events=[started(), ev("StepScheduled", stepPath="a"), *_model_events("a", 1, UNPRICED)],
    )
    client.force_login(member)
    html = client.get("/w/acme/support/runs/run_unpriced/").content.decode()
    assert 'Cost</dt><dd>n/a <span class="muted">0/1 priced (0%)' in html


# --- timeline ----------------------------------------------------------------------------------


def test_rows_show_type_step_time_origin_payload_and_artifact_links(
    client: Client, member: Any, workspace: Workspace, rich_run: str
) -> None:
    client.force_login(member)
    html = client.get(BASE).content.decode()
    completed = re.search(r'<tr class="event" id="event-7" data-sequence="7">.*?</tr>', html, re.S).group(0)
    assert "StepCompleted" in completed and ">extract<" in completed
    assert 'class="origin' not in completed  # not a model or tool event: no origin badge
    assert '"name": "Ada"' in completed.replace("&quot;", '"')
    assert '<button type="button" class="copy"' in completed
    blob = artifacts.store_bytes(workspace, b'{"big": true}')  # the same bytes: the same artifact
    link = f"/api/v1/artifacts/{blob.artifact_id}/content?workspace=acme/support"
    assert f'href="{link}"' in completed
    download = client.get(link)
    assert download.status_code == 200 and b"".join(download.streaming_content) == b'{"big": true}'

    simulated = re.search(r'<tr class="event" id="event-13" data-sequence="13"[^>]*>.*?</tr>', html, re.S).group(0)
    assert '<span class="origin origin-simulated">simulated</span>' in simulated


def _origin_badges(html: str) -> dict[int, str | None]:
    rows = re.findall(r'<tr class="event" id="event-(\d+)".*?</tr>', html, re.S)
    bodies = re.split(r'<tr class="event" id="event-\d+"', html)[1:]
    return {
        int(n): (re.findall(r'<span class="origin origin-(\w+)">', body) or [None])[0] for n, body in zip(rows, bodies)
    }


def test_only_model_and_tool_events_carry_an_origin_badge(client: Client, member: Any, workspace: Workspace) -> None:
    """docs/design.md §3: a re-execution writes `origin` on model and tool events; an original run's
    calls happened live; no other event has an origin, whatever its payload says."""
    append(
        workspace=workspace,
        run_id="run_origins",
        events=[
            started(),
            ev("StepScheduled", stepPath="a"),
            _session("a"),
            ev(
                "harness.model.called", stepPath="a", turn=1, callId="m1", promptHash="h", request={}, origin="recorded"
            ),
            ev(
                "harness.model.responded",
                stepPath="a",
                turn=1,
                callId="m1",
                model=MINI,
                origin="recorded",
                response={"text": "ok", "usage": {"inputTokens": 1, "outputTokens": 1}},
            ),
            ev(
                "harness.tool_call.started", callId="t1", caller="model", toolName="search", args={}, origin="simulated"
            ),
            ev("harness.tool_call.succeeded", callId="t1", result={"hits": 0}, durationMs=1.0),
            ev("custom.note", origin="simulated"),
            ev("harness.model.called", stepPath="a", turn=2, callId="m2", promptHash="h", request={}),
        ],
    )
    client.force_login(member)
    badges = _origin_badges(client.get("/w/acme/support/runs/run_origins/").content.decode())
    assert badges == {
        1: None,
        2: None,
        3: None,
        4: "recorded",
        5: "recorded",
        6: "simulated",
        7: "live",
        8: None,
        9: "live",
    }
    pushed_the_same = client.get("/w/acme/support/runs/run_origins/timeline/rows/", {"after": 5}).content.decode()
    assert _origin_badges(pushed_the_same) == {6: "simulated", 7: "live", 8: None, 9: "live"}


def test_timeline_pages_by_sequence_and_only_the_newest_page_is_live(
    client: Client, member: Any, workspace: Workspace
) -> None:
    append(
        workspace=workspace,
        run_id="run_long",
        events=[started()] + [ev("StepScheduled", stepPath=f"s{n}") for n in range(2, 451)],
    )
    client.force_login(member)
    base = "/w/acme/support/runs/run_long/timeline/"

    newest = client.get(base).content.decode()
    assert _sequences(newest.encode()) == list(range(251, 451))
    assert 'id="live-status" data-state="reconnecting"' in newest and 'data-live="1"' in newest
    assert 'data-last-sequence="450"' in newest
    assert f'href="{base}?after=50&amp;limit=200"' in newest  # older
    assert "newer →" not in newest

    first = client.get(base, {"after": 0}).content.decode()
    assert _sequences(first.encode()) == list(range(1, 201))
    # An older page's rows stay as they are; the page itself (header, open tab) still follows the run.
    assert 'data-live="0"' in first and 'data-live-socket="/ws/runs/run_long/"' in first
    assert f'href="{base}?after=200&amp;limit=200"' in first and "← older" not in first

    past_the_end = client.get(base, {"after": 99999}).content.decode()
    assert _sequences(past_the_end.encode()) == [] and 'data-last-sequence="450"' in past_the_end

    # Older than a page that starts before the first page's end: the events before it, no repeats.
    near_the_start = client.get(base, {"after": 50}).content.decode()
    assert _sequences(near_the_start.encode()) == list(range(51, 251))
    assert f'href="{base}?after=0&amp;limit=50"' in near_the_start
    assert _sequences(client.get(base, {"after": 0, "limit": 50}).content) == list(range(1, 51))

    middle = client.get(base, {"after": 200, "limit": 100}).content.decode()
    assert _sequences(middle.encode()) == list(range(201, 301))
    assert f'href="{base}?after=100&amp;limit=100"' in middle and f'href="{base}?after=300&amp;limit=100"' in middle


def test_a_finished_run_says_finished_and_is_not_live(client: Client, member: Any, workspace: Workspace) -> None:
    append(workspace=workspace, run_id="run_done", events=[started(), ev("RunCompleted")])
    client.force_login(member)
    html = client.get("/w/acme/support/runs/run_done/").content.decode()
    assert '<span id="live-status" data-state="finished">finished</span>' in html
    assert 'data-finished="1"' in html


def test_the_newest_caption_is_fetched_again_while_the_run_moves_and_reads_ended_after(
    client: Client, member: Any, workspace: Workspace
) -> None:
    append(workspace=workspace, run_id="run_moving", events=[started()])
    client.force_login(member)
    caption_url = "/w/acme/support/runs/run_moving/timeline/caption/"
    html = client.get("/w/acme/support/runs/run_moving/").content.decode()
    assert (
        f'<span class="muted" id="timeline-caption" data-live-src="{caption_url}">newest events, as they arrive</span>'
        in html
    )
    append(workspace=workspace, run_id="run_moving", events=[ev("RunCompleted")])
    # What the live page swaps in when the run ends: no longer live, no longer arriving.
    caption = client.get(caption_url, **HTMX).content.decode().strip()
    assert caption == '<span class="muted" id="timeline-caption">newest events</span>'
    assert (
        'id="timeline-caption">newest events</span>' in client.get("/w/acme/support/runs/run_moving/").content.decode()
    )


def test_rows_fragment_returns_just_the_rows_after(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    response = client.get(f"{BASE}timeline/rows/", {"after": 10})
    assert response.status_code == 200
    assert _sequences(response.content) == [11, 12, 13]
    assert response.content.decode().lstrip().startswith('<tr class="event"')
    assert response["X-Last-Sequence"] == "13"
    assert _sequences(client.get(f"{BASE}timeline/rows/", {"after": 2, "limit": 2}).content) == [3, 4]
    assert client.get(f"{BASE}timeline/rows/", {"after": 13}).content == b""


def test_the_row_template_is_the_same_for_page_and_fragment(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    page = client.get(BASE).content.decode()
    fragment = client.get(f"{BASE}timeline/rows/", {"after": 9, "limit": 1}).content.decode().strip()
    assert fragment in page


@pytest.mark.parametrize("query", ["?after=x", "?after=-1", "?limit=0", "?limit=5000", "?after=1.5"])
def test_bad_paging_is_a_readable_400(client: Client, member: Any, rich_run: str, query: str) -> None:
    client.force_login(member)
    for url in (f"{BASE}{query}", f"{BASE}timeline/rows/{query}"):
        response = client.get(url)
        assert response.status_code == 400 and b"must be" in response.content


# --- steps & replay plan ------------------------------------------------------------------------


def test_steps_tab_shows_steps_should_run_sessions_and_replay_readiness(
    client: Client, member: Any, rich_run: str
) -> None:
    client.force_login(member)
    html = client.get(f"{BASE}steps/", **HTMX).content.decode()
    extract = re.search(r'<tr class="step" data-step="extract">.*?</tr>', html, re.S).group(0)
    assert "status-completed" in extract and "no (reused)" in extract and "$0.000027" in extract
    score = re.search(r'<tr class="step" data-step="score">.*?</tr>', html, re.S).group(0)
    assert "status-running" in score and "<strong>yes</strong> (would run)" in score and "n/a" in score
    assert 'id="replay-ready" class="verdict verdict-fail"' in html
    assert "model:score:turn2:response" in html  # the unanswered call is what is missing
    assert html.count("replay from the record") == 2 and html.count("<strong>re-invoke</strong>") == 1
    assert "Ready to replay: <strong>no</strong>" in html and "replayReady" not in html  # words, not the field
    for check, label in (("dense_sequence", "dense sequence"), ("artifact_hashes", "artifact hashes")):
        assert f'<span class="check-name" data-check="{check}">{label}</span>' in html


def _step_rows(html: str) -> list[str]:
    return re.findall(r'<tr class="step" data-step="([^"]+)">', html)


def _session_steps(html: str) -> list[str]:
    return re.findall(r'<details class="session"[^>]*><summary><span class="mono">([^<]+)</span>', html)


def test_steps_tab_pages_by_position_and_shows_the_sessions_of_the_page_only(
    client: Client, member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.pages.run.STEPS_PAGE_SIZE", 5)
    _rich_run(workspace, extra_steps=10)  # extract, score, extra0..extra9
    client.force_login(member)
    url = f"{BASE}steps/"

    first = client.get(url).content.decode()
    assert _step_rows(first) == ["extract", "score", "extra0", "extra1", "extra2"]
    assert _session_steps(first) == ["extract", "score", "extra0", "extra1", "extra2"]
    assert "steps 1–5 of 12" in first
    assert (
        f'<a class="next" href="{url}?start=5" hx-get="{url}?start=5" hx-target="#tab-panel" hx-push-url="true">'
        in first
    )
    assert 'class="previous"' not in first
    assert 'id="replay-ready" class="verdict verdict-fail"' in first  # the plan is the whole run's

    second = client.get(url, {"start": 5}, **HTMX).content.decode()
    assert "<html" not in second
    assert _step_rows(second) == _session_steps(second) == [f"extra{n}" for n in range(3, 8)]
    assert f'<a class="previous" href="{url}?start=0"' in second and f'<a class="next" href="{url}?start=10"' in second
    assert "model:score:turn2:response" in second

    last = client.get(url, {"start": 10}).content.decode()
    assert _step_rows(last) == _session_steps(last) == ["extra8", "extra9"]
    assert "steps 11–12 of 12" in last and 'class="next"' not in last

    past = client.get(url, {"start": 50}).content.decode()
    assert _step_rows(past) == [] and "No steps on this page." in past and f'<a class="first" href="{url}"' in past


def test_a_run_of_one_page_of_steps_has_no_pager(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    for tab in ("steps", "costs"):
        html = client.get(f"{BASE}{tab}/").content.decode()
        assert "step-pager" not in html


@pytest.mark.parametrize("tab", ["steps", "costs"])
@pytest.mark.parametrize("start", ["-1", "x", "1.5"])
def test_a_bad_step_page_is_a_readable_400(client: Client, member: Any, rich_run: str, tab: str, start: str) -> None:
    client.force_login(member)
    response = client.get(f"{BASE}{tab}/", {"start": start})
    assert response.status_code == 400 and b"start must be" in response.content


# --- sub-runs -----------------------------------------------------------------------------------


def test_subrun_tree_at_any_depth_rolls_up_and_marks_failed_branches(
    client: Client, member: Any, workspace: Workspace
) -> None:
    def run(run_id: str, parent: str | None, *tail: dict[str, Any], model: dict[str, str] = MINI) -> None:
        extra = {"parentRunId": parent} if parent else {}
        append(
            workspace=workspace,
            run_id=run_id,
            events=[
                started(f"wf_{run_id}", **extra),
                ev("StepScheduled", stepPath="a"),
                *_model_events("a", 1, model, inp=1_000_000, out=0),
                *tail,
            ],
        )

    run("run_root", None, ev("RunCompleted"))
    run("run_ok", "run_root", ev("RunCompleted"))
    run("run_mid", "run_root", ev("RunCompleted"), model=UNPRICED)
    run("run_leaf", "run_mid", ev("RunFailed", error={"message": "boom"}))
    append(workspace=workspace, run_id="run_elsewhere", events=[started()])  # not family

    client.force_login(member)
    html = client.get("/w/acme/support/runs/run_root/subruns/").content.decode()
    assert "3 below this run" in html and "run_elsewhere" not in html
    for run_id in ("run_root", "run_ok", "run_mid", "run_leaf"):
        assert f'href="/w/acme/support/runs/{run_id}/">{run_id}</a>' in html
    nodes = {m.group(1): m.group(0) for m in re.finditer(r'<li class="subrun[^"]*" data-run-id="(\w+)">', html)}
    assert "branch-failed" in nodes["run_root"] and "branch-failed" in nodes["run_mid"]
    assert "branch-failed" in nodes["run_leaf"] and "branch-failed" not in nodes["run_ok"]
    assert html.count("✗ failed below") == 2  # root and mid: failed below, not themselves
    # gpt-4o-mini at $0.15 per 1M input tokens: root + ok + leaf priced, mid unpriced.
    assert 'cost $0.45 <span class="muted">3/4 priced (75%)</span>' in html
    mid = html.split('data-run-id="run_mid"')[1]
    assert 'cost $0.15 <span class="muted">1/2 priced (50%)</span>' in mid
    # A sub-run's own page shows the tree below it.
    assert "1 below this run" in client.get("/w/acme/support/runs/run_mid/subruns/").content.decode()


# --- evidence and reconcile -----------------------------------------------------------------------


@pytest.fixture
def in_doubt(workspace: Workspace, rich_run: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A write whose request left and whose lease then ran out: in doubt."""
    claim = gateway.claim_tool_call(
        workspace=workspace,
        run_id=RUN,
        call_id="call_pay",
        tool_name="pay",
        args={"amount": 5},
        effect="write",
        owner="worker-1",
    )
    gateway.mark_outbound(workspace=workspace, run_id=RUN, call_id="call_pay", lease_token=claim.lease_token)
    later = timezone.now() + timedelta(minutes=5)
    monkeypatch.setattr("ledger.clock.now", lambda: later)
    return "call_pay"


def test_evidence_tab_highlights_in_doubt_calls_and_lists_the_rest(
    client: Client, operator: Any, in_doubt: str
) -> None:
    client.force_login(operator)
    html = client.get(f"{BASE}evidence/", **HTMX).content.decode()
    assert '<tr class="tool-call in-doubt" data-call-id="call_pay">' in html and "⚠ 1 in doubt" in html
    assert f'<form class="reconcile-form" method="post" action="{BASE}tool-calls/call_pay/reconcile/"' in html
    assert "csrfmiddlewaretoken" in html
    assert "re-hashed" in html and "/content?workspace=acme/support" in html  # artifact, verified download
    assert "openai/gpt-4o-mini" in html and "acme-labs/house-model" in html  # costs per model call
    assert 'id="approvals">none<' in html


def test_the_replay_plan_shows_an_in_doubt_call_as_blocking(
    client: Client, viewer: Any, workspace: Workspace, in_doubt: str
) -> None:
    client.force_login(viewer)
    # Before the gateway has written it down (nobody touched the call since the lease ran out)...
    assert "⚠ in doubt: reconcile it first" in client.get(f"{BASE}steps/").content.decode()
    # ...and after, when the plan itself lists it as missing.
    assert gateway.settle_expired_claims(workspace=workspace, run_id=RUN) == ["call_pay"]
    html = client.get(f"{BASE}steps/").content.decode()
    assert "tool:call_pay:in_doubt" in html and "⚠ in doubt: reconcile it first" in html


def test_a_viewer_sees_no_reconcile_form_and_may_not_post_one(client: Client, viewer: Any, in_doubt: str) -> None:
    client.force_login(viewer)
    html = client.get(f"{BASE}evidence/").content.decode()
    assert "in-doubt" in html and "reconcile-form" not in html
    before = Event.objects.count()
    response = client.post(f"{BASE}tool-calls/call_pay/reconcile/", {"outcome": "succeeded", "note": "checked"})
    assert response.status_code == 403
    assert Event.objects.count() == before


def test_an_outsider_reconciling_gets_404(client: Client, outsider: Any, in_doubt: str) -> None:
    client.force_login(outsider)
    response = client.post(f"{BASE}tool-calls/call_pay/reconcile/", {"outcome": "succeeded", "note": "x"})
    assert response.status_code == 404


def test_an_operator_reconciles_through_the_gateway(
    client: Client, operator: Any, in_doubt: str, workspace: Workspace
) -> None:
    client.force_login(operator)
    assert 'id="resume-after-reconcile"' not in client.get(f"{BASE}evidence/").content.decode()
    response = client.post(
        f"{BASE}tool-calls/call_pay/reconcile/",
        {"outcome": "succeeded", "value": '{"paid": true}', "note": "bank says paid"},
    )
    assert response.status_code == 302 and response["Location"] == f"{BASE}evidence/"
    claim = ToolGatewayClaim.objects.get(call_id="call_pay")
    assert (claim.status, claim.result, claim.reconciled_by) == ("succeeded", {"paid": True}, "carol")
    last = Event.objects.filter(run__run_id=RUN).order_by("-sequence").first()
    assert last.type == "harness.tool_call.reconciled"
    html = client.get(f"{BASE}evidence/").content.decode()
    assert "reconcile-form" not in html and "reconciled</span>" in html
    # No dead end: the page says what continues the run, until something does.
    notice = re.search(r'<div class="notice" role="status" id="resume-after-reconcile">(.*?)</div>', html, re.S)
    assert notice and f"<code>ledger resume {RUN} --workspace acme/support</code>" in notice.group(1)
    append(workspace=workspace, run_id=RUN, events=[ev("custom.note", text="went on")])
    assert 'id="resume-after-reconcile"' not in client.get(f"{BASE}evidence/").content.decode()


def test_reconcile_over_htmx_answers_with_the_evidence_tab(client: Client, operator: Any, in_doubt: str) -> None:
    client.force_login(operator)
    response = client.post(
        f"{BASE}tool-calls/call_pay/reconcile/",
        {"outcome": "failed", "value": '{"message": "declined"}', "note": "bank says no"},
        **HTMX,
    )
    assert response.status_code == 200 and b"<html" not in response.content
    assert b"reconcile-form" not in response.content
    assert ToolGatewayClaim.objects.get(call_id="call_pay").error == {"message": "declined"}


@pytest.mark.parametrize(
    "data, message",
    [
        ({"outcome": "maybe", "note": "x"}, "Choose succeeded or failed."),
        ({"outcome": "succeeded", "note": ""}, "the note is required"),
        ({"outcome": "succeeded", "value": "{not json", "note": "x"}, "The result must be JSON"),
        ({"outcome": "failed", "value": "NaN", "note": "x"}, "error has no canonical JSON form"),
    ],
)
def test_a_bad_reconcile_form_is_re_rendered_with_a_message(
    client: Client, operator: Any, in_doubt: str, data: dict[str, str], message: str
) -> None:
    client.force_login(operator)
    before = Event.objects.count()
    for extra in ({}, HTMX):
        response = client.post(f"{BASE}tool-calls/call_pay/reconcile/", data, **extra)
        assert response.status_code == 400
        html = response.content.decode()
        assert message in html.replace("&#x27;", "'") and "reconcile-form" in html
    assert Event.objects.count() == before
    assert ToolGatewayClaim.objects.get(call_id="call_pay").status != "succeeded"


def test_reconciling_a_call_that_is_not_in_doubt_is_409_with_a_message(
    client: Client, operator: Any, workspace: Workspace, rich_run: str
) -> None:
    claim = gateway.claim_tool_call(
        workspace=workspace, run_id=RUN, call_id="call_ok", tool_name="read", args={}, effect="read", owner="w"
    )
    gateway.complete_tool_call(
        workspace=workspace,
        run_id=RUN,
        call_id="call_ok",
        lease_token=claim.lease_token,
        outcome="result",
        value={"ok": 1},
    )
    client.force_login(operator)
    response = client.post(f"{BASE}tool-calls/call_ok/reconcile/", {"outcome": "succeeded", "note": "x"})
    assert response.status_code == 409 and b"only a call in doubt can be reconciled" in response.content
    assert (
        client.post(f"{BASE}tool-calls/call_none/reconcile/", {"outcome": "succeeded", "note": "x"}).status_code == 404
    )


# --- costs ----------------------------------------------------------------------------------------


def test_costs_tab_per_step_and_per_model_with_coverage(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    html = client.get(f"{BASE}costs/", **HTMX).content.decode()
    per_model = html.split('id="costs-per-model"')[1]
    assert re.search(
        r"acme-labs/house-model</td><td class=\"num\">1</td>.*?<td>n/a</td><td>0/1 priced \(0%\)", per_model, re.S
    )
    assert re.search(
        r"openai/gpt-4o-mini</td><td class=\"num\">1</td>.*?<td>\$0.000027</td><td>1/1 priced \(100%\)", per_model, re.S
    )
    assert "Run total" in per_model and "1/2 priced (50%)" in per_model


def test_costs_tab_pages_its_steps_and_totals_the_whole_run(
    client: Client, member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.pages.run.STEPS_PAGE_SIZE", 5)
    _rich_run(workspace, extra_steps=10)
    client.force_login(member)
    html = client.get(f"{BASE}costs/", {"start": 5}, **HTMX).content.decode()
    per_step, per_model = html.split('id="costs-per-model"')
    assert re.findall(r'<tr><td class="mono">([^<]+)</td>', per_step) == [f"extra{n}" for n in range(3, 8)]
    assert "steps 6–10 of 12" in per_step and f'href="{BASE}costs/?start=10"' in per_step
    # Per model and in total: every call of the run, not the page's.
    assert re.search(r"openai/gpt-4o-mini</td><td class=\"num\">11</td><td class=\"num\">1,100</td>", per_model)
    assert re.search(r"Run total</th><td></td><td class=\"num\">1,200</td>.*?11/12 priced \(92%\)", per_model, re.S)


# --- feedback -------------------------------------------------------------------------------------


def test_a_member_rates_a_run_and_sees_it(client: Client, viewer: Any, rich_run: str) -> None:
    client.force_login(viewer)
    response = client.post(f"{BASE}feedback/", {"rating": "4", "category": "correctness", "comment": "good"})
    assert response.status_code == 302 and response["Location"] == f"{BASE}#feedback"
    row = Feedback.objects.get()
    assert (row.rating, row.category, row.comment, row.author) == (4, "correctness", "good", viewer)
    page = client.get(BASE).content.decode()
    assert "4.0/5 from 1 rating" in page and "correctness" in page
    assert "<td>4/5</td>" in client.get(f"{BASE}evidence/").content.decode()  # and in the evidence


def test_feedback_over_htmx_re_renders_the_feedback_section(client: Client, member: Any, rich_run: str) -> None:
    client.force_login(member)
    client.post(f"{BASE}feedback/", {"rating": "2"}, **HTMX)
    response = client.post(f"{BASE}feedback/", {"rating": "5", "comment": "fixed"}, **HTMX)
    assert response.status_code == 201
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="feedback"') and "3.5/5 from 2" in html and "fixed" in html
    # The header's summary is refreshed out of band.
    assert '<dd id="feedback-summary" hx-swap-oob="true">3.5/5 from 2 ratings</dd>' in html


def test_the_header_counts_and_averages_every_rating_but_lists_the_newest_in_one_query(
    client: Client, member: Any, rich_run: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count and the average ride on the newest rows (window aggregates, computed before the
    LIMIT): all three ratings counted, two listed; one query of the ratings (two before)."""
    monkeypatch.setattr("console.pages.run.FEEDBACK_SHOWN", 2)
    run = Run.objects.get(run_id=RUN)
    for rating, comment in ((1, "first"), (4, "second"), (5, "third")):
        record_feedback(run=run, rating=rating, comment=comment, author=member)
    client.force_login(member)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(BASE).content.decode()
    assert "3.3/5 from 3 ratings" in page
    listed = page.split('id="feedback-form"')[1]
    assert re.findall(r'class="feedback-item" data-rating="(\d)"', listed) == ["5", "4"]  # the newest two
    # (besides the header's one question whether the run has any: selectors.neighbourhood)
    assert len([q for q in queries if 'FROM "ledger_feedback"' in q["sql"] and "EXISTS(" not in q["sql"]]) == 1


@pytest.mark.parametrize("rating", ["", "0", "6", "x", "4.5"])
def test_a_bad_rating_is_400_with_a_message_and_nothing_stored(
    client: Client, member: Any, rich_run: str, rating: str
) -> None:
    client.force_login(member)
    for extra in ({}, HTMX):
        response = client.post(f"{BASE}feedback/", {"rating": rating}, **extra)
        assert response.status_code == 400 and b"Choose a rating from 1 to 5." in response.content
    assert not Feedback.objects.exists()


def test_an_outsider_cannot_rate(client: Client, outsider: Any, rich_run: str) -> None:
    client.force_login(outsider)
    assert client.post(f"{BASE}feedback/", {"rating": "1"}).status_code == 404
    assert not Feedback.objects.exists()


def test_anonymous_posts_are_sent_to_login(client: Client, rich_run: str) -> None:
    for url in (f"{BASE}feedback/", f"{BASE}tool-calls/x/reconcile/"):
        response = client.post(url, {"rating": "3"})
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert not Feedback.objects.exists()


def _calls_and_costs(workspace: Workspace, run_id: str, count: int) -> None:
    """A run of `count` steps, each with a model call and a tool call."""
    events = [started()]
    for n in range(count):
        step = f"s{n}"
        events += [
            ev("StepScheduled", stepPath=step),
            *_model_events(step, 1, MINI),
            ev("harness.tool_call.started", callId=f"t{n}", caller="model", toolName="search", args={"n": n}),
            ev("harness.tool_call.succeeded", callId=f"t{n}", result={"hits": n}, durationMs=1.0),
        ]
    append(workspace=workspace, run_id=run_id, events=[*events, ev("RunCompleted")])


def _listed(html: str) -> tuple[list[str], list[int]]:
    calls = re.findall(r'<tr class="tool-call" data-call-id="(t\d+)">', html)
    costs = [int(n) for n in re.findall(r'<tr><td class="num">(\d+)</td><td class="mono">openai/gpt-4o-mini', html)]
    return calls, costs


def test_the_evidence_tab_pages_its_tool_calls_and_costs_and_reads_as_much_for_a_long_run(
    client: Client, member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bundle lists every call and cost (20,000 of each at 100,000 events, 6 s to draw); the tab
    shows a page of each, its pager keeping the other list's place."""
    monkeypatch.setattr("console.pages.run.EVIDENCE_PAGE_SIZE", 3)
    _calls_and_costs(workspace, "run_few", 2)
    _calls_and_costs(workspace, "run_many", 8)
    client.force_login(member)
    few = client.get("/w/acme/support/runs/run_few/evidence/").content.decode()
    assert _listed(few)[0] == ["t0", "t1"] and len(_listed(few)[1]) == 2 and "next →" not in few

    base = "/w/acme/support/runs/run_many/evidence/"
    html = client.get(base, **HTMX).content.decode()
    calls, costs = _listed(html)
    assert calls == ["t0", "t1", "t2"] and len(costs) == 3 and costs == sorted(costs)
    assert "tool calls 1–3 of 8" in html and "model calls 1–3 of 8" in html
    assert f'href="{base}?calls=3"' in html
    next_costs = _link(html, "model calls", "next")
    assert next_costs.startswith(f"{base}?costs=") and next_costs.endswith("&calls=0")
    costs_cursor = parse_qs(urlsplit(next_costs).query)["costs"][0]
    page = client.get(base, {"calls": "6", "costs": costs_cursor}).content.decode()
    later_calls, later_costs = _listed(page)
    assert later_calls == ["t6", "t7"] and later_costs[0] > costs[-1] and len(later_costs) == 3
    assert "model calls 4–6 of 8" in page
    assert f'href="{base}?calls=3&amp;costs={costs_cursor}"' in page  # previous calls, the costs' place kept
    assert client.get(base, {"calls": "-1"}).status_code == 400
    few_url = "/w/acme/support/runs/run_few/evidence/"
    client.get(few_url)  # each run's counts are remembered for its head, as the long run's are by now
    assert _queries(client, base) == _queries(client, few_url)


def _link(html: str, what: str, rel: str) -> str:
    """The href of the `rel` link (first, previous, next) of the pager of `what` on the page."""
    pager = re.search(rf'<p class="bar step-pager">\s*<span class="muted">{what} .*?</p>', html, re.S)
    assert pager, what
    found = re.search(rf'<a class="{rel}" href="([^"]+)"', pager.group(0))
    return unescape(found.group(1)) if found else ""


def test_the_evidence_costs_pages_by_sequence_complete_and_without_overlap(
    client: Client, member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The costs pager reads a page after (or before) the sequence its cursor holds, never past an
    OFFSET of every entry before it: walked forward and back its pages hold every entry once, in
    sequence order, and a late page's query is a range of the (run, sequence) key."""
    monkeypatch.setattr("console.pages.run.EVIDENCE_PAGE_SIZE", 3)
    _calls_and_costs(workspace, "run_many", 8)
    run = Run.objects.get(workspace=workspace, run_id="run_many")
    every = list(CostEntry.objects.filter(run=run).order_by("sequence").values_list("sequence", flat=True))
    client.force_login(member)
    base = "/w/acme/support/runs/run_many/evidence/"
    url, pages, shown = base, [], []
    while url:
        with CaptureQueriesContext(connection) as queries:
            html = client.get(url).content.decode()
        pages.append(_listed(html)[1])
        shown.append(re.search(r"model calls (\d+–\d+) of 8", html).group(1))
        costs_sql = [q["sql"] for q in queries if 'FROM "ledger_costentry"' in q["sql"] and "LIMIT" in q["sql"]]
        assert len(costs_sql) == 1 and "OFFSET" not in costs_sql[0].upper(), costs_sql
        if len(pages) > 1:
            assert '"ledger_costentry"."sequence" >' in costs_sql[0]  # the key, not a count of rows
        url = _link(html, "model calls", "next")
    assert [s for page in pages for s in page] == every  # complete, in order, none twice
    assert [len(p) for p in pages] == [3, 3, 2] and shown == ["1–3", "4–6", "7–8"]
    # Back from the last page: the same pages, the previous one read before its first sequence.
    back, url = [], _link(html, "model calls", "previous")
    while url:
        html = client.get(url).content.decode()
        back.append(_listed(html)[1])
        url = _link(html, "model calls", "previous")
    assert back == pages[-2::-1]


def _plan(sql: str) -> str:
    """The database's plan of `sql` (PostgreSQL's with sequential scans off: a test's few rows are
    cheaper to read whole, and the question is which index a long run's page goes through)."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute(f"EXPLAIN {sql}")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return "\n".join(str(row) for row in cursor.fetchall())


def test_a_late_page_of_tool_calls_and_of_costs_goes_through_its_key_index(
    client: Client, member: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both pagers read by key: the calls a range of positions on (run, position), the costs a range
    of sequences on (run, sequence); the calls' range read every call of the run through the
    (run, call_id) index before migration 0047."""
    monkeypatch.setattr("console.pages.run.EVIDENCE_PAGE_SIZE", 3)
    _calls_and_costs(workspace, "run_many", 8)
    client.force_login(member)
    url = "/w/acme/support/runs/run_many/evidence/"
    for _ in range(2):
        url = _link(client.get(url).content.decode(), "model calls", "next")
    with CaptureQueriesContext(connection) as queries:
        html = client.get(url.replace("calls=0", "calls=6")).content.decode()
    assert _listed(html)[0] == ["t6", "t7"] and len(_listed(html)[1]) == 2
    calls = [q["sql"] for q in queries if 'FROM "ledger_toolcall"' in q["sql"] and '"position" >=' in q["sql"]]
    costs = [q["sql"] for q in queries if 'FROM "ledger_costentry"' in q["sql"] and "LIMIT" in q["sql"]]
    assert len(calls) == 1 and len(costs) == 1
    assert "tool_call_position_in_run" in _plan(calls[0])
    # SQLite names a unique constraint's index sqlite_autoindex_…: the key range says which it is.
    assert ("cost_entry_unique_in_run" if connection.vendor == "postgresql" else "sequence>?") in _plan(costs[0])


def test_a_costs_cursor_of_another_run_or_altered_is_a_400(
    client: Client, member: Any, outsider: Any, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("console.pages.run.EVIDENCE_PAGE_SIZE", 3)
    _calls_and_costs(workspace, "run_many", 8)
    _calls_and_costs(workspace, "run_other", 8)
    client.force_login(member)
    html = client.get("/w/acme/support/runs/run_many/evidence/").content.decode()
    cursor = parse_qs(urlsplit(_link(html, "model calls", "next")).query)["costs"][0]
    other = "/w/acme/support/runs/run_other/evidence/"
    for wrong in (cursor, cursor[:-2] + ("A" if cursor[-2] != "A" else "B") + cursor[-1], "3", "x" * 5000):
        response = client.get(other, {"costs": wrong})
        assert response.status_code == 400 and "This page link is broken" in response.content.decode()
    assert client.get("/w/acme/support/runs/run_many/evidence/", {"costs": cursor}).status_code == 200
    client.force_login(outsider)
    assert client.get("/w/acme/support/runs/run_many/evidence/", {"costs": cursor}).status_code == 404


def test_an_in_doubt_call_is_listed_first_with_one_reconcile_form(client: Client, operator: Any, in_doubt: str) -> None:
    client.force_login(operator)
    html = client.get(f"{BASE}evidence/").content.decode()
    doubtful = html.split('class="grid tool-calls in-doubt-calls"')[1].split("</table>")[0]
    assert 'data-call-id="call_pay"' in doubtful and "reconcile-form" in doubtful
    assert html.count('<form class="reconcile-form"') == 1
    assert html.count('data-call-id="call_pay"') == 2  # in doubt, and in its place among every call
    assert "reconcile it under <em>In doubt</em> above" in html


# --- query counts ---------------------------------------------------------------------------------


def _big_run(workspace: Workspace, run_id: str, total: int) -> None:
    append(workspace=workspace, run_id=run_id, events=[started()])
    batch = 2500
    for start in range(2, total + 1, batch):
        append(
            workspace=workspace,
            run_id=run_id,
            events=[ev("custom.tick", n=n) for n in range(start, min(start + batch, total + 1))],
        )


def _queries(client: Client, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    return len(queries)


@pytest.mark.parametrize("who", ["admin", "operator", "viewer"])
def test_a_run_page_asks_for_the_members_role_once(
    client: Client, workspace: Workspace, request: pytest.FixtureRequest, who: str
) -> None:
    """The header's actions, the cancel form, the share panel and the navigation read the role the
    page resolved."""
    append(workspace=workspace, run_id="run_roles", events=[started()])
    user = request.getfixturevalue(who)
    client.force_login(user)
    with CaptureQueriesContext(connection) as queries:
        response = client.get("/w/acme/support/runs/run_roles/")
    assert response.status_code == 200
    asked = [q["sql"] for q in queries if 'FROM "ledger_membership"' in q["sql"]]
    assert len(asked) == 1, asked
    body = response.content.decode()
    assert ("Cancel run" in body) is (who != "viewer")
    assert ('id="share-panel"' in body) is (who != "viewer")


def test_the_timeline_of_10000_events_takes_as_many_queries_as_100(
    client: Client, member: Any, workspace: Workspace, django_assert_num_queries: Callable[..., Any]
) -> None:
    _big_run(workspace, "run_small", 100)
    _big_run(workspace, "run_huge", 10_000)
    client.force_login(member)
    small = _queries(client, "/w/acme/support/runs/run_small/")
    with django_assert_num_queries(small):
        response = client.get("/w/acme/support/runs/run_huge/")
    assert _sequences(response.content) == list(range(9801, 10001))
    with django_assert_num_queries(_queries(client, "/w/acme/support/runs/run_small/timeline/rows/?after=0")):
        client.get("/w/acme/support/runs/run_huge/timeline/rows/?after=5000")


# Each run view's queries for a finished run, as its admin sees it, as last counted (issue 33: a
# short run's view costs mostly this floor). The session and its user, the member's workspaces with
# their memberships (one query: the named workspace is among them, and the navigation lists them),
# the run; the view's own reads; the header's (the RunStarted's outer loop and the timeline's jumps
# are remembered per head of the run, so a later request does not ask them; whether the run has
# sub-runs, re-execution requests or ratings is one query, and this run has none to list), the
# share panel's links; the navigation's badge (one query while no run of the workspace is going).
# Fewer is better: lower the figure with the change that saves a query; never raise it silently.
VIEW_QUERIES = {
    "": 8,  # the timeline
    "conversation/": 7,
    "waterfall/": 9,
    "state/?at=2": 9,
    "evidence/": 16,
    "steps/": 9,
    "costs/": 8,
}


@pytest.mark.parametrize("view", list(VIEW_QUERIES))
def test_each_run_view_of_a_finished_run_asks_no_more_queries_than_counted(
    client: Client, member: Any, workspace: Workspace, view: str
) -> None:
    append(
        workspace=workspace,
        run_id="run_done",
        events=[
            started(),
            ev("StepScheduled", stepPath="draft"),
            ev("StepCompleted", stepPath="draft", attempt=1, output={"ok": True}),
            ev("RunCompleted", output={"ok": True}),
        ],
    )
    client.force_login(member)
    url = f"/w/acme/support/runs/run_done/{view}"
    assert client.get(url).status_code == 200  # what a later request does not ask again is read
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200
    assert len(queries) == VIEW_QUERIES[view], "\n".join(q["sql"][:100] for q in queries)


@pytest.mark.parametrize("tab", ["steps", "costs"])
def test_a_page_of_a_many_page_run_takes_as_many_queries_as_a_one_page_run(
    client: Client,
    member: Any,
    workspace: Workspace,
    django_assert_num_queries: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    tab: str,
) -> None:
    monkeypatch.setattr("console.pages.run.STEPS_PAGE_SIZE", 20)
    _rich_run(workspace, "run_few", extra_steps=2)
    _rich_run(workspace, "run_many", extra_steps=150)
    client.force_login(member)
    small = _queries(client, f"/w/acme/support/runs/run_few/{tab}/")
    with django_assert_num_queries(small):
        response = client.get(f"/w/acme/support/runs/run_many/{tab}/", {"start": 60})
    assert "steps 61–80 of 152" in response.content.decode()


@pytest.mark.parametrize("tab", ["steps", "evidence", "costs", "subruns"])
def test_tabs_take_as_many_queries_for_a_large_run_as_for_a_small_one(
    client: Client, member: Any, workspace: Workspace, django_assert_num_queries: Callable[..., Any], tab: str
) -> None:
    _rich_run(workspace, "run_few", extra_steps=2)
    _rich_run(workspace, "run_many", extra_steps=120)
    # A sub-run of the small one too: the header reads a tree only for a run that has one.
    append(workspace=workspace, run_id="run_few_kid", events=[started(parentRunId="run_few")])
    for n in range(5):  # sub-runs for the tree
        append(workspace=workspace, run_id=f"run_kid{n}", events=[started(parentRunId="run_many")])
        append(workspace=workspace, run_id=f"run_grandkid{n}", events=[started(parentRunId=f"run_kid{n}")])
    client.force_login(member)
    small = _queries(client, f"/w/acme/support/runs/run_few/{tab}/")
    with django_assert_num_queries(small):
        client.get(f"/w/acme/support/runs/run_many/{tab}/")


@pytest.mark.parametrize("run_id", ["run_done", "run.with-dots_and:colons", "run é%20<x>"])
def test_the_tab_bars_links_are_each_tabs_own_address(workspace: Workspace, run_id: str) -> None:
    """The tab bar's links are built from the run's address (not reversed per tab): each is the
    address `run-tab` gives, whatever the run id holds."""
    from console.pages.run import TABS, _tab_url, _tabs
    from ledger.models import Run

    run = Run(workspace=workspace, run_id=run_id)
    assert [t["url"] for t in _tabs(run)] == [_tab_url(run, t) for t in TABS]


def test_the_header_asks_for_a_list_only_where_the_run_has_one(
    client: Client, member: Any, workspace: Workspace
) -> None:
    """One query says whether the run has sub-runs, re-execution requests naming it and ratings
    (selectors.neighbourhood); each turns on with its own row, and the header then lists it."""
    from ledger.reads import selectors

    append(workspace=workspace, run_id="run_lone", events=[started(), ev("RunCompleted", output={"ok": True})])
    run = Run.objects.select_related("workspace__tenant").get(run_id="run_lone")
    assert selectors.neighbourhood(run) == selectors.NOTHING_AROUND
    append(workspace=workspace, run_id="run_kid", events=[started(parentRunId="run_lone")])
    assert selectors.neighbourhood(run) == selectors.Neighbourhood(sub_runs=True, requests=False, ratings=False)
    record_feedback(run=run, rating=4, category="", comment="useful <1>", author=member)
    assert selectors.neighbourhood(run) == selectors.Neighbourhood(sub_runs=True, requests=False, ratings=True)
    client.force_login(member)
    html = client.get("/w/acme/support/runs/run_lone/").content.decode()
    assert "this run and 1 sub-run, so far" in html  # the tree, read because it has one
    assert "4.0/5 from 1" in html  # the ratings, read because it has one
    lone = client.get("/w/acme/support/runs/run_kid/").content.decode()
    assert 'id="run-tree-cost"' not in lone and "none yet" in lone
    feedback = "<h2>Feedback</h2>\n  {}\n"  # the evidence tab's ratings, listed where it has some
    rated = client.get("/w/acme/support/runs/run_lone/evidence/").content.decode()
    assert "<td>useful &lt;1&gt;</td>" in rated.split(feedback.format("")[:-1])[1]
    unrated = client.get("/w/acme/support/runs/run_kid/evidence/").content.decode()
    assert feedback.format('<p class="muted">none</p>') in unrated
    other = Run.objects.select_related("workspace__tenant").get(run_id="run_kid")
    assert selectors.neighbourhood(other) == selectors.NOTHING_AROUND  # its parent's rows are not its own
    # A run that names itself as its parent is among its own children (runlog.children_of lists
    # it; the waterfall draws what children_of gives), so its sub-runs are read, not assumed none.
    append(workspace=workspace, run_id="run_self", events=[started(parentRunId="run_self")])
    itself = Run.objects.select_related("workspace__tenant").get(run_id="run_self")
    assert selectors.neighbourhood(itself).sub_runs
