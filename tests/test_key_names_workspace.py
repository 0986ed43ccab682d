"""An API key acts in its own workspace, and `?workspace=` naming any other is 404 `not_found`,
as a member's session gets for a workspace it cannot see (docs/api.md § Conventions). The key
once ignored the parameter and answered from its own workspace: a globex key asking for
acme/support's runs got 200 and globex's runs, and so did a workspace that does not exist."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from ledger.log import append
from ledger.models import Event, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import started

# Every API route that takes ?workspace= and can be asked without an object of its own.
READS = [
    "/api/v1/runs",
    "/api/v1/runs/run_globex",
    "/api/v1/runs/run_globex/events",
    "/api/v1/runs/run_globex/children",
    "/api/v1/runs/run_globex/evidence",
    "/api/v1/runs/run_globex/replay-plan",
    "/api/v1/runs/run_globex/tool-calls",
    "/api/v1/runs/run_globex/reexecutions",
    "/api/v1/runs/run_globex/stream",
    "/api/v1/usage",
    "/api/v1/reexecutions",
    "/api/v1/datasets",
    "/api/v1/evaluations",
    "/api/v1/evaluation-policies",
    "/api/v1/export/runs",
    "/api/v1/artifacts/art_" + "0" * 64,
]
ELSEWHERE = ["acme/support", "zzz/yyy", "globex", "globex/other"]


@pytest.fixture
def globex_key(workspace: Workspace, other_workspace: Workspace) -> Client:
    append(workspace=other_workspace, run_id="run_globex", events=[started()])
    append(
        workspace=other_workspace,
        run_id="run_globex",
        events=[{"type": "RunCompleted", "payload": {"output": "ok"}}],
    )
    append(workspace=workspace, run_id="run_acme", events=[started()])
    _, key = create_key(workspace=other_workspace, scopes=["ingest", "read", "execute"])
    return Client(HTTP_AUTHORIZATION=f"Bearer {key}", raise_request_exception=False)


def _not_found(response: Any) -> None:
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.django_db
@pytest.mark.parametrize("url", READS)
@pytest.mark.parametrize("named", ELSEWHERE)
def test_a_key_naming_another_workspace_finds_nothing(globex_key: Client, url: str, named: str) -> None:
    _not_found(globex_key.get(url, {"workspace": named}))


@pytest.mark.django_db
@pytest.mark.parametrize("url", [u for u in READS if "stream" not in u and "artifacts" not in u])
def test_a_key_naming_its_own_workspace_is_answered_as_without_it(globex_key: Client, url: str) -> None:
    named = globex_key.get(url, {"workspace": "globex/main"})
    plain = globex_key.get(url)
    assert named.status_code == plain.status_code == 200, named.content[:300]


@pytest.mark.django_db
def test_a_key_naming_another_workspace_writes_nothing(globex_key: Client) -> None:
    before = Event.objects.count()
    posts = [
        ("/api/v1/runs/run_new/events", {"events": [started()]}),
        ("/api/v1/runs/run_globex/feedback", {"rating": 4}),
        ("/api/v1/runs/run_acme/cancel", {"reason": "mine"}),
        ("/api/v1/reexecutions/claim", {}),
        ("/api/v1/otlp/v1/traces", {"resourceSpans": []}),
    ]
    for url, body in posts:
        _not_found(globex_key.post(f"{url}?workspace=acme/support", data=body, content_type="application/json"))
    assert Event.objects.count() == before


@pytest.mark.django_db
def test_the_key_and_the_session_of_an_outsider_get_the_same_answer(
    globex_key: Client, client: Client, outsider: Any
) -> None:
    client.force_login(outsider)
    for url in ("/api/v1/runs", "/api/v1/usage", "/api/v1/reexecutions"):
        as_key = globex_key.get(url, {"workspace": "acme/support"})
        as_session = client.get(url, {"workspace": "acme/support"})
        assert (as_key.status_code, as_key.json()["error"]["code"]) == (
            as_session.status_code,
            as_session.json()["error"]["code"],
        )
