"""Bodies over 10 MiB are 413 `payload_too_large` however they are framed (docs/api.md), against a real
Daphne: with a Content-Length, and chunked without one, which Django alone would read whole and
hand to the parser (docs/security.md "Input limits")."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from console.input_limits import MAX_BODY_BYTES
from ledger.models import Run, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started
from tests.live_support import session_id
from tests.servers import Daphne

pytestmark = pytest.mark.django_db(transaction=True)

CHUNK = 64 * 1024
TIMEOUT = httpx.Timeout(60.0)


@pytest.fixture
def api(server: Daphne, workspace: Workspace) -> Iterator[httpx.Client]:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    with httpx.Client(base_url=server.url, timeout=TIMEOUT, headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def _valid_body(size: int) -> bytes:
    """A well-formed append of about `size` bytes: were it let through, it would be appended."""
    head = b'{"events": [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "pad": "'
    tail = b'"}}]}'
    return head + b"x" * (size - len(head) - len(tail)) + tail


def _chunked(body: bytes) -> Iterator[bytes]:
    """A generator: httpx sends it with Transfer-Encoding: chunked and no Content-Length."""
    for start in range(0, len(body), CHUNK):
        yield body[start : start + CHUNK]


def _assert_too_large(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text[:300]
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": {
            "code": "payload_too_large",
            "message": "request bodies are limited to 10 MiB",
            "details": {"limit": MAX_BODY_BYTES},
        }
    }


def test_an_11_mib_chunked_body_is_413_like_a_declared_one(api: httpx.Client, workspace: Workspace) -> None:
    body = _valid_body(11 * 1024 * 1024)
    chunked = api.post(
        "/api/v1/runs/run_big/events", content=_chunked(body), headers={"Content-Type": "application/json"}
    )
    assert "content-length" not in chunked.request.headers
    assert chunked.request.headers["transfer-encoding"] == "chunked"
    _assert_too_large(chunked)
    declared = api.post("/api/v1/runs/run_big/events", content=body, headers={"Content-Type": "application/json"})
    assert declared.request.headers["content-length"] == str(len(body))
    _assert_too_large(declared)
    assert not Run.objects.filter(run_id="run_big").exists()


def test_the_limit_is_the_same_either_way(api: httpx.Client, workspace: Workspace) -> None:
    """Exactly 10 MiB passes the limit (and is appended) chunked; one byte more is refused."""
    at_limit = _valid_body(MAX_BODY_BYTES)
    response = api.post(
        "/api/v1/runs/run_edge/events", content=_chunked(at_limit), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text[:300]
    over = _valid_body(MAX_BODY_BYTES + 1)
    _assert_too_large(
        api.post("/api/v1/runs/run_edge2/events", content=_chunked(over), headers={"Content-Type": "application/json"})
    )
    assert not Run.objects.filter(run_id="run_edge2").exists()


def test_a_small_chunked_body_is_read_as_usual(api: httpx.Client, workspace: Workspace) -> None:
    body = json.dumps({"events": [started()]}).encode()
    response = api.post(
        "/api/v1/runs/run_small/events", content=_chunked(body), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["lastSequence"] == 1


def test_a_console_form_over_the_limit_is_413_too(server: Daphne, admin) -> None:
    client = httpx.Client(base_url=server.url, timeout=TIMEOUT, cookies={"sessionid": session_id(admin)})
    body = b"comment=" + b"x" * (11 * 1024 * 1024) + b"&rating=3"
    response = client.post(
        "/w/acme/support/runs/run_none/feedback/",
        content=_chunked(body),
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 413, response.text[:300]
