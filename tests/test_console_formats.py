"""One format everywhere (docs/operations.md "Words and numbers"): a run with known numbers — 12,345
input and 2,276 output tokens, a tool call of 21.5 ms, an artifact of 434,913 bytes — reads the
same on the run header, timeline, steps, costs, evidence, state at N and waterfall (bars and the
detail panel): tokens thousands separated, one duration format, sizes in KiB, money with its
currency; the batch and evaluation fragments print their money, tokens and durations the same
way. None of the raw forms ("12345", "21.5 ms", "434913 B") is left on a page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.template.loader import render_to_string
from django.test import Client

from ledger.log import append, artifacts
from ledger.models import Workspace
from tests.conftest import ev, started

pytestmark = pytest.mark.django_db

RUN = "run_numbers"
BASE = f"/w/acme/support/runs/{RUN}/"
SIZE = 434_913


def _numbers_run(workspace: Workspace) -> None:
    stored = artifacts.store_bytes(workspace, b"x" * SIZE, content_type="text/plain")
    append(
        workspace=workspace,
        run_id=RUN,
        events=[
            started(label="numbers"),
            ev("StepScheduled", stepPath="answer"),
            ev("StepAttemptStarted", stepPath="answer", attempt=1),
            ev(
                "harness.model.called",
                stepPath="answer",
                turn=1,
                callId="answer:turn1",
                promptHash=f"sha256:{1:064x}",
                request={"messages": [{"role": "user", "content": "count"}]},
            ),
            ev(
                "harness.model.responded",
                stepPath="answer",
                turn=1,
                callId="answer:turn1",
                model={"provider": "openai", "modelId": "gpt-4o-mini"},
                response={"text": "ok", "usage": {"inputTokens": 12345, "outputTokens": 2276}},
            ),
            ev(
                "harness.tool_call.started",
                stepPath="answer",
                callId="answer:c1",
                caller="model",
                turn=1,
                toolName="fetch_file",
                args={"name": "report"},
            ),
            ev(
                "harness.tool_call.succeeded",
                stepPath="answer",
                callId="answer:c1",
                result={"file": stored.ref},
                durationMs=21.5,
            ),
            ev("StepCompleted", stepPath="answer", attempt=1, output="done"),
            ev("RunCompleted", output={"ok": True}),
        ],
    )


@pytest.fixture
def numbers(workspace: Workspace) -> str:
    _numbers_run(workspace)
    return RUN


def _page(browser: Client, path: str) -> str:
    response = browser.get(path)
    assert response.status_code == 200, path
    return response.content.decode()


RAW = ("12345", "2276 ", ">2276<", "21.5 ms", "21.5", f"{SIZE} B", f">{SIZE}<")
# Each raw form as a number of its own: not the digits of a longer number or of a time of day
# (a timestamp's "04:29:21.512" holds "21.5" whenever the run is written in a 21st second).
_RAW_FORMS = [(raw, re.compile(r"(?<![\d.:])" + re.escape(raw) + r"(?![\d])")) for raw in RAW]


def _no_raw(html: str, path: str) -> None:
    """No raw number outside the payloads shown as JSON (which keep the log's exact values)."""
    text = re.sub(r'<pre class="mono json">.*?</pre>', "", html, flags=re.S)
    assert [raw for raw, form in _RAW_FORMS if form.search(text)] == [], path


def test_run_views_print_tokens_durations_sizes_and_money_in_one_format(browser: Client, numbers: str) -> None:
    header = _page(browser, BASE)
    assert "12,345 in · 2,276 out" in header  # the header's tokens
    assert "$" in header.split('id="run-tree-cost"')[0].split("<dt>Cost</dt>")[1][:40]  # money with currency
    _no_raw(header, BASE)

    steps = _page(browser, BASE + "steps/")
    assert '<td class="num">12,345</td><td class="num">2,276</td>' in steps
    _no_raw(steps, "steps")

    costs = _page(browser, BASE + "costs/")
    assert '<td class="num">12,345</td><td class="num">2,276</td>' in costs
    _no_raw(costs, "costs")

    evidence = _page(browser, BASE + "evidence/")
    assert '<td class="num">21 ms</td>' in evidence  # not "21.5 ms": the one duration format
    assert f'<span title="{SIZE:,} bytes">424.7 KiB</span>' in evidence
    assert '<td class="num">12,345</td><td class="num">2,276</td>' in evidence
    _no_raw(evidence, "evidence")

    state = _page(browser, BASE + "state/")
    assert "12,345 in (0 cached) / 2,276 out" in state
    _no_raw(state, "state")

    waterfall = _page(browser, BASE + "waterfall/")
    assert "12,345 in / 2,276 out" in waterfall
    _no_raw(waterfall, "waterfall")

    detail = _page(browser, BASE + "waterfall/detail/?kind=step&id=answer")
    assert "12,345 in / 2,276 out tokens" in detail
    _no_raw(detail, "waterfall detail")

    timeline = _page(browser, BASE + "timeline/")
    assert "12,345 in / 2,276 out tokens" in timeline
    _no_raw(timeline, "timeline")


def _report(cost_before: str, cost_after: str) -> dict[str, Any]:
    return {
        "counts": {"identical": 3, "changed": 1, "new": 0, "missing": 0},
        "firstDivergence": None,
        "original": {"costUsd": cost_before},
        "new": {"costUsd": cost_after},
    }


def test_batch_rows_print_costs_with_their_currency() -> None:
    html = render_to_string(
        "console/approvals/batch_body.html",
        {
            "total": 1200,
            "first": {"model_overrides": {}, "requested_by": "alice", "reason": "cheaper", "status": "completed"},
            "rows": [
                {"rx": {"original_run_id": "run_a", "status": "completed"}, "report": _report("0.0021", "1234.5")}
            ],
        },
    )
    assert "1,200 runs" in html
    assert '<td class="num">$0.0021</td>' in html and '<td class="num">$1,234.50</td>' in html
    assert ">0.0021<" not in html


def test_evaluation_report_prints_money_tokens_and_durations_in_one_format() -> None:
    row = {
        "runId": "run_a",
        "outcome": "kept",
        "scores": {},
        "cost_before": "$0.0021",
        "cost_after": "$0.0019",
        "tokens": {"before": 113776, "after": 2276},
        "durationMs": {"before": 1234.0, "after": 21.5},
    }
    html = render_to_string(
        "console/evaluations/report.html",
        {"aggregates": {"spendUsd": "12.5", "costDelta": None, "latencyDelta": None}, "runs": [row], "report": {}},
    )
    assert "spend $12.50" in html
    assert "113,776 → 2,276" in html
    assert "1.2 s → 21 ms" in html
    assert "113776" not in html and "1234" not in html


def test_evaluation_report_prints_relative_changes_as_percentages() -> None:
    """after / before − 1 as a person reads it: 5.195 is "+520 % (×6.20)", never "5.195 relative"."""
    aggregates = {"spendUsd": "0.02527", "costDelta": 5.195, "latencyDelta": -0.066}
    html = render_to_string("console/evaluations/report.html", {"aggregates": aggregates, "runs": [], "report": {}})
    assert "+520 % (×6.20)" in html and "−6.6 %" in html
    assert "relative" not in html and "5.195" not in html
    none = {"spendUsd": "0", "costDelta": None, "latencyDelta": 0.0}
    html = render_to_string("console/evaluations/report.html", {"aggregates": none, "runs": [], "report": {}})
    assert "n/a" in html and "no change" in html


class _Evaluation:
    public_id = "ev_1"
    status = "pending_approval"
    verdict = ""
    requested_by = "carol"

    class dataset_version:  # noqa: N801 - the attribute path the template reads
        number = 2

        class dataset:  # noqa: N801
            name = "triage-golden"


def test_evaluation_rows_print_spend_as_money_and_status_as_words() -> None:
    row = {"e": _Evaluation(), "url": "/e/", "models": "a→b", "pass_rate": None, "changed": None, "spend": "0.5"}
    html = render_to_string("console/evaluations/rows.html", {"rows": [row], "fragment_url": "/f/", "live": False})
    assert '<td class="num" data-label="Spend">$0.50</td>' in html  # to the cent at least, as $5.00 beside it
    assert ">waiting for approval</span>" in html and ">pending_approval<" not in html


def test_batch_comparison_counts_of_nothing_are_not_coloured_as_warnings() -> None:
    """A run whose re-execution changed nothing shows "≠ 0" and "− 0" muted, not amber and red."""
    report = {
        "counts": {"identical": 7, "changed": 0, "new": 0, "missing": 2},
        "original": {"costUsd": 0.0021},
        "new": {"costUsd": 0.0019},
    }
    row = {"rx": {"original_run_id": "run_a", "status": "succeeded"}, "report": report, "kept": True}
    html = render_to_string("console/approvals/batch_body.html", {"rows": [row], "total": 1, "first": {}})
    assert '<span class="dv dv-identical">7</span>' in html and '<span class="dv dv-missing">2</span>' in html
    assert '<span class="dv dv-changed dv-none">0</span>' in html and '<span class="dv dv-new dv-none">0</span>' in html
