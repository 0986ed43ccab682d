"""Oversized payloads move into content-addressed artifacts, re-hashed on every read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.conf import settings
from django.core.management import call_command

from ledger import errors
from ledger.canonical import canonical_bytes, event_id
from ledger.log import artifacts
from ledger.log.artifacts import INLINE_LIMIT_BYTES
from ledger.models import Artifact, Event
from ledger.tenancy.services import create_key
from tests.conftest import ev, http_client, ledger_cli, started

pytestmark = pytest.mark.django_db

BIG_OUTPUT = {"rows": ["x" * 1000] * 300}  # ~300 KB of canonical JSON


def test_oversized_step_output_round_trips_through_its_artifact(workspace, append) -> None:
    append("run_a", started())
    env = append("run_a", ev("StepCompleted", stepPath="extract", attempt=1, output=BIG_OUTPUT)).events[0]
    payload = env["payload"]
    assert "output" not in payload
    ref = payload["outputRef"]
    assert ref == "artifact://art_" + hashlib.sha256(canonical_bytes(BIG_OUTPUT)).hexdigest()
    # The eventId is computed over the payload as stored.
    assert env["eventId"] == event_id(run_id="run_a", sequence=2, type="StepCompleted", payload=payload)
    raw = Event.objects.get(run__run_id="run_a", sequence=2).payload
    assert len(raw) < 1000
    artifact = artifacts.get_by_ref(workspace, ref)
    assert json.loads(artifacts.read_bytes(artifact)) == BIG_OUTPUT
    assert artifact.size == len(canonical_bytes(BIG_OUTPUT))


def test_payload_just_under_the_limit_stays_inline(append) -> None:
    append("run_a", started())
    filler = "y" * (INLINE_LIMIT_BYTES - 200)
    payload = append("run_a", ev("custom.blob", data=filler)).events[0]["payload"]
    assert payload == {"data": filler}
    assert not Artifact.objects.exists()


def test_retry_of_an_oversized_event_still_matches_its_key(append) -> None:
    append("run_a", started())
    item = {**ev("StepCompleted", stepPath="extract", attempt=1, output=BIG_OUTPUT), "idempotencyKey": "k"}
    first = append("run_a", item).events[0]
    again = append("run_a", item).events[0]
    assert again["replayed"] and again["eventId"] == first["eventId"]
    assert Artifact.objects.count() == 1


def test_tampered_artifact_file_is_detected(workspace, append) -> None:
    append("run_a", started())
    ref = append("run_a", ev("StepCompleted", stepPath="s", attempt=1, output=BIG_OUTPUT)).events[0]["payload"][
        "outputRef"
    ]
    artifact = artifacts.get_by_ref(workspace, ref)
    path = Path(settings.ARTIFACTS_ROOT) / artifact.storage_key
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    with pytest.raises(errors.IntegrityFailure):
        artifacts.read_bytes(artifact)
    assert artifacts.check(artifact) == "mismatch"
    with pytest.raises(SystemExit) as exit_info:
        call_command("ledger", "verify", "run_a")
    assert exit_info.value.code == 1


def test_missing_artifact_file_is_detected(workspace, append) -> None:
    append("run_a", started())
    ref = append("run_a", ev("RunCompleted", output=BIG_OUTPUT)).events[0]["payload"]["outputRef"]
    artifact = artifacts.get_by_ref(workspace, ref)
    (Path(settings.ARTIFACTS_ROOT) / artifact.storage_key).unlink()
    assert artifacts.check(artifact) == "missing"


def test_artifacts_belong_to_their_workspace(workspace, other_workspace, append) -> None:
    append("run_a", started())
    ref = append("run_a", ev("RunCompleted", output=BIG_OUTPUT)).events[0]["payload"]["outputRef"]
    with pytest.raises(errors.NotFound):
        artifacts.get_by_ref(other_workspace, ref)


def _answer(run_id: str, text: str, api: httpx.Client) -> tuple[dict[str, Any], dict[str, Any]]:
    """A run of one model call answering `text`, through the API: (the run, its evidence)."""
    answered = ev(
        "harness.model.responded",
        turn=1,
        callId="c1",
        stepPath="s",
        model={"provider": "openai", "modelId": "gpt-4o"},
        response={
            "text": text,
            "finishReason": "stop",
            "toolCalls": [{"callId": "t1", "toolName": "lookup", "args": {}}],
            "usage": {"inputTokens": 1000, "outputTokens": 100_000},
        },
    )
    response = api.post(f"/api/v1/runs/{run_id}/events", json={"events": [started(), answered]})
    assert response.status_code == 200, response.text[:300]
    return api.get(f"/api/v1/runs/{run_id}").json(), api.get(f"/api/v1/runs/{run_id}/evidence").json()


@pytest.mark.django_db(transaction=True)
def test_a_model_answer_past_the_limit_keeps_its_usage_and_costs_what_a_short_one_does(workspace) -> None:
    """Once the whole `response` moved to an artifact, usage included: the call counted 0 tokens, $0."""
    secret = create_key(workspace=workspace, scopes=["ingest", "read"])[1]
    with http_client(headers={"Authorization": f"Bearer {secret}"}) as api:
        short_run, short = _answer("run_short", "x" * 200_000, api)
        long_run, long = _answer("run_long", "x" * 300_000, api)
    assert long_run["usage"] == short_run["usage"]
    assert long_run["usage"] == {
        "inputTokens": 1000,
        "outputTokens": 100_000,
        "cachedInputTokens": 0,
        "reasoningTokens": 0,
        "costUsd": 1.0025,  # gpt-4o: 1,000 in at $2.50 and 100,000 out at $10 per million
        "pricedCalls": 1,
        "unpricedCalls": 0,
    }
    assert [(c["inputTokens"], c["outputTokens"], c["costUsd"]) for c in long["costs"]] == [(1000, 100_000, 1.0025)]
    assert long["integrity"]["ok"]
    # Only the text moved: what the fold reads stays in the event.
    stored = Event.objects.get(run__run_id="run_long", sequence=2).payload
    response = json.loads(stored)["response"]
    assert set(response) == {"textRef", "finishReason", "toolCalls", "usage"}
    assert json.loads(artifacts.read_bytes(artifacts.get_by_ref(workspace, response["textRef"]))) == "x" * 300_000
    assert [ref["ref"] for ref in long["artifacts"]] == [response["textRef"]]
    assert ledger_cli("verify", "run_long")[0] == 0


def test_a_growing_runs_plan_reads_only_the_new_events_for_their_artifacts(workspace, append) -> None:
    """The replay plan re-hashes every artifact the log refers to; a live run's page asks for it at
    each new state, and each time reads only the events after the last it looked at."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from ledger.models import Run
    from ledger.replay.runlog import snapshot
    from ledger.replay.stored_plan import replay_plan_at

    def plan_checks(run: Run) -> tuple[str, list[str]]:
        with CaptureQueriesContext(connection) as seen:
            plan = replay_plan_at(run, snapshot(run).state)
        scans = [q["sql"] for q in seen.captured_queries if "artifact://" in q["sql"] and "ledger_event" in q["sql"]]
        check = next(c for c in plan["integrity"]["checks"] if c["name"] == "artifact_hashes")
        return check["detail"], scans

    append("run_a", started())
    append("run_a", ev("StepCompleted", stepPath="extract", attempt=1, output=BIG_OUTPUT))
    run = Run.objects.get(run_id="run_a")
    detail, scans = plan_checks(run)
    assert detail == "1 artifact(s) ok" and len(scans) == 1 and '"sequence" > 0' in scans[0]
    append("run_a", ev("StepCompleted", stepPath="load", attempt=1, output={"rows": ["y" * 1000] * 300}))
    run.refresh_from_db()
    detail, scans = plan_checks(run)
    assert detail == "2 artifact(s) ok" and len(scans) == 1 and '"sequence" > 2' in scans[0]
