"""`ledger demo`: the demo tenants, members and a few recorded runs (idempotent).

The runs here are appended through the one write path, like any harness would. The runtime
(issue 5) will replace them with runs it actually executes.
"""

from __future__ import annotations

from typing import Any

from .append import append_events
from .canonical import digest
from .models import Run, Workspace
from .tenancy import bootstrap, create_user

DEMO_PASSWORD = "runledger-demo"
USERS = [("alice", "admin"), ("bob", "approver"), ("carol", "operator"), ("dave", "viewer")]


def _model_turn(step: str, turn: int, model: tuple[str, str], tokens: tuple[int, int, int]) -> list[dict[str, Any]]:
    request = {"model": model[1], "messages": [{"role": "user", "content": f"{step} turn {turn}"}]}
    return [
        {"type": "harness.model.called", "payload": {"turn": turn, "stepPath": step,
                                                     "promptHash": digest(request), "request": request}},
        {"type": "harness.model.responded", "payload": {
            "turn": turn, "callId": f"{step}-m{turn}", "stepPath": step,
            "model": {"provider": model[0], "modelId": model[1]},
            "response": {"text": f"answer for {step}",
                         "usage": {"inputTokens": tokens[0], "cachedInputTokens": tokens[1],
                                   "outputTokens": tokens[2]}}}},
    ]


def _summarize_run(model: tuple[str, str], finish: bool) -> list[dict[str, Any]]:
    manifest = {"harnessId": "runledger.demo", "modelSlot": model[1], "tools": ["search"]}
    events: list[dict[str, Any]] = [
        {"type": "RunStarted", "payload": {"workflowVersionId": "wfver_support_summarize",
                                           "input": {"ticket": 4711}, "label": "support.summarize"}},
        {"type": "StepScheduled", "payload": {"stepPath": "summarize"}},
        {"type": "StepAttemptStarted", "payload": {"stepPath": "summarize", "attempt": 1}},
        {"type": "harness.session.started", "payload": {
            "stepPath": "summarize", "role": "worker.ai-generate", "task": {"kind": "execute_step"},
            "manifest": manifest, "manifestHash": digest(manifest)}},
        *_model_turn("summarize", 1, model, (1200, 800, 150)),
        {"type": "harness.tool_call.started", "payload": {
            "callId": "summarize-t1", "caller": "model", "turn": 1, "toolName": "search",
            "args": {"q": "ticket 4711"}, "stepPath": "summarize",
            "headers": {"Authorization": "Bearer sk-demo-secret"}}},
        {"type": "harness.tool_call.succeeded", "payload": {
            "callId": "summarize-t1", "result": {"hits": 3}, "durationMs": 42, "stepPath": "summarize"}},
        *_model_turn("summarize", 2, model, (1600, 1200, 220)),
    ]
    if finish:
        events += [
            {"type": "harness.session.completed", "payload": {"stepPath": "summarize"}},
            {"type": "StepCompleted", "payload": {"stepPath": "summarize", "attempt": 1,
                                                  "output": {"summary": "Customer cannot log in."}}},
            {"type": "RunCompleted", "payload": {"output": {"summary": "Customer cannot log in."}}},
        ]
    return events


DEMO_RUNS: list[tuple[str, str, str, list[dict[str, Any]]]] = [
    ("acme", "support", "run_demo_summarize", _summarize_run(("openai", "gpt-4o-mini"), finish=True)),
    ("acme", "support", "run_demo_in_progress", _summarize_run(("anthropic", "claude-sonnet-4-6"), finish=False)),
    ("acme", "research", "run_demo_unpriced", _summarize_run(("acme.chat", "house-model"), finish=True)),
    ("globex", "main", "run_demo_globex", _summarize_run(("openai", "gpt-4o"), finish=True)),
]


def load_demo() -> str:
    for tenant, workspace in [("acme", "support"), ("acme", "research"), ("globex", "main")]:
        bootstrap(tenant=tenant, workspace=workspace)
    for username, role in USERS:
        create_user(username=username, tenant="acme", role=role, password=DEMO_PASSWORD)
    create_user(username="gina", tenant="globex", role="admin", password=DEMO_PASSWORD)
    created = 0
    for tenant, workspace, run_id, events in DEMO_RUNS:
        ws = Workspace.objects.get(tenant__slug=tenant, slug=workspace)
        if not Run.objects.filter(workspace=ws, run_id=run_id).exists():
            append_events(workspace=ws, run_id=run_id, events=events)
            created += 1
    return f"{created} run(s) created, {len(DEMO_RUNS) - created} already present"
