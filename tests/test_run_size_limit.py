"""A run holds at most LEDGER_MAX_EVENTS_PER_RUN events (docs/security.md "Size limits"): past it
an append is 413 run_too_large with the error envelope and writes nothing, while the run's ending is
still accepted; another run, and another tenant, are unaffected."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.errors import RunTooLarge
from ledger.models import Event, Run, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, started


@pytest.fixture(autouse=True)
def small_runs(settings: Any) -> None:
    settings.LEDGER_MAX_EVENTS_PER_RUN = 5


def test_past_the_limit_nothing_is_written_but_the_run_can_still_end(append: Any) -> None:
    append("run_big", started(), *[ev("custom.note", i=i) for i in range(4)])
    with pytest.raises(RunTooLarge) as refused:
        append("run_big", ev("custom.note", i=4), ev("custom.note", i=5))
    assert refused.value.status == 413 and refused.value.details == {"index": 0, "limit": 5}
    assert Event.objects.filter(run__run_id="run_big").count() == 5
    append("run_big", ev("RunCompleted", output="ok"))
    assert Run.objects.get(run_id="run_big").status == "completed"
    assert append("run_small", started()).events  # another run of the workspace is unaffected


def test_a_batch_that_crosses_the_limit_is_refused_whole(append: Any) -> None:
    append("run_big", started())
    with pytest.raises(RunTooLarge) as refused:
        append("run_big", *[ev("custom.note", i=i) for i in range(6)])
    assert refused.value.details["index"] == 4
    assert Event.objects.filter(run__run_id="run_big").count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_413_with_the_envelope(workspace: Workspace, other_workspace: Workspace) -> None:
    api = http_client(headers={"Authorization": f"Bearer {create_key(workspace=workspace, scopes=['ingest'])[1]}"})
    events = [started(), *[ev("custom.note", i=i) for i in range(4)]]
    assert api.post("/api/v1/runs/run_api/events", json={"events": events}).status_code == 200
    answer = api.post("/api/v1/runs/run_api/events", json={"events": [ev("custom.note", i=9)]})
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "run_too_large" and answer.json()["error"]["details"]["limit"] == 5
    assert Event.objects.filter(run__run_id="run_api").count() == 5
    # The same run id in another tenant is its own run, far from any limit; another tenant's key
    # cannot reach this one (404 as for any run it does not own).
    other = http_client(
        headers={"Authorization": f"Bearer {create_key(workspace=other_workspace, scopes=['ingest', 'read'])[1]}"}
    )
    assert other.post("/api/v1/runs/run_api/events", json={"events": [started()]}).status_code == 200
    assert other.get("/api/v1/runs/run_api").json()["eventCount"] == 1
