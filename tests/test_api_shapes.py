"""One source per shape: the OpenAPI serializers in console/api/schema.py describe exactly the
fields the code returns (ledger/reads/serialize.py, the evidence bundle, the replay plan, usage rows).

Schemathesis checks responses against the schema from outside; this checks the other way round,
field by field, so a field added to the code and forgotten in the schema fails here."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework import serializers

from console.api import schema
from ledger.log import append
from ledger.models import Artifact, Run, Workspace
from ledger.reads import attention, selectors, serialize
from ledger.reads.subruns import tree_usages
from ledger.reads.usage import usage_rows
from ledger.replay.evidence import evidence_bundle
from ledger.replay.feedback import record_feedback
from ledger.replay.stored_plan import replay_plan_for

pytestmark = pytest.mark.django_db


def _matches(shape: serializers.Serializer, data: Any, where: str) -> None:
    """Every required field present, no field the shape does not name; nested shapes likewise."""
    assert isinstance(data, dict), where
    fields = shape.fields
    required = {name for name, f in fields.items() if f.required}
    assert required <= set(data), f"{where}: missing {sorted(required - set(data))}"
    assert set(data) <= set(fields), f"{where}: undocumented {sorted(set(data) - set(fields))}"
    for name, value in data.items():
        field = fields[name]
        if value is None:
            assert field.allow_null, f"{where}.{name} is null"
        elif isinstance(field, serializers.ListSerializer):
            for i, item in enumerate(value):
                _matches(field.child, item, f"{where}.{name}[{i}]")
        elif isinstance(field, serializers.Serializer):
            _matches(field, value, f"{where}.{name}")


@pytest.fixture
def run(workspace: Workspace) -> Run:
    path = "answer"
    append(
        workspace=workspace,
        run_id="run_shapes",
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_s", "input": {"q": 1}}},
            {"type": "StepScheduled", "payload": {"stepPath": path}},
            {"type": "StepAttemptStarted", "payload": {"stepPath": path, "attempt": 1}},
            {
                "type": "harness.model.responded",
                "payload": {
                    "turn": 1,
                    "callId": "m1",
                    "stepPath": path,
                    "model": {"provider": "openai", "modelId": "gpt-4o"},
                    "response": {"usage": {"inputTokens": 10, "outputTokens": 5}},
                },
            },
            {
                "type": "harness.tool_call.started",
                "payload": {"callId": "t1", "caller": "model", "toolName": "search", "args": {}, "stepPath": path},
            },
            {"type": "harness.tool_call.succeeded", "payload": {"callId": "t1", "result": {}, "durationMs": 1}},
            {"type": "StepCompleted", "payload": {"stepPath": path, "attempt": 1, "output": {"big": "x" * 300_000}}},
            {"type": "RunCompleted", "payload": {"output": 1}},
        ],
    )
    append(
        workspace=workspace,
        run_id="run_shapes_sub",
        events=[{"type": "RunStarted", "payload": {"workflowVersionId": "w", "parentRunId": "run_shapes"}}],
    )
    found = Run.objects.select_related("workspace__tenant").get(workspace=workspace, run_id="run_shapes")
    record_feedback(run=found, rating=4, category="tone", comment="fine")
    return found


def test_run_and_run_list(run: Run) -> None:
    needs = attention.Attention(attention.RETRY_SCHEDULED, run.finished_at, {"stepPath": "s", "retryAt": "x"})
    trees = tree_usages(run.workspace, [run], {run.run_id: 1})
    _matches(schema.RunSerializer(), serialize.run(run, children=1, attention=needs, tree=trees[run.run_id]), "run")
    _matches(schema.RunSerializer(), serialize.run(run, children=1, attention=None, tree=trees[run.run_id]), "run")
    _matches(schema.RunListSerializer(), {"runs": serialize.runs([run], {}, {}, trees), "next": None}, "runs")


def test_events(run: Run) -> None:
    page = selectors.events(run)
    _matches(schema.EventsPageSerializer(), {"events": page, "lastSequence": run.last_sequence, "next": None}, "events")


def test_evidence_bundle(run: Run) -> None:
    bundle = evidence_bundle(run)
    assert bundle["steps"] and bundle["costs"] and bundle["toolCalls"] and bundle["artifacts"]
    assert bundle["feedback"] and bundle["subRuns"]
    _matches(schema.EvidenceSerializer(), bundle, "evidence")


def test_replay_plan(run: Run) -> None:
    _matches(schema.ReplayPlanSerializer(), replay_plan_for(run), "replayPlan")


def test_replay_plan_of_a_run_waiting_for_a_tool_approval(workspace: Workspace) -> None:
    """The plan gains `waitingApproval` while a call waits for an approver: the schema names it."""
    call = {"callId": "mail:call", "toolName": "send_email", "args": {"to": "ann"}, "argsDigest": "sha256:ab"}
    append(
        workspace=workspace,
        run_id="run_waits",
        events=[
            {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_w"}},
            {"type": "harness.tool_call.approval_requested", "payload": {**call, "stepPath": "send"}},
        ],
    )
    plan = replay_plan_for(Run.objects.get(workspace=workspace, run_id="run_waits"))
    assert plan["waitingApproval"] == [{**call, "stepPath": "send"}]
    _matches(schema.ReplayPlanSerializer(), plan, "replayPlan")


def test_artifact_and_feedback(run: Run) -> None:
    _matches(schema.ArtifactSerializer(), serialize.artifact(Artifact.objects.get(workspace=run.workspace)), "artifact")
    _matches(schema.FeedbackSerializer(), serialize.feedback(run.feedback.get(), run.run_id), "feedback")


def test_usage_report(run: Run) -> None:
    today = timezone.now().date()
    rows, total = usage_rows(group_by="model", start=today - timedelta(days=1), end=today, workspace=run.workspace)
    assert rows
    _matches(
        schema.UsageReportSerializer(),
        {
            "rows": [r.to_json() for r in rows],
            "total": {k: v for k, v in total.to_json().items() if k != "key"},
            "next": None,
        },
        "usage",
    )
