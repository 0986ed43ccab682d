"""GET /api/v1/outer-loops/{outerLoopId}: the loop's state as the ledger holds it; the error
envelope for a malformed id, a missing loop, a corrupt record; 404 to another workspace."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger.log import append
from ledger.models import Workspace
from ledger.runtime.outer_loop import start_outer_loop
from ledger.tenancy.services import create_key
from tests.loop_workflows import reset_loop_registrations
from tests.runtime_support import every_run_verifies  # noqa: F401  (autouse)


def _client(workspace: Workspace, scopes: list[str]) -> Client:
    _, key = create_key(workspace=workspace, scopes=scopes)
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}")


@pytest.fixture
def loop(workspace: Workspace) -> Any:
    reset_loop_registrations()
    return start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input={"topic": "tides"},
        goal="tight",
        max_cycles=4,
        supervise="rt_until_third",
        outer_loop_id="ol_api",
    )


def test_the_loop_as_json(workspace: Workspace, loop: Any) -> None:
    body = _client(workspace, ["read"]).get("/api/v1/outer-loops/ol_api").json()
    assert body["outerLoopId"] == "ol_api" and body["status"] == "completed" and body["maxCycles"] == 4
    assert body["recordRunId"] == "run_ol_api" and body["supervise"] == "rt_until_third"
    assert [(c["cycleNumber"], c["runId"], c["status"], c["supervise"]["kind"]) for c in body["cycles"]] == [
        (1, "run_ol_api_c1", "completed", "continue"),
        (2, "run_ol_api_c2", "completed", "continue"),
        (3, "run_ol_api_c3", "completed", "done"),
    ]
    assert body["result"] == {"kind": "done", "finalOutput": {"text": "draft 3", "cycles": 3}}
    assert body["usage"]["inputTokens"] == 3000 and body["usage"]["costUsd"] == pytest.approx(
        sum(c["usage"]["costUsd"] for c in body["cycles"])
    )
    assert body["links"] == {"console": "/w/acme/support/loops/ol_api/", "record": "/api/v1/runs/run_ol_api"}
    assert "pendingCycleRunId" not in body and body == loop.to_json() | {"links": body["links"]}


def test_errors_are_the_envelope_and_another_workspace_gets_404(
    workspace: Workspace, other_workspace: Workspace, loop: Any, client: Client
) -> None:
    reader = _client(workspace, ["read"])
    bad = reader.get("/api/v1/outer-loops/not-a-loop")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_outer_loop"
    assert reader.get("/api/v1/outer-loops/ol_missing").status_code == 404
    outsider = _client(other_workspace, ["read"]).get("/api/v1/outer-loops/ol_api")
    assert outsider.status_code == 404 and outsider.json()["error"]["code"] == "not_found"
    assert _client(workspace, ["ingest"]).get("/api/v1/outer-loops/ol_api").status_code == 403
    assert client.get("/api/v1/outer-loops/ol_api").status_code == 401
    append(
        workspace=workspace,
        run_id="run_ol_bad",
        events=[
            {
                "type": "RunStarted",
                "payload": {"workflowVersionId": "outer_loop:x", "outerLoopId": "ol_bad", "input": {}},
            }
        ],
    )
    corrupt = reader.get("/api/v1/outer-loops/ol_bad")
    assert corrupt.status_code == 409 and corrupt.json()["error"]["code"] == "outer_loop_manifest_corrupt"


def test_the_schema_names_exactly_the_fields_returned_done_and_pending(workspace: Workspace, loop: Any) -> None:
    from console.api.outer_loops import OuterLoopSerializer
    from tests.test_api_shapes import _matches

    reader = _client(workspace, ["read"])
    _matches(OuterLoopSerializer(), reader.get("/api/v1/outer-loops/ol_api").json(), "done")
    start_outer_loop(
        workspace=workspace,
        workflow="rt_refine",
        input={},
        max_cycles=2,
        supervise="rt_never_done",
        outer_loop_id="ol_api_tired",
    )
    _matches(OuterLoopSerializer(), reader.get("/api/v1/outer-loops/ol_api_tired").json(), "exhausted")
    append(
        workspace=workspace,
        run_id="run_ol_api_waiting",
        events=[
            {
                "type": "RunStarted",
                "payload": {
                    "workflowVersionId": "outer_loop:x",
                    "outerLoopId": "ol_api_waiting",
                    "input": {},
                    "outerLoop": {
                        "goal": {"workflow": "rt_refine", "workflowDefinitionHash": "sha256:00"},
                        "maxCycles": 2,
                    },
                },
            }
        ],
    )
    pending = reader.get("/api/v1/outer-loops/ol_api_waiting").json()
    assert pending["pendingCycleRunId"] == "run_ol_api_waiting_c1" and pending["cycles"][0]["status"] == "pending"
    _matches(OuterLoopSerializer(), pending, "pending")
