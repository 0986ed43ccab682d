"""The OTLP export of a run is the whole record, also where the log moved members of an oversized
payload into artifacts (docs/operations.md "Large payloads"): a tool call's long `args` and
`result` (`argsRef`, `resultRef`) and a model answer's long text (`response.textRef`) are read back
(artifacts.as_recorded, each re-hashed) and exported in full; a missing or changed one is an
integrity failure, never a span quietly without it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger.canonical import canonical_bytes
from ledger.log import artifacts
from ledger.models import Artifact, AuditEntry, Run, Workspace
from ledger.reads import selectors
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, started
from tests.otlp_support import attributes, parse_otlp_json

pytestmark = pytest.mark.django_db(transaction=True)

LONG_TEXT = "".join(f"Finding {n}: the parcel left depot {n % 7}.\n" for n in range(9000))
LONG_QUERY = "".join(f"order {n} or " for n in range(30_000))
BIG_RESULT = {"rows": [f"order {n} shipped" for n in range(20_000)]}


def _key(workspace: Workspace, scopes: list[str]) -> str:
    return create_key(workspace=workspace, scopes=scopes)[1]


def _long_run(append: Any) -> dict[str, dict[str, Any]]:
    append(
        "run_long",
        started("wfver_support"),
        ev("StepScheduled", stepPath="answer", stepId="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev(
            "harness.model.called",
            turn=1,
            promptHash="sha256:p",
            request={"model": "gpt-4o-mini"},
            stepPath="answer",
            callId="m1",
        ),
        ev(
            "harness.model.responded",
            turn=1,
            callId="m1",
            stepPath="answer",
            model={"provider": "openai", "modelId": "gpt-4o-mini"},
            response={
                "text": LONG_TEXT,
                "toolCalls": [{"id": "t1", "name": "lookup", "args": {"q": "all"}}],
                "usage": {"inputTokens": 40, "outputTokens": 90_000},
            },
        ),
        ev(
            "harness.tool_call.started",
            callId="t1",
            caller="agent",
            toolName="lookup",
            args={"q": LONG_QUERY},
            stepPath="answer",
        ),
        ev("harness.tool_call.succeeded", callId="t1", durationMs=12, result=BIG_RESULT, stepPath="answer"),
        ev("StepCompleted", stepPath="answer", attempt=1),
        ev("RunCompleted", output={"ok": True}),
    )
    stored = {e["type"]: e["payload"] for e in selectors.events(Run.objects.get(run_id="run_long"))}
    # What makes the case: each long value is an artifact, its ref in the event.
    assert "text" not in stored["harness.model.responded"]["response"]
    assert stored["harness.model.responded"]["response"]["textRef"].startswith("artifact://art_")
    assert "args" not in stored["harness.tool_call.started"] and "argsRef" in stored["harness.tool_call.started"]
    assert (
        "result" not in stored["harness.tool_call.succeeded"] and "resultRef" in stored["harness.tool_call.succeeded"]
    )
    return stored


def _spans(document: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_otlp_json(document)
    return {s.name: s for s in parsed.resource_spans[0].scope_spans[0].spans}


def test_an_export_carries_the_long_tool_args_result_and_answer_in_full(
    workspace: Workspace, other_workspace: Workspace, append: Any
) -> None:
    _long_run(append)
    with http_client(headers={"Authorization": f"Bearer {_key(workspace, ['read'])}"}) as client:
        response = client.get("/api/v1/runs/run_long/otlp")
    assert response.status_code == 200, response.text[:500]
    document = response.json()

    spans = _spans(document)
    tool, chat = attributes(spans["execute_tool lookup"]), attributes(spans["chat gpt-4o-mini"])
    assert json.loads(tool["gen_ai.tool.call.arguments"]) == {"q": LONG_QUERY}
    assert json.loads(tool["gen_ai.tool.call.result"]) == BIG_RESULT
    assert json.loads(chat["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": LONG_TEXT},
                {"type": "tool_call", "id": "t1", "name": "lookup", "arguments": {"q": "all"}},
            ],
        }
    ]
    assert (chat["gen_ai.usage.input_tokens"], chat["gen_ai.usage.output_tokens"]) == (40, 90_000)

    # Posted to another workspace's receiver, the trace is the same run with the same long values.
    theirs = _key(other_workspace, ["ingest", "read"])
    with http_client(headers={"Authorization": f"Bearer {theirs}"}) as client:
        assert client.post("/api/v1/otlp/v1/traces", json=document).json() == {}
    copy = Run.objects.get(workspace=other_workspace, run_id=f"run_otel_{spans['wfver_support'].trace_id.hex()}")
    back = {e["type"]: artifacts.as_recorded(copy, e["type"], e["payload"]) for e in selectors.events(copy)}
    assert back["harness.model.responded"]["response"]["text"] == LONG_TEXT
    assert back["harness.tool_call.started"]["args"] == {"q": LONG_QUERY}
    assert back["harness.tool_call.succeeded"]["result"] == BIG_RESULT


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_an_export_with_a_moved_member_missing_or_changed_is_an_integrity_failure(
    workspace: Workspace, append: Any, damage: str
) -> None:
    stored = _long_run(append)
    ref = stored["harness.tool_call.started"]["argsRef"]
    artifact = Artifact.objects.get(workspace=workspace, sha256=artifacts.parse_ref(ref))
    if damage == "missing":
        artifact.delete()
    else:
        (Path(settings.ARTIFACTS_ROOT) / artifact.storage_key).write_bytes(canonical_bytes({"q": "other"}))

    with http_client(headers={"Authorization": f"Bearer {_key(workspace, ['read'])}"}) as client:
        response = client.get("/api/v1/runs/run_long/otlp")

    assert response.status_code == 500
    error = response.json()["error"]
    assert error["code"] == "integrity_failure" and artifacts.parse_ref(ref) in error["message"]
    assert not AuditEntry.objects.filter(action="run.otlp_exported").exists()  # nothing was exported
