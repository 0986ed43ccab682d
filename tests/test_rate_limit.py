"""An API key appends at most LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY events per clock minute
(docs/security.md "Size limits"): past it, 429 rate_limited with Retry-After and the error body,
nothing written; the next minute, another key and another tenant are unaffected. The minute is the
fixed test clock's, moved by hand: no waiting, no timing."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.models import Event, Workspace
from ledger.tenancy.services import bootstrap, create_key
from tests.conftest import ev, http_client, started

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def few_per_minute(settings: Any) -> None:
    settings.LEDGER_MAX_EVENTS_PER_MINUTE_PER_KEY = 5


def _harness(workspace: Workspace) -> Any:
    return http_client(headers={"Authorization": f"Bearer {create_key(workspace=workspace, scopes=['ingest'])[1]}"})


def _post(client: Any, run_id: str, *events: dict[str, Any]) -> Any:
    return client.post(f"/api/v1/runs/{run_id}/events", json={"events": list(events)})


def test_past_the_limit_a_key_is_told_when_to_come_back_and_nothing_is_written(workspace, clock) -> None:
    clock.moment = clock.moment.replace(second=15, microsecond=0)
    harness, other_key = _harness(workspace), _harness(workspace)
    foreign = _harness(bootstrap(tenant="globex", workspace="main"))
    assert _post(harness, "run_a", started(), *[ev("custom.note", i=i) for i in range(3)]).status_code == 200
    refused = _post(harness, "run_a", ev("custom.note", i=3), ev("custom.note", i=4))
    assert refused.status_code == 429
    assert refused.headers["Retry-After"] == "45"
    error = refused.json()["error"]
    assert (error["code"], error["details"]) == ("rate_limited", {"retryAfter": 45, "limit": 5})
    assert Event.objects.filter(run__run_id="run_a").count() == 4
    assert _post(harness, "run_a", ev("custom.note", i=3)).status_code == 200  # exactly the limit
    assert _post(harness, "run_b", started()).status_code == 429  # every run of the key counts
    assert _post(other_key, "run_c", started()).status_code == 200  # another key
    assert _post(foreign, "run_d", started()).status_code == 200  # another tenant
    clock.advance(45)  # the next minute
    assert _post(harness, "run_a", ev("custom.note", i=5)).status_code == 200


def test_a_batch_the_log_refuses_does_not_count(workspace, clock) -> None:
    clock.moment = clock.moment.replace(second=0, microsecond=0)
    harness = _harness(workspace)
    for _ in range(3):  # the run does not exist: 409 run_not_started, three times over the limit
        assert _post(harness, "run_x", ev("custom.note"), ev("custom.note")).status_code == 409
    assert _post(harness, "run_x", started(), *[ev("custom.note", i=i) for i in range(4)]).status_code == 200


def test_a_caller_with_its_limit_of_evidence_requests_in_flight_is_refused(workspace, settings, append) -> None:
    """Counters, not timing: two requests of the key are held in flight by hand, the third is
    refused; another caller is not; once one finishes, the key is answered again."""
    from console.api.evidence import EVIDENCE_SLOTS
    from console.streams import caller_of

    settings.LEDGER_EVIDENCE_MAX_IN_FLIGHT_PER_CALLER = 2
    append("run_e", started(), ev("RunCompleted", output="ok"))
    key, secret = create_key(workspace=workspace, scopes=["read"])
    other = _harness(workspace)
    other.headers["Authorization"] = f"Bearer {create_key(workspace=workspace, scopes=['read'])[1]}"
    foreign = http_client(
        headers={
            "Authorization": f"Bearer {create_key(workspace=bootstrap(tenant='globex', workspace='main'), scopes=['read'])[1]}"
        }
    )
    reader = http_client(headers={"Authorization": f"Bearer {secret}"})
    assert reader.get("/api/v1/runs/run_e/evidence").status_code == 200  # its slot is given back
    held = [EVIDENCE_SLOTS.take(caller_of(key), 2) for _ in range(2)]
    assert all(held)
    refused = reader.get("/api/v1/runs/run_e/evidence")
    assert refused.status_code == 429 and refused.headers["Retry-After"] == "1"
    assert refused.json()["error"]["code"] == "rate_limited"
    assert other.get("/api/v1/runs/run_e/evidence").status_code == 200  # another caller
    assert foreign.get("/api/v1/runs/run_e/evidence").status_code == 404  # another tenant: still 404 first
    held[0].release()
    assert reader.get("/api/v1/runs/run_e/evidence").status_code == 200
    held[1].release()
    assert EVIDENCE_SLOTS.open_for(caller_of(key)) == 0
