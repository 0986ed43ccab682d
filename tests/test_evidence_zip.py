"""The evidence bundle as a zip (`GET /api/v1/runs/{runId}/evidence.zip`, `ledger export-evidence`):
the same bytes for the same run, everything a reviewer needs inside, and `ledger verify --bundle`
catching whatever was changed in it, offline."""

from __future__ import annotations

import hashlib
import io
import json
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from django.core.management import CommandError, call_command

from ledger.demo.data import _summarize_run
from ledger.log import append
from ledger.models import AuditEntry, Workspace
from ledger.tenancy.services import create_key
from tests.conftest import IN_PROCESS, http_client, log_in, started

pytestmark = pytest.mark.django_db(transaction=True)

V1 = "/api/v1"
ENTRIES = ["SHA256SUMS", "events.jsonl", "evidence.json", "manifest.json"]


@pytest.fixture
def key_client() -> Iterator[Callable[..., httpx.Client]]:
    clients: list[httpx.Client] = []

    def make(workspace: Workspace, scopes: str = "read") -> httpx.Client:
        _, key = create_key(workspace=workspace, scopes=scopes.split(","))
        client = http_client(headers={"Authorization": f"Bearer {key}"}, timeout=60)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def api(workspace: Workspace, key_client: Callable[..., httpx.Client]) -> httpx.Client:
    return key_client(workspace)


@pytest.fixture
def rich_run(workspace: Workspace) -> str:
    """A finished run with priced model calls, a tool call and an output large enough to be an artifact."""
    events = _summarize_run(("openai", "gpt-4o-mini"), finish=True)
    big = {"type": "StepCompleted", "payload": {"stepPath": "attach", "attempt": 1, "output": {"blob": "x" * 300_000}}}
    events[-1:-1] = [
        {"type": "StepScheduled", "payload": {"stepPath": "attach"}},
        {"type": "StepAttemptStarted", "payload": {"stepPath": "attach", "attempt": 1}},
        big,
    ]
    append(workspace=workspace, run_id="run_rich", events=events)
    return "run_rich"


def verify_bundle(path: Path) -> tuple[int, str]:
    out = io.StringIO()
    try:
        call_command("ledger", "verify", "--bundle", str(path), stdout=out, stderr=io.StringIO())
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    return code, out.getvalue()


def failed(out: str) -> set[str]:
    return {line.split()[2].rstrip(":") for line in out.splitlines() if line.startswith("FAIL")}


def rezip(original: bytes, changes: dict[str, bytes | None]) -> bytes:
    """The bundle with entries replaced (None: removed), everything else as it was."""
    out = io.BytesIO()
    with zipfile.ZipFile(io.BytesIO(original)) as source, zipfile.ZipFile(out, "w") as target:
        for info in source.infolist():
            data = changes.get(info.filename, source.read(info.filename))
            if data is not None:
                target.writestr(info, data)
    return out.getvalue()


def sums_for(files: dict[str, bytes]) -> bytes:
    return "".join(
        f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in sorted(files.items()) if n != "SHA256SUMS"
    ).encode()


def test_two_downloads_are_byte_equal_and_hold_everything(workspace, api, rich_run, tmp_path) -> None:
    first = api.get(f"{V1}/runs/{rich_run}/evidence.zip")
    second = api.get(f"{V1}/runs/{rich_run}/evidence.zip")
    assert first.status_code == second.status_code == 200, first.text
    assert first.headers["content-type"] == "application/zip"
    assert first.headers["content-disposition"] == 'attachment; filename="run_rich.evidence.zip"'
    assert first.content == second.content
    assert first.headers["etag"] == f'"{hashlib.sha256(first.content).hexdigest()}"'

    archive = zipfile.ZipFile(io.BytesIO(first.content))
    names = archive.namelist()
    assert names == sorted(names)
    artifacts = [n for n in names if n.startswith("artifacts/")]
    assert len(artifacts) == 1 and sorted(set(names) - set(artifacts)) == ENTRIES
    assert {i.date_time for i in archive.infolist()} == {(1980, 1, 1, 0, 0, 0)}
    assert {i.compress_type for i in archive.infolist()} == {zipfile.ZIP_DEFLATED}

    manifest = json.loads(archive.read("manifest.json"))
    served = api.get(f"{V1}/runs/{rich_run}/events?limit=500").json()
    assert manifest["runId"] == rich_run and manifest["workspace"] == "acme/support"
    assert manifest["lastSequence"] == served["lastSequence"] and manifest["ledgerIntegrity"] is True
    assert [json.loads(line) for line in archive.read("events.jsonl").splitlines()] == served["events"]
    assert json.loads(archive.read("evidence.json")) == api.get(f"{V1}/runs/{rich_run}/evidence").json()
    artifact_bytes = archive.read(artifacts[0])
    assert artifacts[0] == f"artifacts/art_{hashlib.sha256(artifact_bytes).hexdigest()}"
    assert manifest["artifacts"][0]["included"] is True
    sums = archive.read("SHA256SUMS").decode().splitlines()
    assert sums == [f"{hashlib.sha256(archive.read(n)).hexdigest()}  {n}" for n in names if n != "SHA256SUMS"]

    path = tmp_path / "bundle.zip"
    path.write_bytes(first.content)
    code, out = verify_bundle(path)
    assert code == 0, out
    assert "ok" in out.splitlines()[-1]


def test_the_command_line_writes_the_same_bytes(workspace, api, rich_run, tmp_path) -> None:
    target = tmp_path / "cli.zip"
    err = io.StringIO()
    call_command("ledger", "export-evidence", rich_run, "--output", str(target), stdout=io.StringIO(), stderr=err)
    assert target.read_bytes() == api.get(f"{V1}/runs/{rich_run}/evidence.zip").content
    assert hashlib.sha256(target.read_bytes()).hexdigest() in err.getvalue()


def test_the_command_line_refuses_a_path_it_cannot_write_and_records_no_download(workspace, rich_run, tmp_path) -> None:
    before = AuditEntry.objects.count()
    for path in (tmp_path / "missing" / "run.zip", tmp_path):  # no such folder; a folder
        with pytest.raises(CommandError, match=f"cannot write {path}"):
            call_command("ledger", "export-evidence", rich_run, "--output", str(path), stdout=io.StringIO())
    assert AuditEntry.objects.count() == before


def test_verify_bundle_catches_tampering(workspace, api, rich_run, tmp_path) -> None:
    original = api.get(f"{V1}/runs/{rich_run}/evidence.zip").content
    archive = zipfile.ZipFile(io.BytesIO(original))
    files = {n: archive.read(n) for n in archive.namelist()}
    artifact = next(n for n in files if n.startswith("artifacts/"))

    def check(data: bytes, name: str) -> set[str]:
        path = tmp_path / name
        path.write_bytes(data)
        code, out = verify_bundle(path)
        assert code == 1, out
        return failed(out)

    # A payload edited: the sums say so, and so does the id, even with the sums rewritten.
    edited = files["events.jsonl"].replace(b"ticket 4711", b"ticket 4712")
    assert check(rezip(original, {"events.jsonl": edited}), "edited.zip") == {"sha256sums", "manifest", "event_ids"}
    covered = {**files, "events.jsonl": edited}
    assert "event_ids" in check(
        rezip(original, {"events.jsonl": edited, "SHA256SUMS": sums_for(covered)}), "covered.zip"
    )

    # An event removed, sums and manifest rewritten to match: the gap is still there.
    lines = files["events.jsonl"].splitlines(keepends=True)
    gap = b"".join(lines[:3] + lines[4:])
    manifest = json.loads(files["manifest.json"])
    manifest["lastSequence"] -= 1
    for entry in manifest["files"]:
        if entry["path"] == "events.jsonl":
            entry.update(sha256=hashlib.sha256(gap).hexdigest(), size=len(gap))
    new_manifest = json.dumps(manifest).encode()
    redone = {**files, "events.jsonl": gap, "manifest.json": new_manifest}
    assert check(
        rezip(original, {"events.jsonl": gap, "manifest.json": new_manifest, "SHA256SUMS": sums_for(redone)}), "gap.zip"
    ) == {"dense_sequence"}

    # Artifact bytes swapped (sums rewritten): the artifact no longer hashes to its name.
    swapped = {**files, artifact: b"other bytes"}
    assert "artifact_hashes" in check(
        rezip(original, {artifact: b"other bytes", "SHA256SUMS": sums_for(swapped)}), "swapped.zip"
    )
    # An artifact left out.
    assert {"sha256sums", "manifest", "artifact_hashes"} <= check(rezip(original, {artifact: None}), "dropped.zip")
    # Not a zip at all.
    assert check(b"PK not really", "garbage.zip") == {"zip"}


def test_bundles_are_audited_with_their_sha256(workspace, api, rich_run, admin) -> None:
    body = api.get(f"{V1}/runs/{rich_run}/evidence.zip").content
    alice = log_in(IN_PROCESS, admin)
    assert alice.get(f"{V1}/runs/{rich_run}/evidence.zip").content == body
    entries = AuditEntry.objects.filter(action="evidence_bundle.downloaded").order_by("pk")
    assert [(e.actor.split(":")[0], e.target, e.details["sha256"]) for e in entries] == [
        ("key", rich_run, hashlib.sha256(body).hexdigest()),
        ("alice", rich_run, hashlib.sha256(body).hexdigest()),
    ]
    assert all(e.workspace == workspace for e in entries)
    alice.close()


def test_isolation_and_roles(workspace, other_workspace, key_client, rich_run, viewer, outsider) -> None:
    append(workspace=other_workspace, run_id="run_theirs", events=[started()])
    outsider_key = key_client(other_workspace)
    response = outsider_key.get(f"{V1}/runs/{rich_run}/evidence.zip")
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert outsider_key.get(f"{V1}/runs/run_theirs/evidence.zip").status_code == 200
    olga = log_in(IN_PROCESS, outsider)
    assert olga.get(f"{V1}/runs/{rich_run}/evidence.zip?workspace=acme/support").status_code == 404
    assert olga.get(f"{V1}/runs/{rich_run}/evidence.zip").status_code == 404
    dave = log_in(IN_PROCESS, viewer)
    assert dave.get(f"{V1}/runs/{rich_run}/evidence.zip").status_code == 200
    no_read = key_client(workspace, "ingest").get(f"{V1}/runs/{rich_run}/evidence.zip")
    assert no_read.status_code == 403 and no_read.json()["error"]["code"] == "insufficient_scope"
    anonymous = http_client()
    assert anonymous.get(f"{V1}/runs/{rich_run}/evidence.zip").status_code == 401
    bad = key_client(workspace).get(f"{V1}/runs/run%20bad!/evidence.zip")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_run_id"
    assert not AuditEntry.objects.filter(
        action="evidence_bundle.downloaded", target=rich_run, tenant__slug="globex"
    ).exists()
    for client in (olga, dave, anonymous):
        client.close()
