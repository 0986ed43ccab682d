"""The evidence bundle reads a run in a number of queries that does not grow with the run."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from ledger.log import append
from ledger.models import Run, Workspace
from ledger.replay.evidence import evidence_bundle
from ledger.replay.feedback import record_feedback

pytestmark = pytest.mark.django_db


def _run_with(workspace: Workspace, run_id: str, steps: int) -> Run:
    events: list[dict[str, Any]] = [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_q"}}]
    for i in range(steps):
        path = f"step{i}"
        events += [
            {"type": "StepScheduled", "payload": {"stepPath": path}},
            {"type": "StepAttemptStarted", "payload": {"stepPath": path, "attempt": 1}},
            {
                "type": "harness.model.responded",
                "payload": {
                    "turn": 1,
                    "callId": f"{path}-m",
                    "stepPath": path,
                    "model": {"provider": "openai", "modelId": "gpt-4o"},
                    "response": {"usage": {"inputTokens": 10, "outputTokens": 5}},
                },
            },
            {
                "type": "harness.tool_call.started",
                "payload": {
                    "callId": f"{path}-t",
                    "caller": "model",
                    "toolName": "search",
                    "args": {},
                    "stepPath": path,
                },
            },
            {"type": "harness.tool_call.succeeded", "payload": {"callId": f"{path}-t", "result": {}, "durationMs": 1}},
            {
                "type": "StepCompleted",
                "payload": {"stepPath": path, "attempt": 1, "output": {"big": str(i) * 300_000} if i % 3 == 0 else i},
            },
        ]
    append(workspace=workspace, run_id=run_id, events=events)
    for i in range(steps):
        append(
            workspace=workspace,
            run_id=f"{run_id}_sub{i}",
            events=[{"type": "RunStarted", "payload": {"workflowVersionId": "w", "parentRunId": run_id}}],
        )
    run = Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id=run_id)
    for i in range(steps):
        record_feedback(run=run, rating=1 + i % 5)
    return run


def _queries(run: Run) -> tuple[int, dict[str, Any]]:
    with CaptureQueriesContext(connection) as captured:
        bundle = evidence_bundle(run)
    return len(captured.captured_queries), bundle


def test_query_count_does_not_grow_with_the_run(workspace: Workspace) -> None:
    small_count, small = _queries(_run_with(workspace, "run_small", 1))
    big_count, big = _queries(_run_with(workspace, "run_big", 12))
    assert len(big["steps"]) == 12 and len(big["costs"]) == 12 and len(big["toolCalls"]) == 12
    assert len(big["artifacts"]) == 4 and len(big["subRuns"]) == 12 and len(big["feedback"]) == 12
    assert big["integrity"]["ok"] and small["integrity"]["ok"]
    assert big_count == small_count


def test_the_listed_rows_are_serialized_as_from_their_models(workspace: Workspace) -> None:
    """The bundle reads its steps, tool calls and cost entries as plain rows (on PostgreSQL with
    their timestamps formatted by the database): each serializes as its model instance does."""
    from ledger.models import CostEntry, Step, ToolCall
    from ledger.reads import serialize
    from ledger.replay.evidence import _rows

    run = _run_with(workspace, "run_rows", 3)
    for model, order, shape in (
        (Step, "position", serialize.step),
        (ToolCall, "position", serialize.tool_call),
        (CostEntry, "sequence", serialize.cost),
    ):
        instances = list(model.objects.filter(run=run).order_by(order))
        assert len(instances) == 3
        assert [shape(r) for r in _rows(model, run, order)] == [shape(i) for i in instances]
    assert any(serialize.step(s)["startedAt"] for s in _rows(Step, run, "position"))
