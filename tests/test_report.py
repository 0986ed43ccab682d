from __future__ import annotations

from typing import Any

import pytest

from ledger.fold import fold
from ledger.reads.report import locale_sort_key, render_report_table, usage_report
from tests.conftest import envelopes

MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}

# little-workflow.md §8, verbatim.
LITTLE_WORKFLOW_TABLE = """\
Run run_7f3a (completed)

STEP          IN  CACHED  CACHE%    OUT  CALLS  COST (USD)
---------  -----  ------  ------  -----  -----  ----------
classify     900       0    0.0%    120   0+1?         n/a
extract    20000   16000   80.0%  10000      1    0.007800
---------  -----  ------  ------  -----  -----  ----------
TOTAL      40900   16000   39.1%  20120   2+1?    0.016800

Note: 1 model call(s) had no registry pricing and are excluded from the cost above.
"""
SUMMARIZE_ROW = "summarize  20000       0    0.0%  10000      1    0.009000\n"


def step(path: str, usage: dict[str, int], model: dict[str, str] = MINI) -> list[tuple[str, dict[str, Any]]]:
    return [
        ("StepScheduled", {"stepPath": path}),
        ("StepAttemptStarted", {"stepPath": path, "attempt": 1}),
        (
            "harness.model.responded",
            {
                "stepPath": path,
                "turn": 1,
                "callId": f"mc_{path}",
                "model": model,
                "response": {"text": "ok", "usage": usage},
            },
        ),
        ("StepCompleted", {"stepPath": path, "attempt": 1, "output": "ok"}),
    ]


def report_for(run_id: str, *items: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return usage_report(
        fold(envelopes([("RunStarted", {"workflowVersionId": "wfver_1"}), *items, ("RunCompleted", {})], run_id=run_id))
    )


def run_7f3a() -> dict[str, Any]:
    return report_for(
        "run_7f3a",
        *step("extract", {"inputTokens": 20_000, "cachedInputTokens": 16_000, "outputTokens": 10_000}),
        *step("summarize", {"inputTokens": 20_000, "outputTokens": 10_000}),
        *step(
            "classify", {"inputTokens": 900, "outputTokens": 120}, model={"provider": "acme.chat", "modelId": "nope"}
        ),
    )


def test_report_breaks_dollars_down_per_step() -> None:
    report = run_7f3a()
    rows = {row["stepPath"]: row for row in report["steps"]}
    assert [row["stepPath"] for row in report["steps"]] == ["classify", "extract", "summarize"]
    assert rows["extract"] == {
        "stepPath": "extract",
        "status": "completed",
        "inputTokens": 20_000,
        "cachedInputTokens": 16_000,
        "outputTokens": 10_000,
        "reasoningTokens": 0,
        "cacheHitShare": 0.8,
        "costUsd": 0.0078,
        "pricedCalls": 1,
        "unpricedCalls": 0,
        "calls": 1,
    }
    assert (rows["summarize"]["costUsd"], rows["summarize"]["cacheHitShare"]) == (0.009, 0)
    assert (rows["classify"]["costUsd"], rows["classify"]["unpricedCalls"]) == (None, 1)
    assert report["total"]["costUsd"] == 0.0168  # $0.0078 + $0.009, exactly
    assert (report["total"]["pricedCalls"], report["total"]["unpricedCalls"], report["total"]["calls"]) == (2, 1, 3)
    assert report["hasUnpricedCalls"] is True
    assert "unattributed" not in report
    assert (report["runId"], report["status"]) == ("run_7f3a", "completed")


def test_table_is_little_workflows_table() -> None:
    table = render_report_table(run_7f3a())
    assert table == (
        "Run run_7f3a (completed)\n"
        "\n"
        "STEP          IN  CACHED  CACHE%    OUT  CALLS  COST (USD)\n"
        "---------  -----  ------  ------  -----  -----  ----------\n"
        "classify     900       0    0.0%    120   0+1?         n/a\n"
        "extract    20000   16000   80.0%  10000      1    0.007800\n"
        "summarize  20000       0    0.0%  10000      1    0.009000\n"
        "---------  -----  ------  ------  -----  -----  ----------\n"
        "TOTAL      40900   16000   39.1%  20120   2+1?    0.016800\n"
        "\n"
        "Note: 1 model call(s) had no registry pricing and are excluded from the cost above.\n"
    )
    # §8 totals three calls but lists two step rows, and its nine-dash STEP rule is the width
    # of "summarize": the notes dropped that row. Without it, the text is §8 to the byte.
    assert table.replace(SUMMARIZE_ROW, "") == LITTLE_WORKFLOW_TABLE


def test_lines_are_right_stripped_and_aligned() -> None:
    lines = render_report_table(run_7f3a()).splitlines()
    assert all(line == line.rstrip() for line in lines)
    table_lines = [line for line in lines[2:] if line and not line.startswith("Note")]
    assert len({len(line) for line in table_lines}) == 1


def test_one_input_token_renders_below_a_micro_dollar() -> None:
    report = report_for("run_tiny", *step("tiny", {"inputTokens": 1, "outputTokens": 0}))
    assert report["total"]["costUsd"] == pytest.approx(1.5e-7, abs=1e-15)
    table = render_report_table(report)
    assert "<0.000001" in table
    assert "0.000000" not in table
    assert len({len(line) for line in table.splitlines() if "<0.000001" in line}) == 1


def test_a_true_zero_renders_as_zero() -> None:
    report = report_for("run_zero", *step("free", {"inputTokens": 0, "outputTokens": 0}))
    assert report["total"]["costUsd"] == 0
    table = render_report_table(report)
    assert "0.000000" in table
    assert "<0.000001" not in table
    assert "Note:" not in table


def test_run_without_model_calls_costs_zero_not_null() -> None:
    report = report_for("run_idle", ("StepScheduled", {"stepPath": "wait"}))
    assert report["total"]["costUsd"] == 0
    assert report["hasUnpricedCalls"] is False


def test_calls_without_step_get_an_unattributed_row() -> None:
    report = report_for(
        "run_unattributed",
        (
            "harness.model.responded",
            {
                "turn": 1,
                "callId": "o",
                "model": MINI,
                "response": {"usage": {"inputTokens": 20_000, "outputTokens": 0}},
            },
        ),
        (
            "harness.model.responded",
            {
                "turn": 1,
                "callId": "s",
                "stepPath": "summarize",
                "model": MINI,
                "response": {"usage": {"inputTokens": 0, "outputTokens": 10_000}},
            },
        ),
    )
    assert report["unattributed"]["stepPath"] == "(unattributed)"
    assert report["unattributed"]["inputTokens"] == 20_000
    assert report["unattributed"]["costUsd"] == 0.003
    assert report["total"]["costUsd"] == 0.009
    table = render_report_table(report)
    assert table.splitlines()[5].startswith("(unattributed)  20000")


def test_an_unpriced_unattributed_call_is_null_in_its_row() -> None:
    report = report_for(
        "run_unpriced_orchestrator",
        (
            "harness.model.responded",
            {
                "turn": 1,
                "callId": "o",
                "model": {"provider": "acme", "modelId": "x"},
                "response": {"usage": {"inputTokens": 5}},
            },
        ),
        *step("work", {"inputTokens": 1_000_000}),
    )
    assert (report["unattributed"]["costUsd"], report["unattributed"]["unpricedCalls"]) == (None, 1)
    assert report["total"]["costUsd"] == 0.15
    assert render_report_table(report).endswith(
        "Note: 1 model call(s) had no registry pricing and are excluded from the cost above.\n"
    )


def test_steps_sort_like_javascript_locale_compare() -> None:
    paths = ["b", "B", "a", "10", "2", "_x", "fan[a]", "fan.visit[0]", "Extract", "extract"]
    assert sorted(paths, key=locale_sort_key) == [
        "_x",
        "10",
        "2",
        "a",
        "b",
        "B",
        "extract",
        "Extract",
        "fan.visit[0]",
        "fan[a]",
    ]
