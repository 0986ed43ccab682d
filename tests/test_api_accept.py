"""Views that write their one representation themselves (the exports' NDJSON or CSV, the audit
log's CSV, an artifact's bytes) answer 406 `not_acceptable` to an `Accept` that admits none of it,
as the evidence zip does (console.api.base.require_accepted); no Accept, `*/*` and a browser's
usual Accept still get the file."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger.log.artifacts import store_bytes
from ledger.models import AuditEntry, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started

BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"
PASSING = (None, "*/*", BROWSER)


def _get(client: Client, url: str, accept: str | None) -> Any:
    return client.get(url, **({"HTTP_ACCEPT": accept} if accept is not None else {}))


def _refused(response: Any) -> None:
    assert response.status_code == 406, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    assert response.json()["error"]["code"] == "not_acceptable"


@pytest.fixture
def api(workspace: Workspace, append: Any) -> Client:
    append("run_a", started())
    _, key = create_key(workspace=workspace, scopes=["read"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["runs", "events", "costs"])
def test_an_export_answers_406_to_an_accept_without_its_format(api: Client, kind: str) -> None:
    url = f"/api/v1/export/{kind}"
    audited = AuditEntry.objects.count()
    for accept in ("application/json", "text/csv", "application/x-ndjson;q=0", "*/*, application/x-ndjson;q=0"):
        _refused(_get(api, url, accept))
    for accept in ("application/json", "application/x-ndjson", "text/csv;q=0"):
        _refused(_get(api, f"{url}?format=csv", accept))
    assert AuditEntry.objects.count() == audited  # nothing exported, nothing audited
    _refused(_get(Client(), url, "application/json"))  # before the credentials are looked at
    for accept in (*PASSING, "application/x-ndjson", "application/*"):
        answer = _get(api, url, accept)
        assert answer.status_code == 200 and answer["Content-Type"] == "application/x-ndjson", accept
    for accept in (*PASSING, "text/csv", "text/*"):
        answer = _get(api, f"{url}?format=csv", accept)
        assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv"), accept
        assert b"".join(answer.streaming_content).startswith(b"# ")


@pytest.mark.django_db
def test_the_audit_export_and_the_audit_csv_answer_406_to_an_accept_without_their_format(
    workspace: Workspace, admin: Any
) -> None:
    session = Client(raise_request_exception=False)
    session.force_login(admin)
    _refused(_get(session, "/api/v1/export/audit", "application/json"))
    _refused(_get(session, "/api/v1/export/audit?format=csv", "application/json"))
    _refused(_get(session, "/api/v1/audit?format=csv", "application/json"))
    _refused(_get(session, "/api/v1/audit?format=csv", "text/csv;q=0"))
    _refused(_get(session, "/api/v1/audit", "text/csv"))
    for accept in (*PASSING, "text/csv"):
        answer = _get(session, "/api/v1/audit?format=csv", accept)
        assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv"), accept
    for accept in (*PASSING, "application/json"):
        answer = _get(session, "/api/v1/audit", accept)
        assert answer.status_code == 200 and "entries" in answer.json(), accept
    answer = _get(session, "/api/v1/export/audit?format=csv", BROWSER)
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/csv")


@pytest.mark.django_db
def test_an_artifacts_content_answers_406_to_an_accept_without_its_type(
    api: Client, workspace: Workspace, other_workspace: Workspace
) -> None:
    artifact = store_bytes(workspace, b"plain words", content_type="text/plain")
    url = f"/api/v1/artifacts/{artifact.artifact_id}/content"
    for accept in ("application/json", "text/plain;q=0", "image/*"):
        _refused(_get(api, url, accept))
    for accept in (*PASSING, "text/plain", "text/*", "application/octet-stream"):
        answer = _get(api, url, accept)
        assert answer.status_code == 200 and b"".join(answer.streaming_content) == b"plain words", accept
        assert answer["Content-Type"] == "text/plain"
    # Another tenant's caller learns nothing: 404, whatever it accepts.
    _, outsider_key = create_key(workspace=other_workspace, scopes=["read"])
    outsider = Client(HTTP_AUTHORIZATION=f"Bearer {outsider_key}", raise_request_exception=False)
    for accept in ("application/json", None):
        answer = _get(outsider, url, accept)
        assert answer.status_code == 404 and answer.json()["error"]["code"] == "not_found"


@pytest.mark.django_db
def test_a_json_view_answers_406_to_an_accept_that_weighs_json_0(api: Client) -> None:
    """RFC 9110 § 12.4.2: `q=0` means "not acceptable". DRF's own negotiation ignores the weight and
    answered JSON to `application/json;q=0`; the views that write their representation themselves
    already refused it (above). The most specific range decides, as there."""
    for url in ("/api/v1/runs", "/api/v1/runs/run_a", "/api/v1/runs/run_a/evidence"):
        for accept in ("application/json;q=0", "*/*, application/json;q=0", "application/*;q=0", "*/*;q=0"):
            _refused(_get(api, url, accept))
    for accept in (
        "application/json;q=0",
        "application/*;q=0",
        "*/*;q=0",
        "*/*, application/json;q=0, application/x-ndjson;q=0",
    ):
        _refused(_get(api, "/api/v1/runs/run_a/events", accept))
    for accept in (*PASSING, "application/json", "application/json;q=0.5", "*/*;q=0.1, text/html"):
        answer = _get(api, "/api/v1/runs/run_a", accept)
        assert answer.status_code == 200 and answer.json()["runId"] == "run_a", accept


@pytest.mark.django_db
def test_the_weights_choose_between_json_and_ndjson(api: Client) -> None:
    """A view with two representations serves the one the Accept header weighs most; a weight of 0
    rules one out even when a wildcard would admit it."""
    for accept, media_type in (
        ("application/json;q=0, application/x-ndjson", "application/x-ndjson"),
        ("*/*, application/json;q=0", "application/x-ndjson"),
        ("application/json;q=0.1, application/x-ndjson", "application/x-ndjson"),
        ("application/json, application/x-ndjson;q=0.5", "application/json"),
        ("application/x-ndjson;q=0, */*", "application/json"),
    ):
        answer = _get(api, "/api/v1/runs/run_a/events", accept)
        assert answer.status_code == 200 and answer["Content-Type"].startswith(media_type), (
            accept,
            answer["Content-Type"],
        )
    for accept, media_type in (("*/*, application/json;q=0", "text/csv"), ("text/csv;q=0, */*", "application/json")):
        answer = _get(api, "/api/v1/usage", accept)
        assert answer.status_code == 200 and answer["Content-Type"].startswith(media_type), (
            accept,
            answer["Content-Type"],
        )


@pytest.mark.django_db
def test_an_append_refused_for_its_accept_writes_nothing(workspace: Workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    api = Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)
    body = '{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "wfver_a"}}]}'
    for accept in ("application/json;q=0, application/x-ndjson;q=0", "*/*;q=0"):
        answer = api.post("/api/v1/runs/run_q/events", body, content_type="application/json", HTTP_ACCEPT=accept)
        _refused(answer)
    assert api.get("/api/v1/runs/run_q").status_code == 404  # nothing was written
    answer = api.post(
        "/api/v1/runs/run_q/events", body, content_type="application/json", HTTP_ACCEPT="application/json"
    )
    assert answer.status_code == 200 and answer.json()["lastSequence"] == 1
