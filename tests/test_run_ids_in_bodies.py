"""A run id of the wrong form in a request body is 400 `invalid_run_id` naming its field, as it is
in a path: it names no run, so "not found" (404, as once answered) would misread the client's
mistake. A well-formed id of no run stays 404."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from ledger.models import AuditEntry, DatasetVersion, ReexecutionRequest, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started


@pytest.fixture
def api(workspace: Workspace, append: Any) -> Client:
    append("run_ok", started(), {"type": "RunCompleted", "payload": {"output": "x"}})
    _, key = create_key(workspace=workspace, scopes=["read", "execute"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _post(api: Client, path: str, body: dict[str, Any]) -> Any:
    return api.post(f"/api/v1/{path}", data=json.dumps(body), content_type="application/json")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("datasets/golden/runs", {"runIds": ["bad id"]}, "runIds.0"),
        ("datasets/golden/runs", {"runIds": ["run_ok", "run_ok\n"]}, "runIds.1"),
        ("datasets/golden/runs/remove", {"runIds": ["run_ok", "bad id"]}, "runIds.1"),
        ("datasets/golden/expected", {"runId": "bad id", "expected": 1}, "runId"),
        ("reexecutions/batches", {"runIds": ["run_ok", "bad id"], "reason": "r"}, "runIds.1"),
    ],
)
def test_a_run_id_of_the_wrong_form_is_400_naming_it(api: Client, path: str, body: dict[str, Any], field: str) -> None:
    before = (DatasetVersion.objects.count(), ReexecutionRequest.objects.count(), AuditEntry.objects.count())
    refused = _post(api, path, body)
    assert refused.status_code == 400, refused.content
    error = refused.json()["error"]
    assert (error["code"], error["details"]["field"]) == ("invalid_run_id", field)
    assert (DatasetVersion.objects.count(), ReexecutionRequest.objects.count(), AuditEntry.objects.count()) == before


@pytest.mark.django_db
def test_a_well_formed_id_of_no_run_is_still_404(api: Client) -> None:
    for path in ("datasets/golden/runs", "reexecutions/batches"):
        missing = _post(api, path, {"runIds": ["run_ok", "run_nope"], "reason": "r"})
        assert (missing.status_code, missing.json()["error"]["code"]) == (404, "not_found"), path
    assert _post(api, "datasets/golden/runs", {"runIds": ["run_ok"]}).status_code == 201
