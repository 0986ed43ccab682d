"""A refused request (4xx) logs one line, `refused METHOD PATH STATUS CALLER`, never a traceback
(docs/security.md "Logs"); the caller is a key's public prefix (never its secret), a username, or
anonymous."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from console import logfilters
from ledger.tenancy.services import KEY_PREFIX, create_key
from tests.conftest import ev, http_client, started

pytestmark = pytest.mark.django_db(transaction=True)


class _Kept(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def request_log() -> Iterator[_Kept]:
    """What django.request writes, kept on the logger itself (whatever propagation another test's
    server set up)."""
    kept, logger = _Kept(), logging.getLogger("django.request")
    logger.addHandler(kept)
    yield kept
    logger.removeHandler(kept)


def test_refused_pages_and_api_calls_log_one_line_without_a_traceback(
    client, caplog, request_log, workspace, operator, outsider, append
) -> None:
    assert logfilters.KEY_PREFIX == KEY_PREFIX
    append("run_1", started(), ev("RunCompleted", output="ok"))
    caplog.set_level(logging.WARNING, logger="django.request")

    client.force_login(outsider)  # another tenant: a page raises Http404
    assert client.get("/w/acme/support/runs/run_1/").status_code == 404
    client.force_login(operator)  # below admin: the page raises PermissionDenied
    assert client.get("/w/acme/support/settings/").status_code == 403
    key, secret = create_key(workspace=workspace, scopes=["read"])
    with http_client(headers={"Authorization": f"Bearer {secret}"}) as reader:  # a key without the scope
        assert reader.post("/api/v1/runs/run_2/events", json={"events": [started()]}).status_code == 403
    with http_client() as anonymous:
        assert anonymous.get("/api/v1/runs").status_code == 401
    # An async view (the SSE stream) refusing a method: the session is not read from the log line.
    assert client.post("/api/v1/runs/run_1/stream").status_code == 405

    lines = request_log.records
    assert [r.getMessage() for r in lines] == [
        f"refused GET /w/acme/support/runs/run_1/ 404 {outsider.get_username()}",
        f"refused GET /w/acme/support/settings/ 403 {operator.get_username()}",
        f"refused POST /api/v1/runs/run_2/events 403 key:{key.prefix}",
        "refused GET /api/v1/runs 401 anonymous",
        "refused POST /api/v1/runs/run_1/stream 405 session",
    ]
    assert all(r.exc_info is None and r.exc_text is None for r in lines)
    assert all(secret not in r.getMessage() for r in caplog.records)
    assert "Traceback" not in caplog.text
