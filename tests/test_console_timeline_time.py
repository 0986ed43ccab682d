"""The timeline with time in it (console/timeline.py): offsets from the run's start with
the absolute time on hover, a marked row for a silence (with why, when the log says), a one-line
summary of each payload, and the two events of one call grouped."""

from __future__ import annotations

import re

import pytest
from django.contrib.auth.models import User
from django.test import Client

from ledger.demo import load_demo
from ledger.log import append
from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db


def _timeline(client: Client, tenant: str, ws: str, run_id: str) -> str:
    response = client.get(f"/w/{tenant}/{ws}/runs/{run_id}/")
    assert response.status_code == 200
    return response.content.decode()


def test_the_crashed_and_resumed_demo_run_shows_its_twenty_minute_gap(client: Client) -> None:
    load_demo(history_runs=1, evaluations_too=False)
    client.force_login(User.objects.get(username="dave"))
    page = _timeline(client, "acme", "support", "run_demo_crashed_resumed")
    gaps = re.findall(r'<tr class="gap" data-before="(\d+)"><td colspan="6">.*?</span> ([^<]+)</td>', page)
    assert len(gaps) == 1
    before, text = gaps[0]
    assert re.fullmatch(r"20m 0\ds without events — executor died, resumed", text.strip()), text
    # the row after the gap is turn 2's answer, at an offset past twenty minutes
    answer = re.search(rf'<tr class="event" id="event-{before}"[^>]*data-pair="end">.*?</tr>', page, re.S)
    assert answer and "harness.model.responded" in answer.group(0)
    assert re.search(r'<time datetime="[^"]+" title="[^"]+ UTC">\+20m 0\ds</time>', answer.group(0))
    assert "turn 2 answered by openai/gpt-4o-mini · " in answer.group(0) and " out tokens" in answer.group(0)
    # the run that never stopped has no gap
    assert '<tr class="gap"' not in _timeline(client, "acme", "support", "run_demo_triage")


def test_offsets_summaries_and_call_pairs(browser: Client, workspace: Workspace) -> None:
    append(
        workspace=workspace,
        run_id="run_t",
        events=[
            started(),
            ev("StepScheduled", stepPath="draft"),
            ev("StepAttemptStarted", stepPath="draft", attempt=2),
            ev(
                "harness.tool_call.started",
                callId="c1",
                toolName="lookup_order",
                args={"id": 1},
                caller="model",
                turn=1,
                stepPath="draft",
            ),
            ev(
                "harness.tool_call.failed",
                callId="c1",
                error={"message": "no such order"},
                durationMs=3,
                stepPath="draft",
            ),
        ],
    )
    page = _timeline(browser, "acme", "support", "run_t")
    assert "<th>Time from start</th>" in page
    assert len(re.findall(r'<td class="mono ev-time"><time datetime="[^"]+" title="[^"]+">\+', page)) == 5
    assert '<span class="ev-summary">step draft · attempt 2 started</span>' in page
    assert '<span class="ev-summary">tool lookup_order c1 started</span>' in page
    assert '<span class="ev-summary">tool c1 failed: no such order</span>' in page
    assert re.search(r'<tr class="event" id="event-4" data-sequence="4" data-call="c1">', page)
    assert re.search(r'<tr class="event" id="event-5" data-sequence="5" data-call="c1" data-pair="end">', page)
    assert '<tr class="gap"' not in page  # written together: no silence


def test_an_outsider_gets_404_for_the_timeline(client: Client, workspace: Workspace, outsider: User) -> None:
    append(workspace=workspace, run_id="run_t", events=[started()])
    client.force_login(outsider)
    assert client.get("/w/acme/support/runs/run_t/").status_code == 404
    assert client.get("/w/acme/support/runs/run_t/timeline/?after=0").status_code == 404


def test_every_row_says_something_run_starts_ends_and_custom_events_too() -> None:
    from console.timeline import summary

    assert summary("RunStarted", {"workflowVersionId": "wf_1", "label": "nightly", "parentRunId": "run_p"}) == (
        "run started: wf_1 · nightly · sub-run of run_p"
    )
    assert summary("RunStarted", {"workflowVersionId": "wf_1"}) == "run started: wf_1"
    assert summary("RunCompleted", {"output": 1}) == "run completed"
    assert summary("RunCompleted", {"outputRef": "artifact://x"}) == "run completed · output in an artifact"
    assert summary("custom.note", {"text": "hi", "by": "me"}) == "custom event · by, text"
    assert summary("custom.big", {f"k{n}": n for n in range(6)}) == "custom event · k0, k1, k2, k3 and 2 more"
    assert summary("custom.empty", {}) == "custom event"
    assert summary("OuterLoopCycleCompleted", {"outerLoopId": "ol_1", "cycleNumber": 3}) == (
        "outer loop cycle 3 completed"
    )
