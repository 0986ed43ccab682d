"""The OpenAPI schema declares what each operation really answers beyond its own errors
(console/api/schema.py `conventions_hook`): 406 everywhere, 413 and 415 where a body is read,
CSRF's 403 `forbidden` on unsafe methods; and names path parameters as docs/api.md does
(`{runId}`). Each declaration is checked against a real answer, so the schema cannot claim what
the code does not do, nor the code answer what the schema does not say."""

from __future__ import annotations

import hashlib
import json
import re
from functools import cache
from typing import Any

import pytest
from django.test import Client

from ledger.log.artifacts import store_bytes
from ledger.models import Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started

METHODS = ("get", "post", "put", "patch", "delete")


@cache
def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = Client().get("/api/schema/?format=json").json()
    return loaded


def _operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in schema()["paths"].items()
        for method, operation in item.items()
        if method in METHODS
    ]


def _codes(operation: dict[str, Any], status: int) -> set[str]:
    description = operation["responses"].get(str(status), {}).get("description", "")
    return set(re.findall(r"`([a-z_]+)`", description.split("Error codes:", 1)[-1])) if description else set()


@pytest.mark.backend_independent
def test_path_parameters_are_named_as_docs_api_md_names_them() -> None:
    names = {
        name
        for path, _, operation in _operations()
        for name in re.findall(r"\{(\w+)\}", path)
        + [p["name"] for p in operation.get("parameters", []) if p["in"] == "path"]
    }
    assert names and all("_" not in name for name in names), sorted(names)
    assert {"runId", "callId", "reexecutionId", "linkId", "artifactId"} <= names
    for path, _, operation in _operations():
        declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", path)), path


@pytest.mark.backend_independent
def test_every_operation_declares_406_and_every_body_413_415_and_every_unsafe_method_csrf() -> None:
    for path, method, operation in _operations():
        where = f"{method.upper()} {path}"
        if method != "get":
            assert "forbidden" in _codes(operation, 403), where
        if "requestBody" in operation:
            assert "payload_too_large" in _codes(operation, 413), where
            assert "unsupported_media_type" in _codes(operation, 415), where
    feedback = schema()["paths"]["/api/v1/runs/{runId}/feedback"]["post"]
    assert {"403", "406", "413", "415"} <= set(feedback["responses"])


@pytest.fixture
def api(workspace: Workspace, append: Any) -> Client:
    append("run_a", started())
    store_bytes(workspace, b"{}")  # art_<sha256 of {}>: the content's 406 is told once it is found
    _, key = create_key(workspace=workspace, scopes=["ingest", "read", "execute"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _error(response: Any, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response.json()["error"]["code"] == code


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "method"), [(p, m) for p, m, _ in _operations()])
def test_an_operation_answers_406_to_an_accept_it_cannot_satisfy_exactly_when_it_says_so(
    api: Client, path: str, method: str
) -> None:
    """Most views negotiate (DRF); those writing a zip, NDJSON, CSV, bytes or a stream check Accept
    themselves (console.api.base.require_accepted) and declare it."""
    operation = schema()["paths"][path][method]
    named = {"runId": "run_a", "artifactId": f"art_{hashlib.sha256(b'{}').hexdigest()}"}
    url = re.sub(r"\{(\w+)\}", lambda m: named.get(m.group(1), "x"), path)
    response = getattr(api, method)(url, HTTP_ACCEPT="application/x-nothing-we-write")
    if "not_acceptable" in _codes(operation, 406):
        _error(response, 406, "not_acceptable")
    else:
        assert response.status_code != 406, path


@pytest.mark.backend_independent
def test_most_operations_declare_406() -> None:
    declaring = [path for path, _, operation in _operations() if "not_acceptable" in _codes(operation, 406)]
    assert len(declaring) > 40 and "/api/v1/runs/{runId}/feedback" in declaring


BODIES = [
    ("runs/run_a/events", {"events": [{"type": "custom.x"}]}),
    ("runs/run_a/feedback", {"rating": 4}),
    ("runs/run_a/tool-calls", {"callId": "c", "toolName": "t", "args": {}, "effect": "read", "owner": "w"}),
    ("runs/run_a/cancel", {"reason": "r"}),
    ("reexecutions/claim", {}),
    ("datasets/d/runs", {"runIds": ["run_a"]}),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body"), BODIES)
def test_a_body_as_another_media_type_is_415(api: Client, path: str, body: dict[str, Any]) -> None:
    response = api.post(f"/api/v1/{path}", data=json.dumps(body), content_type="text/plain")
    _error(response, 415, "unsupported_media_type")


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "body"), BODIES)
def test_a_body_over_the_limit_is_413(api: Client, path: str, body: dict[str, Any]) -> None:
    big = json.dumps({**body, "pad": "x" * (10 * 1024 * 1024)})
    _error(api.post(f"/api/v1/{path}", data=big, content_type="application/json"), 413, "payload_too_large")


@pytest.mark.django_db
def test_a_session_without_the_csrf_header_is_403_forbidden(workspace: Workspace, append: Any, admin: Any) -> None:
    append("run_a", started())
    browser = Client(enforce_csrf_checks=True, raise_request_exception=False)
    browser.force_login(admin)
    for path, body in BODIES:
        response = browser.post(f"/api/v1/{path}", data=json.dumps(body), content_type="application/json")
        _error(response, 403, "forbidden")


ART = f"art_{hashlib.sha256(b'{}').hexdigest()}"  # the api fixture's artifact, stored as application/json
SERVED = [
    ("/api/v1/runs", ""),
    ("/api/v1/runs/{runId}", ""),
    ("/api/v1/runs/{runId}/events", ""),
    ("/api/v1/runs/{runId}/events", "?format=ndjson"),
    ("/api/v1/runs/{runId}/evidence", ""),
    ("/api/v1/runs/{runId}/evidence.zip", ""),
    ("/api/v1/runs/{runId}/state", ""),
    ("/api/v1/runs/{runId}/otlp", ""),
    ("/api/v1/artifacts/{artifactId}", ""),
    ("/api/v1/artifacts/{artifactId}/content", ""),
    ("/api/v1/usage", "?format=csv"),
    ("/api/v1/export/events", ""),
    ("/api/v1/export/runs", "?format=csv"),
    ("/api/v1/audit", ""),
    ("/api/v1/audit", "?format=csv"),
]


def _declares(declared: list[str], content_type: str) -> bool:
    bare = content_type.split(";", 1)[0].strip()
    return any(
        media == "*/*" or media == bare or (media.endswith("/*") and bare.startswith(media[:-1])) for media in declared
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("path", "query"), SERVED)
def test_a_200_comes_with_a_media_type_the_schema_declares_for_it(
    api: Client, admin: Any, path: str, query: str
) -> None:
    """A client generated from the schema reads a 200 by its declared media type: an artifact's
    bytes carry the artifact's own content type (here application/json), which the schema must
    admit, not only application/octet-stream; the audit log's `?format=csv` is text/csv."""
    admin_session = Client(raise_request_exception=False)
    admin_session.force_login(admin)
    url = path.replace("{runId}", "run_a").replace("{artifactId}", ART) + query
    response = (admin_session if path == "/api/v1/audit" else api).get(url)
    assert response.status_code == 200, (url, response.content[:300])
    declared = list(schema()["paths"][path]["get"]["responses"]["200"].get("content", {}))
    assert _declares(declared, response["Content-Type"]), (url, response["Content-Type"], declared)


MALFORMED = (b"{not json", b'{"reason": "a", "reason": "b"}')  # not JSON; a key named twice


@pytest.mark.django_db
@pytest.mark.parametrize(
    "path",
    [
        *(path for path, _ in BODIES),
        "runs/run_a/reexecutions",
        "reexecutions/batches",
        "datasets/d/runs/remove",
        "datasets/d/expected",
        "evaluations",
    ],
)
def test_a_malformed_json_body_is_400_invalid_json_where_the_schema_says_so(api: Client, path: str) -> None:
    """Every operation that reads a JSON body answers a body that does not parse (or names a key
    twice) with 400 `invalid_json`; a client branching on the declared codes must find it there."""
    template = next(
        p
        for p, m, _ in _operations()
        if m == "post" and re.fullmatch(re.sub(r"\{\w+\}", "[^/]+", p), f"/api/v1/{path}")
    )
    assert "invalid_json" in _codes(schema()["paths"][template]["post"], 400), template
    for body in MALFORMED:
        _error(api.post(f"/api/v1/{path}", data=body, content_type="application/json"), 400, "invalid_json")


@pytest.mark.backend_independent
def test_every_operation_with_a_json_body_declares_invalid_json() -> None:
    for path, method, operation in _operations():
        if "requestBody" in operation and path != "/api/v1/otlp/v1/traces":
            assert "invalid_json" in _codes(operation, 400), f"{method.upper()} {path}"
