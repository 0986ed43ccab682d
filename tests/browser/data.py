"""Runs for the browser tests, written through the ledger's own services (append, tool gateway)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from ledger import log
from ledger.models import Workspace
from ledger.replay import gateway
from tests import conftest
from tests.conftest import ev


def started(workflow: str = "wfver_support_triage", **extra: Any) -> dict[str, Any]:
    return conftest.started(workflow, **extra)


def step(path: str, n: int = 1) -> list[dict[str, Any]]:
    return [ev("StepScheduled", stepPath=path), ev("StepAttemptStarted", stepPath=path, attempt=n)]


def model_call(step_path: str, turn: int, provider: str, model: str, tokens: tuple[int, int]) -> list[dict[str, Any]]:
    call_id = f"mc_{step_path}_{turn}"
    return [
        ev(
            "harness.model.called",
            turn=turn,
            promptHash=f"sha256:{turn:064x}",
            stepPath=step_path,
            request={"messages": [{"role": "user", "content": f"turn {turn} of {step_path}"}]},
        ),
        ev(
            "harness.model.responded",
            turn=turn,
            callId=call_id,
            stepPath=step_path,
            model={"provider": provider, "modelId": model},
            response={"text": f"answer {turn}", "usage": {"inputTokens": tokens[0], "outputTokens": tokens[1]}},
        ),
    ]


def append(workspace: Workspace, run_id: str, *events: dict[str, Any]) -> None:
    log.append(workspace=workspace, run_id=run_id, events=list(events))


def running_run(workspace: Workspace, run_id: str) -> None:
    """Started and one step in: status running."""
    append(workspace, run_id, started(label="live one"), *step("extract"))


def priced_run(workspace: Workspace, run_id: str, provider: str, model: str, *, finish: bool = True) -> None:
    events = [
        started(label=f"{provider} run"),
        *step("answer"),
        *model_call("answer", 1, provider, model, (1200, 300)),
        ev("StepCompleted", stepPath="answer", attempt=1, output={"text": "done"}),
    ]
    if finish:
        events.append(ev("RunCompleted", output={"ok": True}))
    append(workspace, run_id, *events)


def in_doubt_call(workspace: Workspace, run_id: str, call_id: str = "call_refund") -> None:
    """A write tool call whose request left and whose lease then ran out: the gateway's in doubt.
    The gateway reads ledger.clock.now in this process only, so moving it here is enough."""
    claimed = gateway.claim_tool_call(
        workspace=workspace,
        run_id=run_id,
        call_id=call_id,
        tool_name="issue_refund",
        args={"order": 1042, "amountUsd": 19.9},
        effect="write",
        owner="worker-1",
        idempotency_key=call_id,
        step_path="refund",
    )
    gateway.mark_outbound(workspace=workspace, run_id=run_id, call_id=call_id, lease_token=claimed.lease_token)
    later = timezone.now() + timedelta(seconds=3600)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("ledger.clock.now", lambda: later)
        with pytest.raises(gateway.ToolCallInDoubt):
            gateway.claim_tool_call(
                workspace=workspace,
                run_id=run_id,
                call_id=call_id,
                tool_name="issue_refund",
                args={"order": 1042, "amountUsd": 19.9},
                effect="write",
                owner="worker-2",
                idempotency_key=call_id,
            )


def succeeded_call(workspace: Workspace, run_id: str, call_id: str = "call_lookup") -> None:
    claimed = gateway.claim_tool_call(
        workspace=workspace,
        run_id=run_id,
        call_id=call_id,
        tool_name="lookup_order",
        args={"order": 1042},
        effect="read",
        owner="worker-1",
        idempotency_key=call_id,
        step_path="lookup",
    )
    gateway.mark_outbound(workspace=workspace, run_id=run_id, call_id=call_id, lease_token=claimed.lease_token)
    gateway.complete_tool_call(
        workspace=workspace,
        run_id=run_id,
        call_id=call_id,
        lease_token=claimed.lease_token,
        outcome="result",
        value={"status": "delivered", "total": 19.9},
    )


def showcase(workspace: Workspace) -> str:
    """A run with something on every tab: steps with model calls of two providers (one unpriced),
    a finished and an in-doubt tool call, and sub-runs two levels deep, one branch failed."""
    run_id = "run_showcase"
    append(
        workspace,
        run_id,
        started(label="refund order 1042", input={"order": 1042, "customer": "c_77"}),
        *step("classify"),
        *model_call("classify", 1, "openai", "gpt-4o-mini", (1800, 120)),
        ev("StepCompleted", stepPath="classify", attempt=1, output={"intent": "refund"}),
        *step("lookup"),
    )
    succeeded_call(workspace, run_id)
    append(
        workspace,
        run_id,
        ev("StepCompleted", stepPath="lookup", attempt=1, output={"status": "delivered"}),
        *step("decide"),
        *model_call("decide", 1, "anthropic", "claude-sonnet-4-6", (4200, 650)),
        *model_call("decide", 2, "acme-labs", "house-model", (900, 80)),
        ev("StepCompleted", stepPath="decide", attempt=1, output={"refund": True}),
        *step("refund"),
    )
    in_doubt_call(workspace, run_id)

    child = "run_showcase_notify"
    append(
        workspace,
        child,
        started("wfver_notify", parentRunId=run_id, label="notify customer"),
        *step("draft"),
        *model_call("draft", 1, "openai", "gpt-4o-mini", (600, 220)),
        ev("StepCompleted", stepPath="draft", attempt=1, output={"sent": True}),
        ev("RunCompleted", output={"ok": True}),
    )
    grandchild = "run_showcase_sms"
    append(
        workspace,
        grandchild,
        started("wfver_sms", parentRunId=child, label="sms fallback"),
        *step("send"),
        ev("StepFailed", stepPath="send", attempt=1, error={"message": "gateway timeout"}),
        ev("RunFailed", error={"message": "sms provider unreachable"}),
    )
    audit = "run_showcase_audit"
    append(
        workspace,
        audit,
        started("wfver_audit", parentRunId=run_id, label="audit trail"),
        *step("record"),
        ev("StepCompleted", stepPath="record", attempt=1, output={"ok": True}),
        ev("RunCompleted"),
    )
    return run_id
