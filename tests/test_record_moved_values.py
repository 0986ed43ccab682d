"""A run-level value the log moved into an artifact (a step's `outputRef`, the run's `outputRef`)
is read back the way a replay reads a moved member (artifacts.read_ref): ours by sha256 in the
run's workspace, an imported log's `art_<16 hex>` ref through its ImportedArtifact row, each
artifact re-hashed. One the log names that is gone or changed stops the reader with an integrity
failure naming it (docs/operations.md "Large payloads"), never a null and never a 404."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings

from ledger import errors
from ledger.canonical import canonical_bytes
from ledger.evaluation import datasets
from ledger.log import append, artifacts
from ledger.models import Artifact, ImportedArtifact, Run, Workspace
from ledger.runtime.executor import resume_run, start_run
from ledger.runtime.reexecute import execute_reexecution
from ledger.runtime.registry import CodeRun, Workflow, register
from tests.conftest import ev, started
from tests.runtime_support import (  # noqa: F401  (every_run_verifies is an autouse fixture)
    Crash,
    every_run_verifies,
    run_events,
)

pytestmark = pytest.mark.django_db

WORKFLOW = "long_step_output"
ROWS = {"rows": [f"parcel {n} left the depot" for n in range(20_000)]}  # past the inline limit


class Steps:
    """`fetch` answers with ROWS; `count` dies once when armed, else counts what fetch gave it."""

    def __init__(self) -> None:
        self.armed = False
        self.fetched = 0

    def fetch(self, run_input: Any, outputs: Any) -> Any:
        self.fetched += 1
        return ROWS

    def count(self, run_input: Any, outputs: Any) -> Any:
        if self.armed:
            self.armed = False
            raise Crash("the executor died after fetch")
        return {"count": len(outputs["fetch"]["rows"])}


@pytest.fixture
def steps() -> Iterator[Steps]:
    steps = Steps()
    register(Workflow(name=WORKFLOW, steps=(CodeRun("fetch", steps.fetch), CodeRun("count", steps.count))))
    yield steps


def _crashed_after_fetch(workspace: Workspace, steps: Steps, run_id: str) -> str:
    steps.armed = True
    with pytest.raises(Crash):
        start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id=run_id)
    done = next(e["payload"] for e in run_events(workspace, run_id) if e["type"] == "StepCompleted")
    assert "output" not in done and done["outputRef"].startswith("artifact://art_")  # what makes the case
    return str(done["outputRef"])


def test_a_resume_reads_a_long_step_output_back(workspace: Workspace, steps: Steps) -> None:
    _crashed_after_fetch(workspace, steps, "run_long")

    outcome = resume_run(workspace=workspace, run_id="run_long")

    assert (outcome.status, outcome.output) == ("completed", {"count": 20_000})
    assert steps.fetched == 1  # fetch was reused from the record, not run again


def _artifact(workspace: Workspace, ref: str) -> Artifact:
    return Artifact.objects.get(workspace=workspace, sha256=artifacts.parse_ref(ref))


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_resume_stops_on_a_step_output_artifact_missing_or_changed(
    workspace: Workspace, steps: Steps, damage: str
) -> None:
    ref = _crashed_after_fetch(workspace, steps, f"run_{damage}")
    artifact = _artifact(workspace, ref)
    path = Path(settings.ARTIFACTS_ROOT) / artifact.storage_key
    if damage == "missing":
        artifact.delete()  # the log names it; the workspace no longer holds it
    else:
        path.write_bytes(canonical_bytes({"rows": []}))
    before = Run.objects.get(workspace=workspace, run_id=f"run_{damage}").last_sequence

    with pytest.raises(errors.IntegrityFailure) as failure:
        resume_run(workspace=workspace, run_id=f"run_{damage}")

    assert not isinstance(failure.value, errors.NotFound)
    assert artifacts.parse_ref(ref) in failure.value.message
    assert ("is not stored" if damage == "missing" else "does not match its sha256") in failure.value.message
    assert Run.objects.get(workspace=workspace, run_id=f"run_{damage}").last_sequence == before  # nothing written
    assert steps.fetched == 1
    # Put it back: the run verifies again (every_run_verifies), and the resume then completes.
    artifacts.store_bytes(workspace, canonical_bytes(ROWS))
    assert resume_run(workspace=workspace, run_id=f"run_{damage}").output == {"count": 20_000}


def test_a_finished_runs_output_artifact_missing_is_an_integrity_failure(workspace: Workspace, admin: Any) -> None:
    append(workspace=workspace, run_id="run_done", events=[started(), ev("RunCompleted", output=ROWS)])
    run = Run.objects.get(workspace=workspace, run_id="run_done")
    _artifact(workspace, run.output_ref).delete()

    with pytest.raises(errors.IntegrityFailure) as failure:
        datasets.add_runs(workspace=workspace, name="long", run_ids=["run_done"], by=admin)

    assert not isinstance(failure.value, errors.NotFound) and "run_done" in failure.value.message
    artifacts.store_bytes(workspace, canonical_bytes(ROWS))


def test_an_imported_logs_output_ref_is_read_back_through_its_imported_artifact(
    workspace: Workspace, admin: Any
) -> None:
    # An imported log keeps the other system's ref (`art_` + 16 hex); its ImportedArtifact row,
    # written by the import, names the artifact holding the bytes.
    data = canonical_bytes(ROWS)
    foreign = f"{artifacts.REF_PREFIX}art_{hashlib.sha256(b'little').hexdigest()[:16]}"
    append(workspace=workspace, run_id="run_imported", events=[started(), ev("RunCompleted", outputRef=foreign)])
    run = Run.objects.get(workspace=workspace, run_id="run_imported")
    assert run.output_ref == foreign and run.output is None
    ImportedArtifact.objects.create(
        run=run, ref=foreign, artifact=artifacts.store_bytes(workspace, data), name="output", encoding="json"
    )

    version = datasets.add_runs(workspace=workspace, name="imported", run_ids=["run_imported"], by=admin).version

    assert version.members[0]["expected"] == ROWS


def test_a_fork_reads_the_copied_step_output_back_from_the_workspaces_artifact(
    workspace: Workspace, steps: Steps
) -> None:
    # A fork copies the events before its step as stored: fetch's StepCompleted keeps its
    # outputRef, which names an artifact of the workspace, so the new run reads it like the original.
    start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id="run_original")
    ref = next(e["payload"]["outputRef"] for e in run_events(workspace, "run_original") if e["type"] == "StepCompleted")

    outcome = execute_reexecution(
        workspace=workspace,
        original_run_id="run_original",
        mode="fork",
        from_step="count",
        new_run_id="run_fork",
        reexecution_id="rx_fork",
    )

    assert (outcome.status, outcome.output) == ("completed", {"count": 20_000})
    assert steps.fetched == 1  # fetch was copied, not run again
    copied = next(e["payload"] for e in run_events(workspace, "run_fork") if e["type"] == "StepCompleted")
    assert copied["outputRef"] == ref and "output" not in copied
    fork = Run.objects.get(workspace=workspace, run_id="run_fork")
    assert artifacts.read_ref(fork, ref) == ROWS
