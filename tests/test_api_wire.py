"""How the append and the reads speak on the wire, through httpx into Django's whole request
handling (tests/conftest.py `http_client`): the append's NDJSON answer, `Content-Encoding` on
`/events`, one writing of a stored event's numbers on every read, `Accept` on the evidence zip,
the append's control fields (docs/api.md § Runs and events, § Conventions)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ledger.models import Event, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, started

pytestmark = pytest.mark.django_db(transaction=True)

V1 = "/api/v1"


@pytest.fixture
def api(workspace: Workspace) -> Iterator[httpx.Client]:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    with http_client(headers={"Authorization": f"Bearer {key}"}) as client:
        yield client


def post(api: httpx.Client, run_id: str, *events: dict[str, Any], **kwargs: Any) -> httpx.Response:
    return api.post(f"{V1}/runs/{run_id}/events", json={"events": list(events)}, **kwargs)


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()["error"]
    assert body["code"] == code, body
    return body


# --- F3: the append answers NDJSON one envelope per line ---------------------------------------


@pytest.mark.parametrize("how", [{"headers": {"Accept": "application/x-ndjson"}}, {"params": {"format": "ndjson"}}])
def test_the_append_answers_ndjson_one_envelope_per_line(api: httpx.Client, how: dict[str, Any]) -> None:
    assert post(api, "run_a", started()).status_code == 200
    batch = [{**ev("custom.a", n=1), "idempotencyKey": "a"}, ev("custom.b", n=2)]
    answer = post(api, "run_a", *batch, **how)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/x-ndjson"
    assert answer.text.endswith("\n")
    lines = [json.loads(line) for line in answer.text.splitlines()]
    assert [(e["sequence"], e["type"], e["replayed"]) for e in lines] == [
        (2, "custom.a", False),
        (3, "custom.b", False),
    ]
    assert answer.headers["x-last-sequence"] == "3"
    again = post(api, "run_a", batch[0], **how)  # a replay: the stored envelope, one line
    assert [json.loads(line)["replayed"] for line in again.text.splitlines()] == [True]
    assert again.headers["x-last-sequence"] == "3"
    read = api.get(f"{V1}/runs/run_a/events?after=1", headers={"Accept": "application/x-ndjson"})
    assert [json.loads(line)["eventId"] for line in read.text.splitlines()] == [e["eventId"] for e in lines]
    refused = post(api, "run_a", started(), **how)  # errors stay the JSON envelope
    error(refused, 409, "run_already_started")
    assert Event.objects.filter(run__run_id="run_a").count() == 3


# --- F10: the evidence zip honours Accept ---------------------------------------------------------


def test_the_evidence_zip_answers_406_to_an_accept_without_zip(api: httpx.Client, workspace: Workspace) -> None:
    assert post(api, "run_z", started()).status_code == 200
    url = f"{V1}/runs/run_z/evidence.zip"
    for accept in ("application/json", "text/html", "application/zip;q=0"):
        refused = error(api.get(url, headers={"Accept": accept}), 406, "not_acceptable")
        assert refused["message"]
    with http_client() as anonymous:  # refused before the credentials are looked at
        error(anonymous.get(url, headers={"Accept": "application/json"}), 406, "not_acceptable")
        error(anonymous.get(url), 401, "unauthenticated")
    for accept in ("application/zip", "application/*", "*/*", "text/html,application/xhtml+xml,*/*;q=0.8", None):
        answer = api.get(url, headers={"Accept": accept} if accept else {})
        assert answer.status_code == 200, (accept, answer.text)
        assert answer.headers["content-type"] == "application/zip" and answer.content.startswith(b"PK")
    error(api.get(f"{V1}/runs/run_nope/evidence.zip", headers={"Accept": "application/zip"}), 404, "not_found")
