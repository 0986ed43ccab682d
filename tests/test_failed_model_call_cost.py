"""A run's model call that failed after its request left (`harness.model.failed` with
`requestLeft: true`) may have been billed, for an amount nobody recorded: it counts as an unpriced
call (unknown cost, never $0) in the fold, so in the cost entries, the run's `usage` and
`treeUsage`, the usage report, the console's coverage, and `ledger verify` / `rebuild` agree.
A failure before anything was sent, and a log that does not say, cost nothing (docs/operations.md
§ Prices). On SQLite and PostgreSQL."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.test import Client

from ledger.models import CostEntry, DailyUsage, Run, Step, Workspace
from ledger.runtime.executor import start_run
from ledger.runtime.model import ModelRequest
from ledger.runtime.providers import ScriptedProvider
from ledger.runtime.registry import AIGenerate, ModelPolicy, Workflow
from ledger.tenancy.services import create_key
from tests.conftest import ledger_cli, started
from tests.runtime_support import every_run_verifies, run_events  # noqa: F401  (an autouse fixture)

pytestmark = pytest.mark.django_db
MINI = {"provider": "openai", "modelId": "gpt-4o-mini"}


def called(call: str) -> dict[str, Any]:
    return {
        "type": "harness.model.called",
        "payload": {"turn": 1, "callId": call, "stepPath": "ask", "promptHash": "sha256:0", "request": {}},
    }


def failed(call: str, **extra: Any) -> dict[str, Any]:
    error = {"name": "ProviderError", "message": "502 from the provider"}
    payload = {"turn": 1, "callId": call, "stepPath": "ask", "model": MINI, "error": error, **extra}
    return {"type": "harness.model.failed", "payload": payload}


def answered(call: str) -> dict[str, Any]:
    response = {"text": "ok", "usage": {"inputTokens": 10_000, "outputTokens": 2_000}}
    payload = {"turn": 1, "callId": call, "stepPath": "ask", "model": MINI, "response": response}
    return {"type": "harness.model.responded", "payload": payload}


def _rows() -> dict[str, Any]:
    return {
        "entries": sorted(
            CostEntry.objects.values_list("run__run_id", "sequence", "cost_usd", "usage_reported", "input_tokens")
        ),
        "runs": sorted(Run.objects.values_list("run_id", "cost_usd", "priced_calls", "unpriced_calls")),
        "steps": sorted(Step.objects.values_list("run__run_id", "step_path", "priced_calls", "unpriced_calls")),
        "days": sorted(DailyUsage.objects.values_list("model_id", "cost_usd", "calls", "priced_calls")),
    }


def test_a_call_that_failed_after_its_request_left_is_of_unknown_cost(
    workspace: Workspace, client: Client, browser: Client
) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    headers = {"HTTP_AUTHORIZATION": f"Bearer {key}"}

    def post(run_id: str, *events: dict[str, Any]) -> None:
        response = client.post(
            f"/api/v1/runs/{run_id}/events", {"events": list(events)}, content_type="application/json", **headers
        )
        assert response.status_code == 200, response.content

    post(
        "run_failed",
        started("wf_flaky"),
        called("c1"),
        failed("c1", requestLeft=True),  # it left: the provider may bill it
        called("c2"),
        failed("c2", requestLeft=False),  # refused before it left: nothing is owed
        called("c3"),
        failed("c3"),  # a harness that does not say: as before, nothing
        called("c4"),
        answered("c4"),
    )
    post(
        "run_failed_child", started("wf_flaky", parentRunId="run_failed"), called("k1"), failed("k1", requestLeft=True)
    )

    run = client.get("/api/v1/runs/run_failed", **headers).json()
    assert {k: run["usage"][k] for k in ("costUsd", "pricedCalls", "unpricedCalls", "inputTokens")} == {
        "costUsd": 0.0027,
        "pricedCalls": 1,
        "unpricedCalls": 1,
        "inputTokens": 10_000,
    }
    assert (run["treeUsage"]["pricedCalls"], run["treeUsage"]["unpricedCalls"]) == (1, 2)
    costs = client.get("/api/v1/runs/run_failed/evidence", **headers).json()["costs"]
    assert [(c["callId"], c["costUsd"], c["unpricedReason"], c["inputTokens"]) for c in costs] == [
        ("c1", None, "usage_not_reported", 0),
        ("c4", 0.0027, None, 10_000),
    ]
    usage = client.get("/api/v1/usage", {"groupBy": "model"}, **headers).json()
    assert (usage["total"]["pricedCalls"], usage["total"]["unpricedCalls"]) == (1, 2)
    step = Step.objects.get(run__run_id="run_failed", step_path="ask")
    assert (step.priced_calls, step.unpriced_calls) == (1, 1)

    page = browser.get("/w/acme/support/runs/run_failed/").content.decode()
    assert '$0.0027 <span class="muted">1/2 priced (50%)</span>' in page

    # The projections written by the appends are the fold's: verify passes, a rebuild writes the same.
    written = _rows()
    assert ledger_cli("verify")[0] == 0
    assert ledger_cli("rebuild")[0] == 0
    assert _rows() == written
    assert ledger_cli("reprice")[0] == 0
    assert _rows() == written  # no price makes the unknown known
    assert Run.objects.get(run_id="run_failed").cost_usd == Decimal("0.0027")


class RefusedHere(Exception):
    request_left = False  # what a provider raises when it sent nothing (ledger.runtime.model.request_left)


def test_the_runtime_records_whether_the_request_left_and_counts_it(workspace: Workspace) -> None:
    tries: list[int] = []

    def script(request: ModelRequest) -> dict[str, Any]:
        tries.append(request.turn)
        if len(tries) == 1:
            raise ConnectionResetError("the provider hung up after reading the request")
        if len(tries) == 2:
            raise RefusedHere("the request was refused before it left")
        return {"text": "answered", "usage": {"inputTokens": 10_000, "outputTokens": 2_000}}

    wf = Workflow(
        name="flaky_model",
        steps=(AIGenerate("ask", "hello"),),
        models={"default": ScriptedProvider(script=script, name="openai", model_id="gpt-4o-mini")},
        model_policies={"default": ModelPolicy(retries=2)},
    )
    outcome = start_run(workspace=workspace, workflow=wf, input={})

    assert outcome.status == "completed"
    failures = [e["payload"] for e in run_events(workspace, outcome.run_id) if e["type"] == "harness.model.failed"]
    assert [(f["error"]["name"], f["requestLeft"]) for f in failures] == [
        ("ConnectionResetError", True),
        ("RefusedHere", False),
    ]
    run = Run.objects.get(workspace=workspace, run_id=outcome.run_id)
    assert (run.cost_usd, run.priced_calls, run.unpriced_calls) == (Decimal("0.0027"), 1, 1)
