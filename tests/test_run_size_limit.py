"""A run holds at most LEDGER_MAX_EVENTS_PER_RUN events and LEDGER_MAX_BYTES_PER_RUN bytes of stored
canonical payload (docs/security.md "Input limits"): past either an append is 413 run_too_large with
the error envelope (`details.which`) and writes nothing, while the run's ending is still accepted;
another run, and another tenant, are unaffected."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.errors import RunTooLarge
from ledger.fold import fold
from ledger.log.envelopes import log_of
from ledger.log.projection import differences, rebuild
from ledger.log.states import STATES
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
    assert refused.value.status == 413 and refused.value.details == {"index": 0, "limit": 5, "which": "events"}
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


def _stored_bytes(run_id: str) -> int:
    return sum(len(p.encode()) for p in Event.objects.filter(run__run_id=run_id).values_list("payload", flat=True))


def test_the_head_counts_the_stored_payload_bytes_and_verify_and_rebuild_agree(append: Any) -> None:
    append("run_b", started(), ev("custom.note", text="x" * 100))
    append("run_b", ev("custom.note", text="é" * 50))  # bytes, not characters
    STATES.clear()  # a process that never saw the run: the counter comes from the head, not a fold
    append("run_b", ev("custom.note", i=1))
    run = Run.objects.get(run_id="run_b")
    assert run.payload_bytes == _stored_bytes("run_b") > 250
    log = log_of(run)
    assert differences(run, fold(log), log) == []
    Run.objects.filter(pk=run.pk).update(payload_bytes=1)
    assert any("payload_bytes" in d for d in differences(run, fold(log), log))  # verify sees a wrong counter
    rebuild(run)
    assert Run.objects.get(pk=run.pk).payload_bytes == _stored_bytes("run_b")


def test_past_the_bytes_limit_nothing_is_written_but_the_run_can_still_end(append: Any, settings: Any) -> None:
    settings.LEDGER_MAX_EVENTS_PER_RUN = 1000
    append("run_b", started())
    settings.LEDGER_MAX_BYTES_PER_RUN = _stored_bytes("run_b") + 1000
    append("run_b", ev("custom.note", text="x" * 400))
    STATES.clear()
    with pytest.raises(RunTooLarge) as refused:  # a batch that crosses it is refused whole
        append("run_b", ev("custom.note", text="y" * 100), ev("custom.note", text="z" * 600))
    assert refused.value.status == 413
    assert refused.value.details == {"index": 1, "limit": settings.LEDGER_MAX_BYTES_PER_RUN, "which": "bytes"}
    assert Event.objects.filter(run__run_id="run_b").count() == 2
    assert Run.objects.get(run_id="run_b").payload_bytes == _stored_bytes("run_b")
    append("run_b", ev("custom.note", text="y" * 100))  # under it: accepted
    append("run_b", ev("RunCompleted", output="o" * 2000))  # the ending, past it: accepted
    run = Run.objects.get(run_id="run_b")
    assert run.status == "completed" and run.payload_bytes == _stored_bytes("run_b")
    assert run.payload_bytes > settings.LEDGER_MAX_BYTES_PER_RUN


@pytest.mark.django_db(transaction=True)
def test_the_api_answers_413_for_bytes_with_the_envelope(
    workspace: Workspace, other_workspace: Workspace, settings: Any
) -> None:
    settings.LEDGER_MAX_EVENTS_PER_RUN = 1000
    settings.LEDGER_MAX_BYTES_PER_RUN = 2000
    api = http_client(headers={"Authorization": f"Bearer {create_key(workspace=workspace, scopes=['ingest'])[1]}"})
    assert api.post("/api/v1/runs/run_api/events", json={"events": [started()]}).status_code == 200
    answer = api.post("/api/v1/runs/run_api/events", json={"events": [ev("custom.note", text="x" * 3000)]})
    assert answer.status_code == 413
    error = answer.json()["error"]
    assert error["code"] == "run_too_large" and error["details"] == {"index": 0, "limit": 2000, "which": "bytes"}
    assert Event.objects.filter(run__run_id="run_api").count() == 1
    other = http_client(
        headers={"Authorization": f"Bearer {create_key(workspace=other_workspace, scopes=['ingest'])[1]}"}
    )
    assert other.post("/api/v1/runs/run_api/events", json={"events": [started()]}).status_code == 200
