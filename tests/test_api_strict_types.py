"""Every field of every write endpoint takes exactly the JSON type its schema names (docs/api.md §
Conventions): a string field refuses a number, a boolean refuses "yes", an integer refuses "2",
with 400 `invalid_request` naming the field, and nothing is written to the log or the audit.
DRF's fields converted them once, and the converted values were what the log recorded."""

from __future__ import annotations

from collections.abc import Callable
from json import dumps
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from drf_spectacular.generators import SchemaGenerator
from drf_spectacular.settings import spectacular_settings
from rest_framework import serializers

from console.api.inputs import Input, type_errors
from ledger.evaluation import datasets, policies
from ledger.models import AuditEntry, Event, ReexecutionRequest, ShareLink, ToolGatewayClaim, Workspace
from ledger.reexecution import services
from ledger.tenancy.services import create_key
from tests.conftest import ev, started

RUN = "run_typed"
RX = "rx_fixture"  # replaced by the request's id
POLICY_ID = "evp_fixture"  # replaced by the policy's id


@pytest.fixture
def world(workspace: Workspace, append: Callable[..., Any], operator: User, approver: User) -> dict[str, Any]:
    append(
        RUN,
        started(input={"ticket": "T-1"}),
        ev("StepScheduled", stepPath="answer"),
        ev("StepAttemptStarted", stepPath="answer", attempt=1),
        ev("StepCompleted", stepPath="answer", attempt=1, output="done"),
        ev("RunCompleted", output="done"),
    )
    append("run_open", started())
    asked = services.request_reexecution(workspace=workspace, run_id=RUN, mode="rerun", reason="flaky", by=operator)
    datasets.add_runs(workspace=workspace, name="d", run_ids=[RUN], by="carol")
    policy = policies.approve_policy(
        workspace=workspace,
        dataset="d",
        change_kinds=["model"],
        scorers=["exact"],
        ceiling_per_evaluation_usd="1",
        ceiling_per_day_usd="5",
        ttl_hours=2,
        by=approver,
    )
    return {"rx": asked.public_id, "policy": policy.public_id}


class Api:
    """Django's test client speaking JSON, as a key or as a member's session."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def post(self, path: str, *, json: Any) -> Any:
        return self.client.post(path, data=dumps(json), content_type="application/json")

    def get(self, path: str) -> Any:
        return self.client.get(path)


@pytest.fixture
def clients(workspace: Workspace, world: dict[str, Any], operator: User, approver: User) -> dict[str, Api]:
    _, secret = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    sessions = {}
    for user in (operator, approver):
        sessions[user.get_username()] = Api(Client(raise_request_exception=False))
        sessions[user.get_username()].client.force_login(user)
    return {"key": Api(Client(HTTP_AUTHORIZATION=f"Bearer {secret}", raise_request_exception=False)), **sessions}


CLAIM = {"callId": "c1", "toolName": "search", "args": {}, "effect": "read", "owner": "w1"}
POLICY = {
    "dataset": "d",
    "changeKinds": ["model"],
    "scorers": ["exact"],
    "ceilingPerEvaluationUsd": "1",
    "ceilingPerDayUsd": "5",
    "ttlHours": 2,
}

# (who, path, body, the field named)
WRONG: list[tuple[str, str, dict[str, Any], str]] = [
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "callId": 5}, "callId"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "toolName": 5}, "toolName"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "timeoutS": "30"}, "timeoutS"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "turn": "2"}, "turn"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "turn": True}, "turn"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "effect": 1}, "effect"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "fencingToken": True}, "fencingToken"),
    ("key", f"runs/{RUN}/tool-calls", {**CLAIM, "fencingToken": 1.5}, "fencingToken"),
    ("key", f"runs/{RUN}/tool-calls/c1/outbound", {"leaseToken": 5}, "leaseToken"),
    ("key", f"runs/{RUN}/tool-calls/c1/complete", {"leaseToken": 5, "result": 1}, "leaseToken"),
    ("carol", f"runs/{RUN}/tool-calls/c1/reconcile", {"outcome": "failed", "note": 5}, "note"),
    ("key", "runs/run_open/cancel", {"reason": 5}, "reason"),
    ("bob", "runs/run_open/tool-calls/c1/approve", {"note": 5, "argsDigest": "x"}, "note"),
    ("bob", "runs/run_open/tool-calls/c1/deny", {"note": "n", "argsDigest": ["x"]}, "argsDigest"),
    ("key", f"runs/{RUN}/reexecutions", {"mode": "simulate", "reason": 5}, "reason"),
    ("key", f"runs/{RUN}/reexecutions", {"mode": "rerun", "reason": "r", "fromStep": 1}, "fromStep"),
    (
        "key",
        f"runs/{RUN}/reexecutions",
        {"mode": "rerun", "reason": "r", "modelOverrides": {"chat": {"provider": 5, "model": "m"}}},
        "modelOverrides.chat.provider",
    ),
    ("bob", f"reexecutions/{RX}/approve", {"note": 5}, "note"),
    ("bob", f"reexecutions/{RX}/deny", {"note": False}, "note"),
    ("key", "reexecutions/claim", {"owner": 5}, "owner"),
    ("key", f"reexecutions/{RX}/lease", {"leaseToken": 5}, "leaseToken"),
    ("key", "reexecutions/batches", {"runIds": [RUN, 5], "reason": "r"}, "runIds.1"),
    ("carol", f"runs/{RUN}/share-links", {"expiresInHours": "2"}, "expiresInHours"),
    ("carol", f"runs/{RUN}/share-links", {"expiresInHours": 2, "includeSubRuns": "yes"}, "includeSubRuns"),
    ("carol", f"runs/{RUN}/share-links", {"expiresInHours": 2, "includeSubRuns": 1}, "includeSubRuns"),
    ("carol", f"runs/{RUN}/share-links", {"expiresInHours": 2, "maxOpens": "3"}, "maxOpens"),
    ("key", f"runs/{RUN}/feedback", {"rating": "4"}, "rating"),
    ("key", f"runs/{RUN}/feedback", {"rating": 4, "category": 5}, "category"),
    ("key", f"runs/{RUN}/feedback", {"rating": 4, "comment": ["long"]}, "comment"),
    ("key", "datasets/d/runs", {"runIds": [5]}, "runIds.0"),
    ("key", "datasets/d/runs/remove", {"runIds": "run_typed"}, "runIds"),
    ("key", "datasets/d/expected", {"runId": 5, "expected": None}, "runId"),
    ("bob", "evaluation-policies", {**POLICY, "ttlHours": "2"}, "ttlHours"),
    ("bob", "evaluation-policies", {**POLICY, "ceilingPerDayUsd": 5}, "ceilingPerDayUsd"),
    ("bob", f"evaluation-policies/{POLICY_ID}/revoke", {"note": 5}, "note"),
    ("key", "evaluations", {"dataset": "d", "version": "1", "change": {}, "scorers": [], "reason": "r"}, "version"),
]


def _written() -> tuple[int, ...]:
    return (
        Event.objects.count(),
        AuditEntry.objects.count(),
        ShareLink.objects.count(),
        ToolGatewayClaim.objects.count(),
        ReexecutionRequest.objects.count(),
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("who", "path", "body", "field"), WRONG, ids=[f"{w[1]}:{w[3]}" for w in WRONG])
def test_a_wrong_json_type_is_refused_naming_the_field_and_nothing_is_written(
    clients: dict[str, Api], world: dict[str, Any], who: str, path: str, body: dict[str, Any], field: str
) -> None:
    before = _written()
    response = clients[who].post(
        "/api/v1/" + path.replace(RX, world["rx"]).replace(POLICY_ID, world["policy"]), json=body
    )
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_request", error
    assert error["details"]["field"] == field
    top = field.split(".")[0]
    assert "must be" in str(error["details"]["fields"][top])
    assert _written() == before


@pytest.mark.django_db
def test_the_right_types_are_still_taken_and_an_integer_may_be_written_2_0(
    clients: dict[str, Api], world: dict[str, Any]
) -> None:
    made = clients["carol"].post(
        f"/api/v1/runs/{RUN}/share-links", json={"expiresInHours": 2.0, "includeSubRuns": False, "maxOpens": 3}
    )
    assert made.status_code == 201, made.content
    [link] = clients["carol"].get(f"/api/v1/runs/{RUN}/share-links").json()["shareLinks"]
    assert link["includeSubRuns"] is False and link["maxOpens"] == 3
    rated = clients["key"].post(f"/api/v1/runs/{RUN}/feedback", json={"rating": 4, "category": "tone"})
    assert rated.status_code == 201 and rated.json()["rating"] == 4
    claimed = clients["key"].post("/api/v1/runs/run_open/tool-calls", json={**CLAIM, "timeoutS": 30, "turn": 2})
    assert claimed.status_code == 201, claimed.content


@pytest.mark.django_db
def test_a_cancel_reason_that_is_a_number_never_reaches_the_log(clients: dict[str, Api]) -> None:
    """The audit's example: the log once held RunFailed {error: {message: "5"}}."""
    refused = clients["key"].post("/api/v1/runs/run_open/cancel", json={"reason": 5})
    assert refused.status_code == 400
    assert not Event.objects.filter(run__run_id="run_open", type="RunFailed").exists()
    done = clients["key"].post("/api/v1/runs/run_open/cancel", json={"reason": "5"})
    assert done.status_code == 202, done.content


def _request_serializers() -> list[tuple[str, type[serializers.Serializer]]]:
    generator = SchemaGenerator()
    generator._initialise_endpoints()
    found = []
    for path, _, method, view in generator._get_paths_and_endpoints():
        view.request = spectacular_settings.GET_MOCK_REQUEST(method, path, view, None)
        view.schema.method = method
        declared = view.schema.get_request_serializer()
        if isinstance(declared, type) and issubclass(declared, serializers.BaseSerializer):
            found.append((f"{method} {path}", declared))
    return found


def test_every_request_body_of_the_schema_is_an_input_whose_fields_each_name_a_json_type() -> None:
    found = _request_serializers()
    assert len(found) > 20
    assert [name for name, declared in found if not issubclass(declared, Input)] == []
    for name, declared in found:
        for field_name, field in declared().fields.items():
            # a value of no JSON type at all: each field must say which type it takes (else TypeError)
            assert type_errors(field, object()) is not None or isinstance(field, serializers.JSONField), (
                name,
                field_name,
            )


def test_an_unknown_field_class_is_a_mistake_of_ours_not_a_pass() -> None:
    with pytest.raises(TypeError):
        type_errors(serializers.FileField(), "x")
