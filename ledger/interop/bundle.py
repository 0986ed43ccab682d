"""The evidence bundle as a file for incident review (docs/api.md: `GET /api/v1/runs/{runId}/evidence.zip`,
`ledger export-evidence RUN`): one zip that a reviewer can check offline with `ledger verify
--bundle FILE` (ledger/interop/offline.py), without access to the ledger.

Entries, in this (sorted) order:

- `SHA256SUMS`: `<sha256>  <path>` for every other entry, as `sha256sum -c` reads it;
- `artifacts/art_<sha256>`: the bytes of every artifact the log references, re-hashed on the way in;
- `events.jsonl`: the run's envelopes in sequence order, each payload as stored (RFC 8785 text),
  so every event id recomputes;
- `evidence.json`: the evidence JSON of `GET …/evidence`;
- `manifest.json`: what the bundle holds (run, last sequence, files with their sha256 and size,
  artifacts, and whether the ledger's own checks passed when it was made).

Deterministic: the same run gives the same bytes. Entries carry a fixed timestamp (1980-01-01,
the zip format's first day), fixed permissions and the same deflate level, in sorted order, and
nothing in them says when the bundle was made; a run still being written gives a new bundle with
each new event.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Iterable
from tempfile import SpooledTemporaryFile
from typing import IO, Any

import orjson
from django.db import transaction

from .. import audit
from ..canonical import ecma_dumps
from ..log import artifacts as artifact_store
from ..log.envelopes import log_rows
from ..models import Artifact, ImportedArtifact, Run
from ..replay.evidence import evidence_bundle

SCHEMA_VERSION = 1
BUNDLE = "runledger.evidence"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)
SUMS = "SHA256SUMS"
MANIFEST = "manifest.json"
EVENTS = "events.jsonl"
EVIDENCE = "evidence.json"
ARTIFACTS_DIR = "artifacts/"


def _dumps(value: Any) -> bytes:
    return ecma_dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def _events_jsonl(run: Run) -> tuple[bytes, int]:
    lines = []
    for sequence, event_id, type_, occurrence_id, recorded_at, text in log_rows(run):
        head: dict[str, Any] = {"eventId": event_id, "runId": run.run_id, "sequence": sequence, "type": type_}
        if occurrence_id is not None:
            head["occurrenceId"] = occurrence_id
        head["recordedAt"] = recorded_at
        lines.append(orjson.dumps(head)[:-1] + b',"payload":' + text.encode() + b"}\n")
    return b"".join(lines), len(lines)


def _entry(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=FIXED_TIME)
    info.compress_type = zipfile.ZIP_DEFLATED
    info.create_system = 3  # unix, whatever the platform: the attributes below mean the same everywhere
    info.external_attr = 0o644 << 16
    return info


def _artifact_bytes(run: Run, listed: Iterable[dict[str, Any]]) -> dict[str, bytes]:
    """`artifacts/art_<sha>` -> bytes, for each listed artifact whose bytes still match their hash."""
    wanted = [a["sha256"] for a in listed if a.get("verified")]
    files = {}
    for row in Artifact.objects.filter(workspace_id=run.workspace_id, sha256__in=wanted).order_by("sha256"):
        files[f"{ARTIFACTS_DIR}{row.artifact_id}"] = artifact_store.read_bytes(row)
    return files


def _imported_identities(run: Run) -> dict[str, dict[str, str]]:
    """ref -> the identity an imported log's artifact id hashes (Little Workflow's artifactId:
    `art_` + 16 hex of the digest of {runId, stepPath?, name, contentType, encoding, payloadHash}),
    so that `verify --bundle` can tie the ref to the bytes the bundle holds: a ref of ours names
    its sha256, an imported one only through this."""
    identities = {}
    for row in ImportedArtifact.objects.filter(run=run).select_related("artifact").order_by("ref"):
        identity = {
            "runId": row.written_in_run or run.run_id,
            "name": row.name,
            "contentType": row.artifact.content_type,
        }
        if row.step_path:
            identity["stepPath"] = row.step_path
        identity["encoding"] = row.encoding
        identities[row.ref] = identity
    return identities


def write_bundle(run: Run, out: IO[bytes]) -> None:
    """Write the run's bundle to `out`. `run` must come with `workspace__tenant` selected."""
    evidence = evidence_bundle(run)
    identities = _imported_identities(run)
    events, count = _events_jsonl(run)
    files: dict[str, bytes] = {
        EVENTS: events,
        EVIDENCE: _dumps(evidence),
        **_artifact_bytes(run, evidence["artifacts"]),
    }
    manifest = {
        "schemaVersion": SCHEMA_VERSION,
        "bundle": BUNDLE,
        "workspace": f"{run.workspace.tenant.slug}/{run.workspace.slug}",
        "runId": run.run_id,
        "status": evidence["run"]["status"],
        "lastSequence": count,
        "files": [
            {"path": name, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
            for name, data in sorted(files.items())
        ],
        "artifacts": [
            {
                "ref": a["ref"],
                "sha256": a["sha256"],
                "size": a["size"],
                "contentType": a["contentType"],
                "included": a["verified"],
                **({"identity": identities[a["ref"]]} if a["ref"] in identities else {}),
            }
            for a in evidence["artifacts"]
        ],
        "ledgerIntegrity": evidence["integrity"]["ok"],
    }
    files[MANIFEST] = _dumps(manifest)
    files[SUMS] = "".join(
        f"{hashlib.sha256(data).hexdigest()}  {name}\n" for name, data in sorted(files.items())
    ).encode()
    with zipfile.ZipFile(out, "w") as archive:
        for name in sorted(files):
            archive.writestr(_entry(name), files[name], compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)


def bundle_file(run: Run) -> SpooledTemporaryFile[bytes]:
    """The bundle in a temporary file (in memory up to 32 MiB), rewound."""
    spooled: SpooledTemporaryFile[bytes] = SpooledTemporaryFile(max_size=32 << 20)
    write_bundle(run, spooled)
    spooled.seek(0)
    return spooled


def bundle_name(run: Run) -> str:
    return f"{run.run_id}.evidence.zip"


@transaction.atomic
def record_bundle(*, run: Run, by: Any, sha256: str) -> None:
    """`evidence_bundle.downloaded`, naming the bytes handed out by their sha256."""
    audit.record(
        actor=by,
        tenant=run.workspace.tenant,
        workspace=run.workspace,
        action=audit.Action.EVIDENCE_BUNDLE_DOWNLOADED,
        target=run.run_id,
        details={"runId": run.run_id, "sha256": sha256},
    )


def file_sha256(handle: IO[bytes]) -> str:
    """The sha256 of a rewound file, rewound again after."""
    hasher = hashlib.sha256()
    while chunk := handle.read(1 << 20):
        hasher.update(chunk)
    handle.seek(0)
    return hasher.hexdigest()
