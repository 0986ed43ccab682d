"""Oversized payloads move into content-addressed artifacts, re-hashed on every read."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command

from ledger import errors
from ledger.canonical import canonical_bytes, event_id
from ledger.log import artifacts
from ledger.log.artifacts import INLINE_LIMIT_BYTES
from ledger.models import Artifact, Event
from tests.conftest import ev, started

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
