"""A fork of an imported run reads the imported run's artifacts the way a fork of a run recorded
here does (artifacts.as_recorded, each artifact re-hashed): the events it copies keep the other
system's refs (`artifact://art_<16 hex>`, their ids hash them), and the fork gets the rows that
resolve them (docs/operations.md "Large payloads"). On SQLite and PostgreSQL."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command

from ledger.canonical import canonical_bytes, digest, event_id
from ledger.log import artifacts
from ledger.log.envelopes import log_of
from ledger.models import ImportedArtifact, Run, Workspace
from ledger.replay.evidence import evidence_bundle
from ledger.runtime.executor import start_run
from ledger.runtime.reexecute import execute_reexecution
from ledger.runtime.registry import CodeRun, Workflow, register
from tests.runtime_support import every_run_verifies  # noqa: F401  (an autouse fixture)

pytestmark = pytest.mark.django_db

WORKFLOW = "little_rows"
ROWS = {"rows": [f"parcel {n} left the depot" for n in range(50)]}


class Steps:
    def __init__(self) -> None:
        self.fetched = 0

    def fetch(self, run_input: Any, outputs: Any) -> Any:
        self.fetched += 1
        return ROWS

    def count(self, run_input: Any, outputs: Any) -> Any:
        return {"count": len(outputs["fetch"]["rows"])}


@pytest.fixture
def steps() -> Iterator[Steps]:
    steps = Steps()
    register(Workflow(name=WORKFLOW, steps=(CodeRun("fetch", steps.fetch), CodeRun("count", steps.count))))
    yield steps


def ledger(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger", *args, stdout=out, stderr=err)
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    except CommandError as exc:
        code, _ = exc.returncode, err.write(str(exc))
    return code, out.getvalue(), err.getvalue()


def _write_data_dir(root: Path, run_id: str, log: list[dict[str, Any]], blobs: dict[str, tuple[dict, bytes]]) -> None:
    """A Little Workflow data directory: the log as `little events` prints it, each artifact's
    manifest (its id recomputed from its identity) and bytes."""
    (root / "events").mkdir(parents=True)
    (root / "artifacts" / "blobs").mkdir(parents=True)
    (root / "events" / f"{run_id}.jsonl").write_text("".join(json.dumps(env) + "\n" for env in log))
    for aid, (identity, data) in blobs.items():
        manifest = {**identity, "artifactId": aid, "artifactRef": artifacts.REF_PREFIX + aid}
        manifest.update(sha256=f"sha256:{hashlib.sha256(data).hexdigest()}", sizeBytes=len(data))
        (root / "artifacts" / f"{aid}.json").write_text(json.dumps(manifest))
        (root / "artifacts" / "blobs" / f"{aid}.bin").write_bytes(data)


def _little_id(identity: dict[str, str], data: bytes) -> str:
    payload_hash = "sha256:" + hashlib.sha256(data).hexdigest()
    return "art_" + digest({**identity, "payloadHash": payload_hash})[7:23]


def _little_log(workspace: Workspace, run_id: str) -> tuple[list[dict[str, Any]], dict[str, tuple[dict, bytes]]]:
    """The log of a run of WORKFLOW recorded here, as Little Workflow writes it: fetch's output
    moved out into an artifact its StepCompleted names by Little's ref, no inline copy."""
    start_run(workspace=workspace, workflow=WORKFLOW, input={}, run_id="run_source")
    data = canonical_bytes(ROWS)
    identity = {
        "runId": run_id,
        "stepPath": "fetch",
        "name": "output",
        "contentType": "application/json",
        "encoding": "json",
    }
    aid = _little_id(identity, data)
    log = []
    for env in log_of(Run.objects.get(workspace=workspace, run_id="run_source")):
        payload = dict(env["payload"])
        if env["type"] == "StepCompleted" and payload["stepPath"] == "fetch":
            del payload["output"]
            payload["outputRef"] = artifacts.REF_PREFIX + aid
        sequence = env["sequence"]
        log.append(
            {
                "eventId": event_id(run_id=run_id, sequence=sequence, type=env["type"], payload=payload),
                "runId": run_id,
                "sequence": sequence,
                "type": env["type"],
                "recordedAt": env["recordedAt"],
                "payload": payload,
            }
        )
    return log, {aid: (identity, data)}


def _bundle_as_data_dir(bundle: Path, root: Path) -> None:
    """An evidence bundle (`ledger export-evidence`) of an imported run laid out as the data
    directory it came from: its log, and each artifact under the identity the manifest keeps."""
    with zipfile.ZipFile(bundle) as archive:
        manifest = json.loads(archive.read("manifest.json"))
        log = [json.loads(line) for line in archive.read("events.jsonl").splitlines()]
        blobs = {
            a["ref"][len(artifacts.REF_PREFIX) :]: (a["identity"], archive.read(f"artifacts/art_{a['sha256']}"))
            for a in manifest["artifacts"]
        }
    _write_data_dir(root, manifest["runId"], log, blobs)


def _fork(workspace: Workspace, original: str, new: str) -> Any:
    return execute_reexecution(
        workspace=workspace,
        original_run_id=original,
        mode="fork",
        from_step="count",
        new_run_id=new,
        reexecution_id=f"rx_{new}",
    )


def test_a_fork_of_a_run_imported_from_an_evidence_bundle_reads_its_artifacts(
    workspace: Workspace, other_workspace: Workspace, steps: Steps, tmp_path: Path
) -> None:
    log, blobs = _little_log(workspace, "run_little")
    _write_data_dir(tmp_path / "little", "run_little", log, blobs)
    assert ledger("import-little", str(tmp_path / "little"), "--workspace", "acme/support")[0] == 0
    bundle = tmp_path / "run_little.evidence.zip"
    assert ledger("export-evidence", "run_little", "--workspace", "acme/support", "--output", str(bundle))[0] == 0
    _bundle_as_data_dir(bundle, tmp_path / "from_bundle")
    code, _, err = ledger("import-little", str(tmp_path / "from_bundle"), "--workspace", "globex/main")
    assert code == 0, err
    [ref] = [artifacts.REF_PREFIX + aid for aid in blobs]

    outcome = _fork(other_workspace, "run_little", "run_fork")

    assert (outcome.status, outcome.output) == ("completed", {"count": 50})
    assert steps.fetched == 1  # the source's only: fetch was copied into the fork, not run again
    fork = Run.objects.get(workspace=other_workspace, run_id="run_fork")
    copied = next(e["payload"] for e in log_of(fork) if e["type"] == "StepCompleted")
    assert copied["outputRef"] == ref and "output" not in copied  # the copy keeps Little's ref
    assert artifacts.as_recorded(fork, "StepCompleted", copied)["output"] == ROWS
    evidence = evidence_bundle(fork)
    assert evidence["integrity"]["ok"] and evidence["replayReady"]["status"] == "pass"
    assert [a["verified"] for a in evidence["artifacts"] if a["ref"] == ref] == [True]

    # Replayed: a fork of the fork reads the output through the fork's own rows.
    again = _fork(other_workspace, "run_fork", "run_fork_again")
    assert (again.status, again.output, steps.fetched) == ("completed", {"count": 50}, 1)

    # The fork's own bundle ties Little's ref to its bytes offline: the id hashes the imported run's id.
    fork_bundle = tmp_path / "run_fork.evidence.zip"
    assert ledger("export-evidence", "run_fork", "--workspace", "globex/main", "--output", str(fork_bundle))[0] == 0
    code, out, _ = ledger("verify", "--bundle", str(fork_bundle))
    assert code == 0 and "1 artifact(s) re-hashed" in out, out


def test_a_fork_resumed_after_it_copied_the_events_still_gets_the_rows(
    workspace: Workspace, steps: Steps, tmp_path: Path
) -> None:
    log, blobs = _little_log(workspace, "run_little")
    _write_data_dir(tmp_path / "little", "run_little", log, blobs)
    assert ledger("import-little", str(tmp_path / "little"), "--workspace", "acme/support")[0] == 0
    _fork(workspace, "run_little", "run_fork")
    fork = Run.objects.get(workspace=workspace, run_id="run_fork")
    # The executor died between the copy and the rows: calling again finishes the fork's rows.
    ImportedArtifact.objects.filter(run=fork).delete()

    outcome = _fork(workspace, "run_little", "run_fork")

    assert outcome.output == {"count": 50}
    assert list(ImportedArtifact.objects.filter(run=fork).values_list("ref", "written_in_run")) == [
        (artifacts.REF_PREFIX + aid, "run_little") for aid in blobs
    ]
