"""console/asgi_handler.py: Django's ASGI handler with the sync middleware chain in one thread hop.
Over ASGI a request answers as through Django's test client (the chain WSGI runs); requests one
after another run on one reused thread; an async view (the SSE stream) takes Django's own handler."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import HttpCommunicator
from django.core import signals
from django.test import Client

from console.asgi import application, django_asgi_app
from ledger.tenancy.services import create_key


@pytest.fixture(autouse=True)
def _close_request_threads_connections() -> Any:
    yield
    django_asgi_app.close_connections()  # kept by the handler's idle threads: the test database is dropped later


def asgi(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None) -> dict[str, Any]:
    raw = [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
    raw.append((b"host", b"testserver"))
    if body:
        raw.append((b"content-length", str(len(body)).encode()))
    communicator = HttpCommunicator(application, method, path, body=body, headers=raw)
    return async_to_sync(communicator.get_response)(timeout=30)


def header_names(headers: Any) -> set[str]:
    return {name.decode().lower() if isinstance(name, bytes) else name.lower() for name, _ in headers}


@pytest.mark.django_db(transaction=True)
def test_an_append_answers_over_asgi_as_through_the_test_client(workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    events = [{"type": "RunStarted", "payload": {"workflowVersionId": "w", "text": "caf\u00e9"}, "idempotencyKey": "s"}]
    body = json.dumps({"events": events}).encode()
    over_asgi = asgi("POST", "/api/v1/runs/run_asgi_a/events", body, auth)
    through_client = Client(HTTP_AUTHORIZATION=auth["Authorization"]).post(
        "/api/v1/runs/run_asgi_b/events", data=body, content_type="application/json"
    )
    assert over_asgi["status"] == through_client.status_code == 200
    ours, theirs = json.loads(over_asgi["body"]), through_client.json()
    assert [e["type"] for e in ours["events"]] == [e["type"] for e in theirs["events"]]
    assert ours["lastSequence"] == theirs["lastSequence"] == 1
    assert header_names(over_asgi["headers"]) == header_names(through_client.items())
    # A retry is a replay, read back over ASGI as well.
    again = json.loads(asgi("POST", "/api/v1/runs/run_asgi_a/events", body, auth)["body"])
    assert again["events"][0]["replayed"] is True
    read = asgi("GET", "/api/v1/runs/run_asgi_a/events", headers=auth)
    assert read["status"] == 200 and json.loads(read["body"])["lastSequence"] == 1


@pytest.mark.django_db(transaction=True)
def test_errors_over_asgi_are_the_error_body(workspace) -> None:
    _, key = create_key(workspace=workspace, scopes=["ingest", "read"])
    auth = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    unknown = asgi("GET", "/api/v1/no/such/path", headers=auth)
    assert unknown["status"] == 404 and json.loads(unknown["body"])["error"]["code"] == "not_found"
    refused = asgi("POST", "/api/v1/runs/run_asgi/events", b'{"events": [', auth)
    assert refused["status"] == 400 and json.loads(refused["body"])["error"]["code"] == "invalid_json"
    too_deep = asgi("POST", "/api/v1/runs/run_asgi/events", b'{"events": ' + b"[" * 70 + b"]" * 70 + b"}", auth)
    assert too_deep["status"] == 400 and json.loads(too_deep["body"])["error"]["details"] == {"limit": 64}
    unauthenticated = asgi("GET", "/api/v1/runs/run_asgi/events")
    assert unauthenticated["status"] == 401
    assert json.loads(unauthenticated["body"])["error"]["code"] == "unauthenticated"


@pytest.mark.django_db(transaction=True)
def test_requests_one_after_another_run_on_one_reused_thread() -> None:
    threads: list[int] = []

    def started(**kwargs: Any) -> None:
        threads.append(threading.get_ident())

    signals.request_started.connect(started)
    try:
        for _ in range(3):
            assert asgi("GET", "/api/v1/runs/run_asgi/events")["status"] == 401
    finally:
        signals.request_started.disconnect(started)
    assert len(threads) == 3 and len(set(threads)) == 1
    assert threads[0] != threading.get_ident()


def test_only_an_async_view_takes_djangos_handler() -> None:
    assert django_asgi_app._view_is_async("/api/v1/runs/run_x/stream")
    assert not django_asgi_app._view_is_async("/api/v1/runs/run_x/events")
    assert not django_asgi_app._view_is_async("/no/such/path")
